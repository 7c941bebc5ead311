"""Files under a directory or object-store prefix, read in name order.

One split; its position is the name of the last file read, so new files must sort after the
files already read (e.g. timestamped names). Each file of an epoch is read by its own task.
"""

from __future__ import annotations

import fnmatch
import json
from typing import Any

from ..storage import ObjectStore, S3Options, open_store
from .base import Source, SplitRange

SPLIT = "files"


class FileSource(Source):
    def __init__(
        self,
        uri: str,
        *,
        pattern: str = "*",
        format: str = "lines",
        bounded: bool = False,
        max_files_per_epoch: int = 64,
        s3: S3Options | None = None,
    ) -> None:
        """``format``: "lines" (str per line) or "json" (one JSON document per line).
        ``bounded``: read the files present when the job first plans, then finish."""
        if format not in ("lines", "json"):
            raise ValueError(f"FileSource format must be 'lines' or 'json', got {format!r}")
        self.uri, self.pattern, self.format, self.bounded = uri, pattern, format, bounded
        self.max_files_per_epoch, self.s3 = max_files_per_epoch, s3
        self._store: ObjectStore | None = None
        self._snapshot: list[str] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_store": None, "_snapshot": None}

    @property
    def store(self) -> ObjectStore:
        if self._store is None:
            self._store = open_store(self.uri, self.s3)
        return self._store

    def discover_splits(self) -> list[str]:
        return [SPLIT]

    def initial_position(self, split: str) -> Any:
        return ""

    def _files(self) -> list[str]:
        names = [
            k
            for k, _ in self.store.listing()
            if not k.rsplit("/", 1)[-1].startswith(("_", "."))
            and fnmatch.fnmatch(k.rsplit("/", 1)[-1], self.pattern)
        ]
        if self.bounded:
            if self._snapshot is None:
                self._snapshot = names
            return [n for n in names if n in set(self._snapshot)]
        return names

    def plan(self, positions: dict[str, Any], budget: int, now_ms: int) -> list[SplitRange]:
        if SPLIT not in positions:
            return []
        after = str(positions[SPLIT])
        todo = [n for n in self._files() if n > after][: self.max_files_per_epoch]
        ranges = []
        prev = after
        for i, name in enumerate(todo):
            final = self.bounded and i == len(todo) - 1 and name == self._files()[-1]
            ranges.append(SplitRange(SPLIT, prev, name, i, final=final))
            prev = name
        if not todo and self.bounded:
            ranges.append(SplitRange(SPLIT, after, after, 0, final=True))
        return ranges

    def read(self, rng: SplitRange) -> list[Any]:
        if rng.end == rng.start:
            return []
        lines = self.store.get(str(rng.end)).decode().splitlines()
        if self.format == "json":
            return [json.loads(line) for line in lines if line.strip()]
        return lines
