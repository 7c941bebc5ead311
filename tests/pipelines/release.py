"""A rate-limited generator that a test can release: once the object ``RELEASE`` names
exists, the rest of its input is there at once.

The e2e tests run their jobs at a few hundred records a second so that a kill, a lost node
or a rescale lands mid-stream. Once a test has checked what it came for, the remaining input
at that rate is only waiting: ``Space.finish`` writes the object, and the job reads the rest
as fast as epochs allow. The records, their keys and order are the same either way (a rate
decides only when records are there), so the output stays exact; a driver started after the
release finds the object at its first plan.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from stator.sources import GeneratorSource
from stator.sources.base import SplitRange
from stator.storage import ObjectStore, open_store

CHECK_EVERY_S = 1.0  # the object is looked for at most this often (a HEAD request)


@dataclass
class ReleasableGenerator(GeneratorSource):
    # ``s3://bucket/prefix/key`` (or file:///…); empty: a plain rate-limited generator.
    release: str = ""
    _released: bool = field(default=False, repr=False)
    _checked: float = field(default=0.0, repr=False)
    _store: ObjectStore | None = field(default=None, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        """Executors get the records, not the driver's store client (it does not pickle)."""
        return {k: v for k, v in self.__dict__.items() if k != "_store"}

    def plan(self, positions: dict[str, Any], budget: int, now_ms: int) -> list[SplitRange]:
        if self.release and not self._released:
            now = time.monotonic()
            if now - self._checked >= CHECK_EVERY_S:
                self._checked = now
                self._released = self._exists()
            if self._released:
                self.rate_per_second = None
        return super().plan(positions, budget, now_ms)

    def _exists(self) -> bool:
        prefix, _, key = self.release.rpartition("/")
        if self._store is None:
            self._store = open_store(prefix)
        return self._store.exists(key)
