"""A seeded, deterministic generator: bounded or rate-limited, for tests, demos and benchmarks.

Record ``i`` (a global index) always has the same content, and split ``j`` of ``n`` produces
indices ``j, j+n, j+2n, ...``, so any epoch can be replayed exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..epoch.availability import Availability, at, spread
from .base import Source, SplitRange

_MULT = 2654435761  # Knuth's multiplicative hash constant


class RecordMaker(Protocol):
    def make(self, start: int, stop: int, step: int) -> list[Any]:
        """Records for indices ``range(start, stop, step)``."""
        ...


@dataclass(frozen=True)
class KeyedEvents:
    """``(key, value, timestamp_ms)`` tuples: keys ``k0..k{num_keys-1}`` spread by a seeded hash,
    value 1, timestamps ``index * ms_per_record`` (ordered per split)."""

    num_keys: int = 1000
    seed: int = 0
    ms_per_record: int = 1

    def make(self, start: int, stop: int, step: int) -> list[Any]:
        n, seed, ms = self.num_keys, self.seed, self.ms_per_record
        return [
            (f"k{((i * _MULT + seed) & 0xFFFFFFFF) % n}", 1, i * ms)
            for i in range(start, stop, step)
        ]


@dataclass(frozen=True)
class SweepEvents:
    """``(key, 1, index)`` with keys in order ``k0, k1, ..., k{num_keys-1}, k0, ...``: any run
    of ``m <= num_keys`` consecutive records touches exactly ``m`` distinct keys. With epochs
    of ``m`` records after a first pass over all keys, each epoch changes an ``m / num_keys``
    share of the state: how incremental checkpoints are measured."""

    num_keys: int = 100_000

    def make(self, start: int, stop: int, step: int) -> list[Any]:
        n = self.num_keys
        return [(f"k{i % n}", 1, i) for i in range(start, stop, step)]


@dataclass
class GeneratorSource(Source):
    records: RecordMaker = field(default_factory=KeyedEvents)
    count: int | None = 1_000_000  # total records; None = unbounded
    splits: int = 2
    # None = as fast as epochs allow; else this many records per second in all, from where
    # the job (re)started: a restored job does not wait out the time it was away.
    rate_per_second: float | None = None
    # With a rate: the first ``burst`` records (in all) are there at once, and the rate adds
    # to them from the start (e.g. build up state quickly, then run steadily). A job restored
    # past the burst does not get it again.
    burst: int = 0
    _started_ms: int | None = field(default=None, repr=False)
    _base: dict[str, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.splits < 1:
            raise ValueError(f"GeneratorSource.splits must be >= 1, got {self.splits}")
        if self.count is not None and self.count < 0:
            raise ValueError(f"GeneratorSource.count must be >= 0, got {self.count}")
        if self.rate_per_second is not None and self.rate_per_second <= 0:
            raise ValueError("GeneratorSource.rate_per_second must be positive")
        if self.burst < 0:
            raise ValueError(f"GeneratorSource.burst must be >= 0, got {self.burst}")

    def discover_splits(self) -> list[str]:
        return [f"gen-{j}" for j in range(self.splits)]

    def initial_position(self, split: str) -> Any:
        return 0  # records already produced by this split

    def _split_total(self, j: int) -> float:
        if self.count is None:
            return math.inf
        return max(0, math.ceil((self.count - j) / self.splits))

    def plan(self, positions: dict[str, Any], budget: int, now_ms: int) -> list[SplitRange]:
        per_split = max(1, budget // self.splits)
        allowance = math.inf  # records each split may have produced since the start
        if self.rate_per_second is not None:
            if self._started_ms is None:
                self._started_ms = now_ms
                self._base = {split: int(done) for split, done in positions.items()}
            elapsed_s = max(0, now_ms - self._started_ms) / 1000
            allowance = math.floor(self.rate_per_second * elapsed_s / self.splits) + 1
        burst = math.ceil(self.burst / self.splits)
        ranges = []
        for j in range(self.splits):
            split = f"gen-{j}"
            if split not in positions:
                continue
            done, total = int(positions[split]), self._split_total(j)
            limit = max(burst, self._base.get(split, 0)) + allowance
            end = min(total, done + per_split, limit)
            if end > done or done >= total:
                ranges.append(SplitRange(split, done, int(max(end, done)), j, final=end >= total))
        return ranges

    def availability(self, rng: SplitRange, records: int, planned_ms: int) -> Availability:
        """With a rate: each record's scheduled emission (the burst, and where the job
        started, at the start; then one per ``splits / rate`` s per split, as :meth:`plan`
        allows them); without: when the epoch was planned."""
        if self.rate_per_second is None or self._started_ms is None or records <= 0:
            return at(planned_ms, records)
        started = self._started_ms
        first = max(math.ceil(self.burst / self.splits), self._base.get(rng.split, 0))
        ms_per_record = 1000 * self.splits / self.rate_per_second
        start, last = int(rng.start), int(rng.start) + records - 1

        def scheduled(position: int) -> int:
            return started + round(max(0, position - first) * ms_per_record)

        return spread(scheduled(start), scheduled(last), records)

    def read(self, rng: SplitRange) -> list[Any]:
        j = int(rng.split.rsplit("-", 1)[1])
        n = self.splits
        return self.records.make(j + int(rng.start) * n, j + int(rng.end) * n, n)


@dataclass(frozen=True)
class FromList:
    """Records from a fixed list (index ``i`` is ``records[i]``): exact inputs for tests."""

    records: tuple[Any, ...]

    def make(self, start: int, stop: int, step: int) -> list[Any]:
        return [self.records[i] for i in range(start, min(stop, len(self.records)), step)]


def list_source(records: list[Any], splits: int = 1) -> GeneratorSource:
    return GeneratorSource(FromList(tuple(records)), count=len(records), splits=splits)
