"""Two-input operators, union and side outputs through the real driver loop and tasks
(without Spark): exact output, and the same output after failed task attempts and a failover."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from stator.api.functions import (
    BroadcastProcessFunction,
    Context,
    KeyedCoProcessFunction,
    KeyedProcessFunction,
    OutputTag,
    ProcessFunction,
    RuntimeContext,
    ValueState,
)
from stator.api.pipeline import Pipeline
from stator.api.windows import Collect, Count, Session, Tumbling
from stator.checkpoint.metadata import CheckpointMetadata
from stator.errors import PipelineError
from stator.sinks.collect import CollectSink
from stator.sources.generator import list_source
from stator.state.descriptors import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from stator.state_reader import operator_state_rows
from tests.pipelines.multi_input import (
    RULES,
    broadcast_counts,
    connected,
    expected_balances,
    expected_broadcast_counts,
    expected_match,
)
from tests.unit.inprocess_job import Faults, InProcessJob
from tests.unit.inprocess_longrun import LongRunningInProcess
from tests.unit.inprocess_run import run_in_process, stopped_with

# Epochs as per-epoch jobs, or on long-running tasks (``epoch.tasks: long-running``).
TASKS = pytest.mark.parametrize("long_running", [False, True], ids=["per-epoch", "long-running"])


@TASKS
@pytest.mark.parametrize("parallelism", [1, 3])
def test_connected_streams_share_keyed_state_and_emit_side_outputs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parallelism: int, long_running: bool
) -> None:
    out, big = CollectSink(), CollectSink()
    run_in_process(
        connected(out, big),
        tmp_path,
        monkeypatch,
        f"parallelism={parallelism}",
        "epoch.max_records=16",
        long_running=long_running,
    )
    main, side = expected_match()
    got = Counter(r for r in out.results if r[0] != "balance")
    assert got == main
    assert Counter(big.results) == side
    # The timer at 1000 fires once per key, when both inputs' watermark passed it: the
    # balance covers every record of both inputs.
    balances = sorted(r[1:3] for r in out.results if r[0] == "balance")
    assert balances == expected_balances()


def test_failed_attempts_and_failover_give_the_same_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    faults = Faults(
        before_commit={(2, "match", 1)},
        after_return={(3, "match", 0)},
        job_fails={4: 1},
    )
    out, big = CollectSink(), CollectSink()
    run_in_process(
        connected(out, big),
        tmp_path,
        monkeypatch,
        "parallelism=2",
        "epoch.max_records=16",
        harness=InProcessJob(faults=faults),
    )
    main, side = expected_match()
    assert Counter(r for r in out.results if r[0] != "balance") == main
    assert Counter(big.results) == side
    assert len([r for r in out.results if r[0] == "balance"]) == 7


class Seen(KeyedCoProcessFunction):
    def process_element1(self, value: Any, ctx: Context) -> list[Any]:
        return [("first", value)]

    def process_element2(self, value: Any, ctx: Context) -> list[Any]:
        return [("second", value)]


def test_a_stream_connected_with_itself_feeds_both_inputs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = CollectSink()
    p = Pipeline("self", max_parallelism=8)
    s = p.source(list_source(list(range(20))), uid="n")
    s.key_by(lambda v: v % 3).connect(s.key_by(lambda v: v % 3)).process(Seen(), uid="seen").sink(
        out, uid="out"
    )
    run_in_process(p, tmp_path, monkeypatch, "parallelism=2", "epoch.max_records=6")
    assert Counter(out.results) == Counter(
        [("first", v) for v in range(20)] + [("second", v) for v in range(20)]
    )


@TASKS
def test_union_merges_streams_of_any_origin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, long_running: bool
) -> None:
    out, raw = CollectSink(), CollectSink()
    p = Pipeline("union", max_parallelism=8)
    a = p.source(list_source([f"k{i % 4}" for i in range(30)], splits=2), uid="a")
    b = p.source(list_source([f"k{i % 5}" for i in range(25)]), uid="b")
    both = a.union(b.map(str.upper).map(str.lower))
    both.sink(raw, uid="raw")
    both.key_by(lambda k: k).count(uid="count").sink(out, uid="out")
    run_in_process(
        p, tmp_path, monkeypatch, "parallelism=2", "epoch.max_records=7", long_running=long_running
    )
    expected = Counter([f"k{i % 4}" for i in range(30)] + [f"k{i % 5}" for i in range(25)])
    assert Counter(raw.results) == expected
    final: dict[str, int] = {}
    for key, n in out.results:
        final[key] = max(final.get(key, 0), n)
    assert final == dict(expected)


class Evens(KeyedProcessFunction):
    def process_element(self, value: Any, ctx: Context) -> list[Any] | None:
        if value % 2:
            ctx.output(ODD, value)
            ctx.output(ODD, -value)
            return None
        return [value]


ODD = OutputTag("odd")


def test_side_outputs_of_a_keyed_process_function(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    evens, odds, odd_counts = CollectSink(), CollectSink(), CollectSink()
    p = Pipeline("side", max_parallelism=8)
    main = (
        p.source(list_source(list(range(40))), uid="n")
        .key_by(lambda v: v % 5)
        .process(Evens(), uid="evens")
    )
    main.sink(evens, uid="evens-out")
    odd = main.side_output(ODD)
    odd.sink(odds, uid="odd-out")
    odd.filter(lambda v: v > 0).key_by(lambda v: v % 3).count(uid="odd-count").sink(
        odd_counts, uid="odd-count-out"
    )
    run_in_process(p, tmp_path, monkeypatch, "parallelism=3", "epoch.max_records=9")
    assert sorted(evens.results) == list(range(0, 40, 2))
    assert sorted(odds.results) == sorted(
        [v for v in range(1, 40, 2)] + [-v for v in range(1, 40, 2)]
    )
    final: dict[int, int] = {}
    for key, n in odd_counts.results:
        final[key] = max(final.get(key, 0), n)
    assert final == dict(Counter(v % 3 for v in range(1, 40, 2)))


LATE = OutputTag("late")


def test_a_window_sends_records_too_late_for_it_to_a_side_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One split, in order except for the records at positions 20 and 30, which carry the
    # timestamps of the first window after it fired (watermark = max ts seen, no delay).
    stamps = [i * 10 for i in range(40)]
    stamps[20], stamps[30] = 5, 15
    records = [("k", ts) for ts in stamps]
    windows, late = CollectSink(), CollectSink()
    p = Pipeline("late", max_parallelism=8)
    counted = (
        p.source(list_source(records), uid="events", timestamps=lambda r: r[1])
        .key_by(lambda r: r[0])
        .window(Tumbling(100), Count(), uid="w", late_output=LATE)
    )
    counted.sink(windows, uid="windows")
    counted.side_output(LATE).sink(late, uid="late-out")
    run_in_process(p, tmp_path, monkeypatch, "parallelism=1", "epoch.max_records=10")
    assert sorted(late.results) == [("k", 5), ("k", 15)]
    assert sorted((w.start, w.value) for w in windows.results) == [
        (0, 10),
        (100, 10),
        (200, 9),  # 200 and 300 became the late records
        (300, 9),
    ]


def test_bad_multi_input_graphs_are_refused() -> None:
    p = Pipeline("bad")
    s = p.source(list_source([1]), uid="s")
    other = Pipeline("other").source(list_source([1]), uid="s")
    with pytest.raises(PipelineError, match="same pipeline"):
        s.union(other)
    with pytest.raises(PipelineError, match="at least one"):
        s.union()
    with pytest.raises(PipelineError, match="keyed stream"):
        s.key_by(abs).connect(s)  # type: ignore[arg-type]
    with pytest.raises(PipelineError, match="KeyedCoProcessFunction"):
        s.key_by(abs).connect(s.key_by(abs)).process(Evens(), uid="x")  # type: ignore[arg-type]
    with pytest.raises(PipelineError, match="only the output of a process function"):
        s.map(abs).side_output(ODD)
    with pytest.raises(PipelineError, match="OutputTag"):
        s.key_by(abs).process(Evens(), uid="e").side_output("odd")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-empty"):
        OutputTag("")


@TASKS
def test_a_broadcast_stream_reaches_every_subtask_before_the_epochs_keyed_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, long_running: bool
) -> None:
    out = CollectSink()
    faults = Faults(before_commit={(2, "c", 1)}, job_fails={3: 1})
    run_in_process(
        broadcast_counts(out),
        tmp_path,
        monkeypatch,
        "parallelism=3",
        "epoch.max_records=20",  # 10 records of each source per epoch
        harness=(
            LongRunningInProcess(monkeypatch, faults=faults)
            if long_running
            else InProcessJob(faults=faults)
        ),
    )
    acks = Counter(r[1:] for r in out.results if r[0] == "ack")
    assert acks == Counter((rule, s) for rule in RULES for s in range(3))
    assert not [r for r in out.results if r[0] not in ("ack", "count")]
    assert Counter(r for r in out.results if r[0] == "count") == expected_broadcast_counts()


class Tagging(BroadcastProcessFunction):
    """No key: each record once, on one subtask; each broadcast record on every subtask."""

    def open(self, ctx: RuntimeContext) -> None:
        self.subtask = ctx.subtask_index
        self.state: ValueState = ctx.get_state(ValueStateDescriptor("nothing"))

    def process_element(self, value: Any, ctx: Any) -> list[Any]:
        refused = []
        for use in (self.state.value, lambda: ctx.timer_service.register_event_time_timer(5)):
            try:
                use()
            except RuntimeError as exc:
                refused.append("no current key" in str(exc))
        return [("record", value, self.subtask, refused)]

    def process_broadcast_element(self, value: Any, ctx: Any) -> list[Any]:
        return [("ack", value, self.subtask)]


def test_a_non_keyed_stream_connected_with_a_broadcast_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = CollectSink()
    p = Pipeline("nonkeyed", max_parallelism=8)
    events = p.source(list_source(list(range(50)), splits=4), uid="events")
    rules = p.source(list_source(["r1", "r2", "r3"]), uid="rules")
    events.map(lambda v: v * 2).connect(rules.broadcast()).process(Tagging(), uid="t").sink(
        out, uid="out"
    )
    run_in_process(p, tmp_path, monkeypatch, "parallelism=3", "epoch.max_records=12")
    records = [r for r in out.results if r[0] == "record"]
    assert sorted(r[1] for r in records) == [v * 2 for v in range(50)]
    assert all(r[3] == [True, True] for r in records)
    assert len({r[2] for r in records}) > 1  # spread over subtasks by upstream task
    acks = Counter(r[1:] for r in out.results if r[0] == "ack")
    assert acks == Counter((rule, s) for rule in ("r1", "r2", "r3") for s in range(3))


def test_connect_on_a_non_keyed_stream_takes_only_a_broadcast_stream() -> None:
    p = Pipeline("bad-connect")
    s = p.source(list_source([1]), uid="s")
    with pytest.raises(PipelineError, match="key both"):
        s.connect(s)  # type: ignore[arg-type]
    with pytest.raises(PipelineError, match="BroadcastProcessFunction"):
        s.connect(s.broadcast()).process(Seen(), uid="x")  # type: ignore[arg-type]


class Numbered(ProcessFunction):
    def open(self, ctx: RuntimeContext) -> None:
        self.subtask = ctx.subtask_index

    def process_element(self, value: Any, ctx: Any) -> list[Any]:
        if value % 10 == 0:
            ctx.output(ODD, value)
        return [(value, self.subtask)]


def test_a_non_keyed_process_function_runs_in_parallel_subtasks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, tens = CollectSink(), CollectSink()
    p = Pipeline("nonkeyed-process", max_parallelism=8)
    s = p.source(list_source(list(range(40)), splits=4), uid="n").process(Numbered(), uid="num")
    s.sink(out, uid="out")
    s.side_output(ODD).sink(tens, uid="tens")
    run_in_process(p, tmp_path, monkeypatch, "parallelism=3", "epoch.max_records=12")
    assert sorted(v for v, _ in out.results) == list(range(40))
    assert {sub for _, sub in out.results} == {0, 1, 2}
    assert sorted(tens.results) == [0, 10, 20, 30]
    with pytest.raises(PipelineError, match="key_by"):
        p.source(list_source([1]), uid="m").process(Evens(), uid="e")  # type: ignore[arg-type]


def test_a_late_record_that_merges_into_an_open_session_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As Flink: a merging window is judged late after merging. After epoch 1 the watermark
    is 40: session [10, 20) fired, [40, 50) is open; 31's own session [31, 41) would be late,
    but it overlaps [40, 50), so they merge into [31, 50)."""
    events = [("s", 10), ("s", 40), ("s", 31), ("s", 100)]
    out, late = CollectSink(), CollectSink()
    p = Pipeline("session-merge", max_parallelism=8)
    windows = (
        p.source(list_source(events), uid="in", timestamps=lambda e: e[1])
        .key_by(lambda e: e[0])
        .window(Session(10), Collect(), uid="w", late_output=LATE)
    )
    windows.sink(out, uid="out")
    windows.side_output(LATE).sink(late, uid="late")
    run_in_process(p, tmp_path, monkeypatch, "parallelism=1", "epoch.max_records=2")
    assert sorted((w.start, w.end, sorted(w.value)) for w in out.results) == [
        (10, 20, [("s", 10)]),
        (31, 50, [("s", 31), ("s", 40)]),
        (100, 110, [("s", 100)]),
    ]
    assert late.results == []


SEEN = ListStateDescriptor("seen")
EVERYONE = ListStateDescriptor("everyone")
APPLIED_RULES = MapStateDescriptor("applied-rules")


class Remember(BroadcastProcessFunction):
    """Non-keyed: each subtask keeps the records it took in split list state, the count of
    records per subtask in union list state, and every rule in broadcast state."""

    def open(self, ctx: RuntimeContext) -> None:
        self.seen = ctx.get_operator_list_state(SEEN)
        self.everyone = ctx.get_union_list_state(EVERYONE)

    def process_element(self, value: Any, ctx: Any) -> list[Any]:
        self.seen.add(value)
        return [(value, len(list(ctx.get_broadcast_state(APPLIED_RULES).keys())))]

    def process_broadcast_element(self, value: Any, ctx: Any) -> None:
        ctx.get_broadcast_state(APPLIED_RULES).put(value, True)
        if value == "r0":  # one element per subtask that saw the first rule
            self.everyone.add(value)


@TASKS
def test_operator_and_broadcast_state_of_a_non_keyed_operator_across_rescales(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, long_running: bool
) -> None:
    """3 -> 5 -> 2 subtasks through savepoints: the split lists keep every record once, the
    union list gives every new subtask all old elements, every subtask holds every rule."""
    out = CollectSink()

    def job() -> Pipeline:
        p = Pipeline("opstate", max_parallelism=8)
        numbers = p.source(list_source(list(range(60)), splits=2), uid="numbers")
        rules = p.source(list_source([f"r{i}" for i in range(4)]), uid="rules")
        numbers.connect(rules.broadcast(APPLIED_RULES)).process(Remember(), uid="remember").sink(
            out, uid="out"
        )
        return p

    restore, last = "latest", None
    for parallelism, stop_after in ((3, 2), (5, 4), (2, 100)):
        ran = run_in_process(
            job(),
            tmp_path,
            monkeypatch,
            f"parallelism={parallelism}",
            "epoch.max_records=10",
            f"restore.source={restore}",
            stop_after_epoch=stop_after,
            long_running=long_running,
        )
        last = restore = stopped_with(ran) if stop_after < 100 else last
        if stop_after == 100:
            assert ran.status.finished
    assert sorted(v for v, _ in out.results) == list(range(60))
    assert all(rules == 4 for _, rules in out.results)  # the rules came first, everywhere
    final = _final_checkpoint(tmp_path)
    rows = operator_state_rows(final)
    seen = sorted(json.loads(r[6]) for r in rows if r[1] == "seen")
    assert seen == list(range(60))  # split: every record kept once, wherever it went
    everyone = Counter(r[4] for r in rows if r[1] == "everyone")
    assert set(everyone) == {"0", "1"} and set(everyone.values()) == {15}  # 3 + 5*3 = 15 each
    rules = {(r[4], r[5]) for r in rows if r[1] == "applied-rules"}
    assert rules == {(str(s), json.dumps(f"r{i}")) for s in range(2) for i in range(4)}


def _final_checkpoint(root: Path) -> CheckpointMetadata:
    found = sorted(root.glob("ck/**/chk-*/_metadata"), key=lambda p: int(p.parent.name[4:]))
    return CheckpointMetadata.from_json(found[-1].read_bytes())
