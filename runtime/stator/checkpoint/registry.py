"""Reference counts of shared checkpoint files: a file is deleted only when no retained
checkpoint needs it. Pure bookkeeping; the coordinator does the I/O."""

from __future__ import annotations

from collections.abc import Iterable


class SharedStateRegistry:
    def __init__(self) -> None:
        self._refs: dict[str, set[int]] = {}

    @classmethod
    def rebuild(cls, retained: dict[int, Iterable[str]]) -> SharedStateRegistry:
        """The registry after a restart: every retained checkpoint re-registers its files."""
        registry = cls()
        for checkpoint_id, keys in retained.items():
            registry.register(checkpoint_id, keys)
        return registry

    def register(self, checkpoint_id: int, keys: Iterable[str]) -> None:
        for key in keys:
            self._refs.setdefault(key, set()).add(checkpoint_id)

    def release(self, checkpoint_id: int) -> list[str]:
        """Drop a checkpoint's references; return the keys nothing references any more."""
        unreferenced = []
        for key in list(self._refs):
            holders = self._refs[key]
            holders.discard(checkpoint_id)
            if not holders:
                del self._refs[key]
                unreferenced.append(key)
        return sorted(unreferenced)

    def referenced(self, key: str) -> bool:
        return key in self._refs

    def keys(self) -> set[str]:
        return set(self._refs)

    def holders(self, key: str) -> set[int]:
        return set(self._refs.get(key, ()))
