"""The two-region job the region failover tests run (two disconnected pipelines in one job,
one of whose sources fails on demand), its output check and its timeline."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stator import EpochResult, Pipeline
from stator.sinks import CollectSink
from stator.sources.base import SplitRange
from stator.sources.generator import GeneratorSource, KeyedEvents

A_EVENTS = KeyedEvents(num_keys=40, seed=1)
B_EVENTS = KeyedEvents(num_keys=25, seed=2)


@dataclass
class FailsAt(GeneratorSource):
    """A generator whose read of the range holding position ``at`` of split ``gen-0`` fails
    its first ``times`` attempts, as a reset connection would (retryable), and notes each
    attempt's time in ``marks`` (a file: reads run in Spark's Python workers)."""

    marks: str = ""
    at: int = -1
    times: int = 0
    split: str = "gen-0"

    def read(self, rng: SplitRange) -> list[Any]:
        if rng.split == self.split and int(rng.start) <= self.at < int(rng.end):
            with open(self.marks, "a") as out:
                out.write(f"{time.time()}\n")
            if len(Path(self.marks).read_text().split()) <= self.times:
                raise ConnectionResetError("input connection reset (injected)")
        return super().read(rng)

    def attempts(self) -> list[float]:
        path = Path(self.marks)
        return [float(t) for t in path.read_text().split()] if path.exists() else []

    def failures(self) -> list[float]:
        return self.attempts()[: self.times]


def two_regions(
    marks: Path, a_count: int, b_count: int, fail_at: int = -1, times: int = 0
) -> tuple[Pipeline, FailsAt, CollectSink, CollectSink]:
    p = Pipeline("two-regions")
    a_sink, b_sink = CollectSink(), CollectSink()
    a_source = FailsAt(A_EVENTS, count=a_count, splits=2, marks=str(marks), at=fail_at, times=times)
    (
        p.source(a_source, uid="in-a")
        .key_by(lambda r: r[0])
        .count(uid="count-a")
        .sink(a_sink, uid="out-a")
    )
    (
        p.source(GeneratorSource(B_EVENTS, count=b_count, splits=1), uid="in-b")
        .key_by(lambda r: r[0])
        .count(uid="count-b")
        .sink(b_sink, uid="out-b")
    )
    return p, a_source, a_sink, b_sink


def assert_exact(results: list[Any], events: KeyedEvents, count: int, splits: int) -> None:
    expected = Counter(r[0] for r in events.make(0, count, 1))
    seen: dict[str, list[int]] = defaultdict(list)
    for key, total in results:
        seen[key].append(total)
    for key, totals in seen.items():
        assert totals == sorted(set(totals)), f"{key}: {totals} (committed twice)"
    assert {k: t[-1] for k, t in seen.items()} == dict(expected)


class Timeline:
    """Every region's epochs and completed checkpoints, with when they ended."""

    def __init__(self) -> None:
        self.epochs: list[tuple[float, str | None, int]] = []
        self.checkpoints: list[tuple[float, str | None, int]] = []

    def __call__(self, result: EpochResult) -> None:
        now = time.time()
        self.epochs.append((now, result.region, result.epoch))
        for o in result.outcomes:
            if o.meta is not None:
                self.checkpoints.append((now, result.region, o.checkpoint_id))

    def first_epoch_after(self, region: str | None, t: float) -> float:
        return min(at for at, r, _ in self.epochs if r == region and at > t)

    def checkpoints_between(self, region: str | None, start: float, end: float) -> int:
        return sum(1 for at, r, _ in self.checkpoints if r == region and start < at < end)
