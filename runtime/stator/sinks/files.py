"""Exactly-once file sink to object storage (``file://`` or ``s3://``).

Each task attempt stages its epoch's records as one object of its own,
``_staging/epoch=<E>/<part>.<attempt token>.jsonl``, and reports that key. When the checkpoint
covering epoch E completes, the driver moves each *reported* staged object to
``epoch=<E>/part-<part>.jsonl`` and then writes ``_commits/<E>.json``. Readers that skip
``_``-prefixed paths (Spark, Hive, :func:`read_committed`) never see staged output, and since
committed part names are deterministic a replayed epoch rewrites the same objects: no
duplicates. An attempt nobody reported (a failed Spark attempt that still finished writing, or
a task of a driver that was replaced and cut off: ``ha/fencing.py``) writes an object no
commit moves, so it can never replace the output that is committed.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

from ..storage import ObjectStore, S3Options, open_store
from .base import Sink, SinkWriter

STAGING, COMMITS = "_staging", "_commits"


def _epoch_dir(epoch: int) -> str:
    return f"epoch={epoch:010d}"


def default_encode(record: Any) -> bytes:
    return json.dumps(record, separators=(",", ":"), default=str).encode()


class _FileWriter(SinkWriter):
    def __init__(self, sink: FileSink, epoch: int, part: str) -> None:
        self.sink, self.epoch, self.part = sink, epoch, part
        self.lines: list[bytes] = []

    def write(self, values: list[Any]) -> None:
        encode = self.sink.encode
        self.lines.extend(encode(v) for v in values)

    def finish(self) -> tuple[dict[str, Any], Any]:
        if not self.lines:
            return {"part": self.part, "records": 0}, None
        body = b"\n".join(self.lines) + b"\n"
        key = f"{STAGING}/{_epoch_dir(self.epoch)}/{self.part}.{uuid.uuid4().hex[:12]}.jsonl"
        self.sink.store.put(key, body)
        return {
            "part": self.part,
            "records": len(self.lines),
            "bytes": len(body),
            "staged": key,
        }, None


class FileSink(Sink):
    exactly_once = True

    def __init__(
        self,
        uri: str,
        *,
        encode: Callable[[Any], bytes] = default_encode,
        s3: S3Options | None = None,
    ) -> None:
        self.uri, self.encode, self.s3 = uri, encode, s3
        self._store: ObjectStore | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_store": None}

    @property
    def store(self) -> ObjectStore:
        if self._store is None:
            self._store = open_store(self.uri, self.s3)
        return self._store

    def writer(self, uid: str, epoch: int, part: str) -> SinkWriter:
        return _FileWriter(self, epoch, part)

    def connect(self) -> None:
        self.store.connect()

    def commit(
        self, uid: str, epoch: int, parts: list[dict[str, Any]], payloads: list[Any]
    ) -> None:
        staged = {p["part"]: p["staged"] for p in parts if p.get("records")}
        names = sorted(staged)
        for name in names:
            self.store.move(staged[name], f"{_epoch_dir(epoch)}/part-{name}.jsonl")
        marker = {"epoch": epoch, "parts": [f"{_epoch_dir(epoch)}/part-{n}.jsonl" for n in names]}
        self.store.put(f"{COMMITS}/{epoch:010d}.json", json.dumps(marker).encode())

    def discard_after(self, uid: str, epoch: int) -> None:
        stale = []
        for key, _ in self.store.listing(f"{STAGING}/"):
            staged_epoch = int(key.split("/")[1].split("=")[1])
            if staged_epoch > epoch:
                stale.append(key)
        self.store.delete(stale)


def read_committed(uri: str, s3: S3Options | None = None) -> list[dict[str, Any]]:
    """Every committed record, in epoch and part order (what a reader of the sink sees)."""
    store = open_store(uri, s3)
    records = []
    for key, _ in store.listing(f"{COMMITS}/"):
        marker = json.loads(store.get(key))
        for part in marker["parts"]:
            for line in store.get(part).splitlines():
                if line:
                    records.append(json.loads(line))
    return records
