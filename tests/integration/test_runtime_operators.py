"""Keyed state of every kind, timers and windows, against hand-computed expected output.

Inputs are exact lists and epochs are a fixed number of records, so the watermark in effect
for each record (and therefore which records are late) is known in advance.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from stator import (
    INT64,
    BoundedOutOfOrderness,
    Context,
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    Pipeline,
    ReducingStateDescriptor,
    RuntimeContext,
    ValueStateDescriptor,
)
from stator.api.windows import Collect, Count, Session, Sliding, Sum, Tumbling, Windowed
from stator.config import JobConfig
from stator.sinks import CollectSink
from stator.sources import list_source
from tests.helpers import run_job, with_overrides


class Ledger(KeyedProcessFunction):
    """Every state kind, and an event-time timer 10 ms after each record."""

    def open(self, ctx: RuntimeContext) -> None:
        self.total = ctx.get_state(ValueStateDescriptor("total", INT64))
        self.recent = ctx.get_state(ListStateDescriptor("recent", INT64))
        self.per_cat = ctx.get_state(MapStateDescriptor("per-category", INT64))
        self.largest = ctx.get_state(ReducingStateDescriptor("largest", max, INT64))

    def process_element(self, value: Any, ctx: Context) -> Iterable[Any]:
        user, category, amount, ts = value
        total = self.total.value(0) + amount
        self.total.update(total)
        self.recent.update([*self.recent.get(), amount][-2:])
        self.per_cat.put(category, self.per_cat.get(category, 0) + 1)
        self.largest.add(amount)
        ctx.timer_service.register_event_time_timer(ts + 10)
        yield ("rec", user, total, self.recent.get(), self.largest.get())

    def on_timer(self, timestamp: int, ctx: Context) -> Iterable[Any]:
        yield (
            "timer",
            ctx.current_key,
            timestamp,
            self.total.value(0),
            sorted(self.per_cat.items()),
        )


def test_state_kinds_and_timers(spark: Any, job_config: JobConfig) -> None:
    events = [
        ("u1", "a", 5, 0),
        ("u2", "a", 7, 1),
        ("u1", "b", 3, 2),  # epoch 1: W -> 2
        ("u1", "a", 9, 15),
        ("u2", "b", 1, 16),
        ("u3", "c", 4, 17),  # epoch 2: W -> 17
        ("u1", "a", 2, 30),
    ]  # epoch 3: end
    sink = CollectSink()
    p = Pipeline("ledger")
    (
        p.source(list_source(events), uid="in", timestamps=lambda e: e[3])
        .key_by(lambda e: e[0])
        .process(Ledger(), uid="ledger")
        .sink(sink, uid="out")
    )
    status = run_job(p, with_overrides(job_config, epoch={"max_records": 3}), spark)
    assert status.finished and status.epoch == 3

    # Output order is exact per key (subtasks' outputs interleave by part, not by time).
    def per_key(rows: list[Any], kind: str) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {}
        for r in rows:
            if r[0] == kind:
                out.setdefault(r[1], []).append(tuple(r[2:]))
        return out

    assert per_key(sink.results, "rec") == {
        "u1": [(5, [5], 5), (8, [5, 3], 5), (17, [3, 9], 9), (19, [9, 2], 9)],
        "u2": [(7, [7], 7), (8, [7, 1], 7)],
        "u3": [(4, [4], 4)],
    }
    # Epoch 2 ends at watermark 17: timers at 10, 11 and 12 fire then; epoch 3 is the last
    # (watermark = max), so the rest fire at its end, in timestamp order per subtask.
    timers = per_key(sink.results, "timer")
    assert {k: [(ts, total) for ts, total, _ in v] for k, v in timers.items()} == {
        "u1": [(10, 17), (12, 17), (25, 19), (40, 19)],
        "u2": [(11, 8), (26, 8)],
        "u3": [(27, 4)],
    }
    assert timers["u1"][0][2] == [("a", 2), ("b", 1)]
    assert timers["u1"][-1][2] == [("a", 3), ("b", 1)]
    assert [
        e for e, rows in sorted(sink.by_epoch.items()) if any(r[0] == "timer" for r in rows)
    ] == [2, 3]


def _window_job(
    spark: Any,
    job_config: JobConfig,
    events: list[tuple[str, int]],
    assigner: Any,
    aggregate: Any,
    lateness: int = 0,
    epoch: int = 3,
) -> list[Windowed]:
    sink = CollectSink()
    p = Pipeline("windows")
    (
        p.source(
            list_source(events),
            uid="in",
            timestamps=lambda e: e[1],
            watermarks=BoundedOutOfOrderness(0),
        )
        .key_by(lambda e: e[0])
        .window(assigner, aggregate, uid="win", allowed_lateness_ms=lateness)
        .sink(sink, uid="out")
    )
    run_job(p, with_overrides(job_config, epoch={"max_records": epoch}), spark)
    return [Windowed(*w) for w in sink.results]


EVENTS = [
    ("a", 1),
    ("a", 2),
    ("b", 5),  # epoch 1: watermark 5 afterwards
    ("a", 12),
    ("a", 3),
    ("b", 25),  # a@3 is on time (5 < 9): watermark 25
    ("a", 4),
    ("b", 26),
]  # a@4 is late: [0,10) fired at watermark 25


def test_tumbling_drops_late_events(spark: Any, job_config: JobConfig) -> None:
    got = _window_job(spark, job_config, EVENTS, Tumbling(10), Count())
    assert sorted(got) == sorted(
        [
            Windowed("a", 0, 10, 3),
            Windowed("b", 0, 10, 1),
            Windowed("a", 10, 20, 1),
            Windowed("b", 20, 30, 2),
        ]
    )


def test_allowed_lateness_re_emits_the_window(spark: Any, job_config: JobConfig) -> None:
    got = _window_job(spark, job_config, EVENTS, Tumbling(10), Count(), lateness=20)
    assert sorted(got) == sorted(
        [
            Windowed("a", 0, 10, 3),
            Windowed("b", 0, 10, 1),
            Windowed("a", 10, 20, 1),
            Windowed("a", 0, 10, 4),
            Windowed("b", 20, 30, 2),
        ]
    )


def test_sliding_windows(spark: Any, job_config: JobConfig) -> None:
    events = [("k", 1), ("k", 6), ("k", 11)]
    got = _window_job(spark, job_config, events, Sliding(10, 5), Sum(lambda e: e[1]), epoch=10)
    assert sorted(got) == [
        Windowed("k", -5, 5, 1),
        Windowed("k", 0, 10, 7),
        Windowed("k", 5, 15, 17),
        Windowed("k", 10, 20, 11),
    ]


def test_session_windows_merge(spark: Any, job_config: JobConfig) -> None:
    # gap 5: 1,3 and 7 merge (7 < 3+5); 20 starts a new session; 12 bridges? 12 >= 7+5: no.
    events = [("s", 1), ("s", 7), ("s", 3), ("s", 20), ("s", 12), ("t", 2)]
    got = _window_job(spark, job_config, events, Session(5), Collect(), epoch=10)
    assert sorted(got, key=lambda w: (w.key, w.start)) == [
        Windowed("s", 1, 12, [("s", 1), ("s", 7), ("s", 3)]),
        Windowed("s", 12, 17, [("s", 12)]),
        Windowed("s", 20, 25, [("s", 20)]),
        Windowed("t", 2, 7, [("t", 2)]),
    ]


def test_reduce_and_count_across_epochs(spark: Any, job_config: JobConfig) -> None:
    words = ["a", "b", "a", "c", "b", "a", "d", "a"]
    counts, sums = CollectSink(), CollectSink()
    p = Pipeline("words")
    src = p.source(list_source(words, splits=2), uid="in")
    src.key_by(lambda w: w).count(uid="count").sink(counts, uid="counts")
    src.key_by(lambda w: w).sum(ord, uid="sum").sink(sums, uid="sums")
    run_job(p, with_overrides(job_config, epoch={"max_records": 4}), spark)
    final = dict(counts.results)
    assert final == {"a": 4, "b": 2, "c": 1, "d": 1}
    assert dict(sums.results) == {"a": 4 * 97, "b": 2 * 98, "c": 99, "d": 100}
    # Each epoch emits one update per changed key: epoch 1 = a b a c, epoch 2 = b a d a.
    assert sorted(counts.by_epoch[1]) == [("a", 2), ("b", 1), ("c", 1)]
    assert sorted(counts.by_epoch[2]) == [("a", 4), ("b", 2), ("d", 1)]
