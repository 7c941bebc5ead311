"""Interval joins, window joins and co-groups against a plain-Python model (hypothesis),
through the real driver loop and tasks in-process, with failed attempts and failovers."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stator.api.functions import Context, KeyedProcessFunction, OutputTag
from stator.api.pipeline import Pipeline
from stator.api.windows import Session, Sliding, Tumbling
from stator.errors import PipelineError
from stator.sinks.collect import CollectSink
from stator.sources.generator import list_source
from tests.unit.inprocess_job import Faults, InProcessJob
from tests.unit.inprocess_run import list_epochs, run_in_process

# Records: (key, timestamp, id). Each side's records arrive in timestamp order per split
# except for a bounded disorder, so which are late follows from the epochs (fixed size).
_record = st.tuples(st.sampled_from("ab"), st.integers(0, 60))


def _side(draw: st.DrawFn, tag: str, size: int) -> list[tuple[str, int, str]]:
    items = draw(st.lists(_record, max_size=size))
    return [(k, ts, f"{tag}{i}") for i, (k, ts) in enumerate(items)]


def on_time(sources: list[list[Any]], epoch: int) -> set[str]:
    """Ids of the records not late: above the watermark in effect when their epoch started.
    Each source is one split (epochs as ``list_epochs`` reads them), its records' timestamps
    its watermark (no out-of-orderness), +infinity once its last range was read; the
    operator's watermark is the minimum over the sources."""
    inf = float("inf")
    kept: set[str] = set()
    watermark = -inf
    marks = [-inf] * len(sources)
    for ranges in list_epochs([len(s) for s in sources], epoch * 2):
        for i, (records, (start, end)) in enumerate(zip(sources, ranges, strict=True)):
            part = records[start:end]
            kept |= {r[2] for r in part if r[1] > watermark}
            if part:
                marks[i] = max(marks[i], *(r[1] for r in part))
            if end >= len(records):
                marks[i] = inf
        watermark = max(watermark, min(marks))
    return kept


def _pipeline(
    left: list[Any], right: list[Any], build: Any, sink: CollectSink, late: CollectSink | None
) -> Pipeline:
    p = Pipeline("joins", max_parallelism=8)
    a = p.source(list_source(left), uid="left", timestamps=lambda r: r[1])
    b = p.source(list_source(right), uid="right", timestamps=lambda r: r[1])
    out = build(a.key_by(lambda r: r[0]), b.key_by(lambda r: r[0]))
    out.sink(sink, uid="out")
    return p


class WithTimestamp(KeyedProcessFunction):
    def process_element(self, value: Any, ctx: Context) -> list[Any]:
        return [(value, ctx.timestamp)]


@st.composite
def join_cases(draw: st.DrawFn) -> dict[str, Any]:
    # Sides of different density advance in event time at different paces per epoch, so
    # either side's records meet the other's from earlier epochs.
    sparse_left = draw(st.booleans())
    left = sorted(_side(draw, "l", 8 if sparse_left else 40), key=lambda r: r[1])
    right = sorted(_side(draw, "r", 40 if sparse_left else 8), key=lambda r: r[1])
    lower = draw(st.integers(-15, 5))
    upper = lower + draw(st.integers(0, 15))
    return {
        "left": left,
        "right": right,
        "lower": lower,
        "upper": upper,
        "epoch": draw(st.integers(2, 12)),
        "parallelism": draw(st.integers(1, 3)),
        "fail": draw(st.booleans()),
    }


def _run(
    case: dict[str, Any], build: Any, root: Path, monkeypatch: pytest.MonkeyPatch
) -> list[Any]:
    sink = CollectSink()
    faults = Faults(job_fails={2: 1}) if case["fail"] else Faults()
    try:
        run_in_process(
            _pipeline(case["left"], case["right"], build, sink, None),
            root,
            monkeypatch,
            f"parallelism={case['parallelism']}",
            f"epoch.max_records={case['epoch'] * 2}",
            harness=InProcessJob(faults=faults),
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return sink.results


_SETTINGS = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@_SETTINGS
@given(case=join_cases())
def test_interval_join_equals_the_model(
    case: dict[str, Any], tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    lower, upper = case["lower"], case["upper"]
    got = _run(
        case,
        lambda a, b: (
            a.interval_join(b, lower, upper, uid="j")
            .key_by(lambda p: p[0][0])
            .process(WithTimestamp(), uid="stamp")
        ),
        tmp_path_factory.mktemp("ij"),
        monkeypatch,
    )
    kept = on_time([case["left"], case["right"]], case["epoch"])
    expected = Counter(
        (lr, rr)
        for lr in case["left"]
        for rr in case["right"]
        if lr[2] in kept
        and rr[2] in kept
        and lr[0] == rr[0]
        and lr[1] + lower <= rr[1] <= lr[1] + upper
    )
    # A pair carries the later of its records' timestamps.
    assert all(ts == max(pair[0][1], pair[1][1]) for pair, ts in got)
    got = [pair for pair, _ in got]
    assert Counter(got) == expected


def _merge(
    mine: dict[int, tuple[int, list[str], list[str]]], start: int, end: int
) -> tuple[int, int]:
    """A session [start, end) with every open one it overlaps merged into it."""
    lefts: list[str] = []
    rights: list[str] = []
    for s in sorted(mine):
        e, ls, rs = mine[s]
        if s < end and start < e:
            start, end = min(start, s), max(end, e)
            lefts, rights = lefts + ls, rights + rs
            del mine[s]
    if lefts or rights:
        mine[start] = (end, lefts, rights)
    return start, end


def window_model(
    sources: list[list[Any]], epoch: int, assigner: Any
) -> Counter[tuple[str, int, int, tuple[str, ...], tuple[str, ...]]]:
    """Per key and window: both sides' record ids, epoch by epoch as the operator sees them
    (left before right within an epoch; a window takes a record unless its end - 1 is at or
    below the watermark in effect, judged after sessions merged; windows fire once the
    watermark passes their end - 1)."""
    inf = float("inf")
    out: Counter[Any] = Counter()
    windows: dict[str, dict[int, tuple[int, list[str], list[str]]]] = {}
    watermark, marks = -inf, [-inf] * len(sources)
    for ranges in list_epochs([len(s) for s in sources], epoch * 2):
        for side, (records, (first, last)) in enumerate(zip(sources, ranges, strict=True)):
            part = records[first:last]
            for key, ts, rid in part:
                mine = windows.setdefault(key, {})
                for assigned in assigner.assign(ts):
                    start, end = _merge(mine, *assigned) if assigner.merging else assigned
                    if end - 1 <= watermark:
                        continue
                    _, ls, rs = mine.get(start, (end, [], []))
                    (ls if side == 0 else rs).append(rid)
                    mine[start] = (end, ls, rs)
            if part:
                marks[side] = max(marks[side], *(r[1] for r in part))
            if last >= len(records):
                marks[side] = inf
        watermark = max(watermark, min(marks))
        for key, mine in windows.items():
            for start in sorted(mine):
                end, ls, rs = mine[start]
                if end - 1 <= watermark:
                    out[(key, start, end, tuple(sorted(ls)), tuple(sorted(rs)))] += 1
                    del mine[start]
    return out


def _ids(key: Any, window: Any, lefts: list[Any], rights: list[Any]) -> list[Any]:
    return [
        (
            key,
            window.start,
            window.end,
            tuple(sorted(r[2] for r in lefts)),
            tuple(sorted(r[2] for r in rights)),
        )
    ]


ASSIGNERS = st.sampled_from([Tumbling(10), Sliding(12, 5), Session(6)])


@_SETTINGS
@given(case=join_cases(), assigner=ASSIGNERS)
def test_co_group_equals_the_model(
    case: dict[str, Any],
    assigner: Any,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    got = _run(
        case,
        lambda a, b: a.co_group(b, assigner, _ids, uid="cg"),
        tmp_path_factory.mktemp("cg"),
        monkeypatch,
    )
    assert Counter(got) == window_model([case["left"], case["right"]], case["epoch"], assigner)


@_SETTINGS
@given(case=join_cases(), assigner=ASSIGNERS)
def test_window_join_equals_the_model(
    case: dict[str, Any],
    assigner: Any,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    got = _run(
        case,
        lambda a, b: a.window_join(b, assigner, uid="wj", join=lambda x, y: (x[2], y[2])),
        tmp_path_factory.mktemp("wj"),
        monkeypatch,
    )
    model = window_model([case["left"], case["right"]], case["epoch"], assigner)
    expected: Counter[Any] = Counter()
    for (_, _, _, lefts, rights), n in model.items():
        for left in lefts:
            for right in rights:
                expected[(left, right)] += n
    assert Counter(got) == expected


def test_bad_join_arguments_are_refused() -> None:
    p = Pipeline("bad-joins")
    a = p.source(list_source([("a", 1)]), uid="a").key_by(lambda r: r[0])
    b = p.source(list_source([("a", 1)]), uid="b").key_by(lambda r: r[0])
    with pytest.raises(PipelineError, match="lower_ms <= upper_ms"):
        a.interval_join(b, 5, -5, uid="j")
    with pytest.raises(PipelineError, match="must be an int"):
        a.interval_join(b, 0.5, 1, uid="j")  # type: ignore[arg-type]
    with pytest.raises(PipelineError, match="window assigner"):
        a.window_join(b, 10, uid="w")
    with pytest.raises(PipelineError, match="OutputTag"):
        a.co_group(b, Tumbling(5), _ids, uid="c", late_output="late")  # type: ignore[arg-type]


def test_late_records_of_a_join_go_to_its_side_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    late = OutputTag("late")
    left = [("k", ts, f"l{ts}") for ts in (10, 20, 30, 5, 40)]  # 5 arrives after 30
    right = [("k", ts, f"r{ts}") for ts in (10, 20, 30, 35, 40)]
    out, dropped = CollectSink(), CollectSink()
    p = Pipeline("late-join", max_parallelism=8)
    a = p.source(list_source(left), uid="left", timestamps=lambda r: r[1])
    b = p.source(list_source(right), uid="right", timestamps=lambda r: r[1])
    joined = a.key_by(lambda r: r[0]).interval_join(
        b.key_by(lambda r: r[0]), 0, 0, uid="j", late_output=late
    )
    joined.sink(out, uid="out")
    joined.side_output(late).sink(dropped, uid="late-out")
    run_in_process(p, tmp_path, monkeypatch, "parallelism=1", "epoch.max_records=6")
    assert dropped.results == [("k", 5, "l5")]
    assert sorted((x[2], y[2]) for x, y in out.results) == [
        ("l10", "r10"),
        ("l20", "r20"),
        ("l30", "r30"),
        ("l40", "r40"),
    ]
