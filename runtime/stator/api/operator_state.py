"""Handles of non-keyed state (``state/operator_state.py``): not bound to the key being
processed, one per operator subtask."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from ..state.operator_state import BroadcastTable, OperatorListTable

KEY_MEMO_LIMIT = 10_000


class ReadOnlyStateError(RuntimeError):
    """A write through a read-only view of broadcast state."""


class BroadcastState:
    """A map that every subtask of the operator holds identically: each applies the same
    broadcast records in the same order. Iteration is in the order of the keys' serialized
    bytes (the same in every subtask). ``writable=False`` is the view a keyed side gets: it
    may read, and every write raises :class:`ReadOnlyStateError` (a write from one subtask's
    keyed records would make the copies differ)."""

    __slots__ = ("_kb", "_t", "_uks", "writable")

    def __init__(self, table: BroadcastTable, writable: bool = True) -> None:
        self._t, self._uks, self.writable = table, table.key_serializer, writable
        self._kb: dict[Any, bytes] = {}  # serialized keys: a lookup per record serializes once

    def _key(self, key: Any) -> bytes:
        try:
            kb = self._kb.get(key)
        except TypeError:  # an unhashable key: serialized each time
            return self._uks.dumps(key)
        if kb is None:
            kb = self._uks.dumps(key)
            if len(self._kb) < KEY_MEMO_LIMIT:
                self._kb[key] = kb
        return kb

    def read_only(self) -> BroadcastState:
        return BroadcastState(self._t, writable=False)

    def _write(self) -> dict[bytes, Any]:
        if not self.writable:
            raise ReadOnlyStateError(
                f"broadcast state '{self._t.name}' is read-only here: only the broadcast "
                f"side (process_broadcast_element) may change it, so that every subtask's "
                f"copy stays the same"
            )
        self._t.changed = True
        return self._t.entries

    def get(self, key: Any, default: Any = None) -> Any:
        return self._t.entries.get(self._key(key), default)

    def put(self, key: Any, value: Any) -> None:
        if value is None:
            raise ValueError("BroadcastState.put(key, None): use remove(key) to remove an entry")
        self._write()[self._uks.dumps(key)] = value

    def put_all(self, entries: dict[Any, Any]) -> None:
        for key, value in entries.items():
            self.put(key, value)

    def remove(self, key: Any) -> None:
        self._write().pop(self._uks.dumps(key), None)

    def contains(self, key: Any) -> bool:
        return self._key(key) in self._t.entries

    def items(self) -> Iterator[tuple[Any, Any]]:
        loads = self._uks.loads
        for key, value in self._t.sorted_items():
            yield loads(key), value

    def keys(self) -> Iterator[Any]:
        return (k for k, _ in self.items())

    def values(self) -> Iterator[Any]:
        return (v for _, v in self.items())

    def is_empty(self) -> bool:
        return not self._t.entries

    def clear(self) -> None:
        self._write().clear()


class OperatorListState:
    """A list held by one operator subtask (not by a key). On a rescale its elements are
    redistributed: split (``get_operator_list_state``: the old subtasks' elements divided
    evenly) or union (``get_union_list_state``: every new subtask gets all of them)."""

    __slots__ = ("_t",)

    def __init__(self, table: OperatorListTable) -> None:
        self._t = table

    def get(self) -> list[Any]:
        """A copy of the list."""
        return list(self._t.items)

    def add(self, value: Any) -> None:
        if value is None:
            raise ValueError("OperatorListState.add(None): a list element may not be None")
        self._t.items.append(value)
        self._t.changed = True

    def add_all(self, values: Iterable[Any]) -> None:
        for value in values:
            self.add(value)

    def update(self, values: Iterable[Any]) -> None:
        items = list(values)
        if any(v is None for v in items):
            raise ValueError("OperatorListState.update: a list element may not be None")
        self._t.items[:] = items
        self._t.changed = True

    def clear(self) -> None:
        self._t.items.clear()
        self._t.changed = True
