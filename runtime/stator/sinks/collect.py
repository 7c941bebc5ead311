"""Collects committed output in the driver's memory: for tests and notebooks.

Exactly-once within one driver process: records become visible in ``results`` only when the
checkpoint covering their epoch completes. After a driver crash the in-memory list is gone;
use the file sink to prove exactly-once across processes.
"""

from __future__ import annotations

import threading
from typing import Any

from .base import Sink, SinkWriter


class _ListWriter(SinkWriter):
    def __init__(self, part: str) -> None:
        self.part, self.values = part, []  # type: ignore[var-annotated]

    def write(self, values: list[Any]) -> None:
        self.values.extend(values)

    def finish(self) -> tuple[dict[str, Any], Any]:
        return {"part": self.part, "records": len(self.values)}, self.values


class CollectSink(Sink):
    def __init__(self) -> None:
        self.results: list[Any] = []
        self.by_epoch: dict[int, list[Any]] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {}  # executors only need the class; results stay on the driver

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.results, self.by_epoch, self._lock = [], {}, threading.Lock()

    def writer(self, uid: str, epoch: int, part: str) -> SinkWriter:
        return _ListWriter(part)

    def commit(
        self, uid: str, epoch: int, parts: list[dict[str, Any]], payloads: list[Any]
    ) -> None:
        with self._lock:
            if epoch in self.by_epoch:
                return  # already committed (idempotent)
            ordered = [
                p for _, p in sorted(zip([d["part"] for d in parts], payloads, strict=False))
            ]
            values = [v for payload in ordered for v in (payload or [])]
            self.by_epoch[epoch] = values
            self.results.extend(values)
