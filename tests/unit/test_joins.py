"""Interval joins, window joins and co-groups against a plain-Python model (hypothesis),
through the real driver loop and tasks in-process: with failed attempts and failovers, and
through successive drivers across a lost executor disk, a driver crash restored from the
latest checkpoint and a stop-with-savepoint restored at another parallelism."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from stator import EpochResult, Job
from stator.api.functions import Context, KeyedProcessFunction, OutputTag
from stator.api.pipeline import Pipeline
from stator.api.windows import Session, Sliding, Tumbling
from stator.config import load_config
from stator.driver import epoch_loop
from stator.driver.savepoints import SavepointRequest
from stator.epoch.reports import Report
from stator.epoch.spec import EpochSpec
from stator.errors import PipelineError
from stator.sinks.collect import CollectSink
from stator.sources.base import SplitRange
from stator.sources.generator import list_source
from tests.unit.inprocess_job import Faults, InProcessJob
from tests.unit.inprocess_run import list_epochs, run_in_process
from tests.unit.inprocess_run import settings as job_settings

# Records: (key, timestamp, id). Each side's records arrive in timestamp order per split
# except for a bounded disorder, so which are late follows from the epochs (fixed size).
_record = st.tuples(st.sampled_from("ab"), st.integers(0, 60))


def _side(draw: st.DrawFn, tag: str, size: int, least: int = 0) -> list[tuple[str, int, str]]:
    items = draw(st.lists(_record, min_size=least, max_size=size))
    return [(k, ts, f"{tag}{i}") for i, (k, ts) in enumerate(items)]


Epochs = list[list[tuple[int, int]]]  # per epoch, the (start, end) each source read


class RecordingJob(InProcessJob):
    """The in-process job, noting the ranges each epoch read: the committed run's epochs
    are the last attempt of each epoch number. A failure-free run reads the epochs
    ``list_epochs`` gives; after a restore a finished source is asked again whether it is
    at its end (``planning.py``), which shares one epoch's budget with it, so later epochs
    are cut elsewhere, and which records are late follows the epochs the run read."""

    def __init__(self, uids: list[str], sizes: list[int], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.uids, self.sizes = uids, sizes
        self.ranges: dict[int, list[tuple[int, int]]] = {}

    def __call__(self, spark: Any, spec: EpochSpec, *args: Any, **kwargs: Any) -> list[Report]:
        read = []
        for uid, size in zip(self.uids, self.sizes, strict=True):
            (rng,) = spec.ranges.get(uid, [SplitRange("0", size, size, 0)])
            read.append((rng.start, rng.end))
        self.ranges[spec.epoch] = read
        return super().__call__(spark, spec, *args, **kwargs)

    def epochs(self) -> Epochs:
        return [self.ranges[e] for e in sorted(self.ranges)]


def on_time(sources: list[list[Any]], epochs: Epochs) -> set[str]:
    """Ids of the records not late: above the watermark in effect when their epoch started.
    Each source is one split, its records' timestamps its watermark (no out-of-orderness),
    +infinity once its last range was read; the operator's watermark is the minimum over
    the sources."""
    inf = float("inf")
    kept: set[str] = set()
    watermark = -inf
    marks = [-inf] * len(sources)
    for ranges in epochs:
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
def join_cases(draw: st.DrawFn, least: int = 0) -> dict[str, Any]:
    """``least``: the fewest records a side has (of the dense one: 5 times as many)."""
    # Sides of different density advance in event time at different paces per epoch, so
    # either side's records meet the other's from earlier epochs.
    sparse_left = draw(st.booleans())
    sparse, dense = (8, least), (40, 5 * least)
    left = sorted(_side(draw, "l", *(sparse if sparse_left else dense)), key=lambda r: r[1])
    right = sorted(_side(draw, "r", *(dense if sparse_left else sparse)), key=lambda r: r[1])
    lower = draw(st.integers(-15, 5))
    upper = lower + draw(st.integers(0, 15))
    # strict bounds, where the interval keeps a timestamp
    lower_exclusive = draw(st.booleans()) and lower < upper
    upper_exclusive = draw(st.booleans()) and lower + lower_exclusive < upper
    return {
        "left": left,
        "right": right,
        "lower": lower,
        "upper": upper,
        "lower_exclusive": lower_exclusive,
        "upper_exclusive": upper_exclusive,
        "epoch": draw(st.integers(2, 12)),
        "parallelism": draw(st.integers(1, 3)),
        "fail": draw(st.booleans()),
    }


def _harness(case: dict[str, Any], faults: Faults, seed: int = 0) -> RecordingJob:
    sizes = [len(case["left"]), len(case["right"])]
    return RecordingJob(["left", "right"], sizes, faults=faults, seed=seed)


def _run(
    case: dict[str, Any], build: Any, root: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[Any], Epochs]:
    """The output and the epochs the run read (failure-free: those of ``list_epochs``)."""
    sink = CollectSink()
    harness = _harness(case, Faults(job_fails={2: 1}) if case["fail"] else Faults())
    try:
        run_in_process(
            _pipeline(case["left"], case["right"], build, sink, None),
            root,
            monkeypatch,
            f"parallelism={case['parallelism']}",
            f"epoch.max_records={case['epoch'] * 2}",
            harness=harness,
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if not case["fail"]:
        sizes = [len(case["left"]), len(case["right"])]
        assert harness.epochs() == list_epochs(sizes, case["epoch"] * 2)
    return sink.results, harness.epochs()


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
    got, epochs = _run(
        case,
        _interval_stamped(case),
        tmp_path_factory.mktemp("ij"),
        monkeypatch,
    )
    # A pair carries the later of its records' timestamps.
    assert all(ts == max(pair[0][1], pair[1][1]) for pair, ts in got)
    assert Counter(pair for pair, _ in got) == interval_model(case, epochs)


def interval_model(case: dict[str, Any], epochs: Epochs) -> Counter[tuple[Any, Any]]:
    """Every pair of on-time records of one key within the bounds (inclusive unless the
    case makes one exclusive)."""
    lower, upper = case["lower"], case["upper"]
    kept = on_time([case["left"], case["right"]], epochs)

    def within(lts: int, rts: int) -> bool:
        above = lts + lower < rts if case["lower_exclusive"] else lts + lower <= rts
        below = rts < lts + upper if case["upper_exclusive"] else rts <= lts + upper
        return above and below

    return Counter(
        (lr, rr)
        for lr in case["left"]
        for rr in case["right"]
        if lr[2] in kept and rr[2] in kept and lr[0] == rr[0] and within(lr[1], rr[1])
    )


def _interval_stamped(case: dict[str, Any]) -> Any:
    return lambda a, b: (
        a.interval_join(
            b,
            case["lower"],
            case["upper"],
            uid="j",
            lower_exclusive=case["lower_exclusive"],
            upper_exclusive=case["upper_exclusive"],
        )
        .key_by(lambda p: p[0][0])
        .process(WithTimestamp(), uid="stamp")
    )


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
    sources: list[list[Any]], epochs: Epochs, assigner: Any
) -> Counter[tuple[str, int, int, tuple[str, ...], tuple[str, ...]]]:
    """Per key and window: both sides' record ids, epoch by epoch as the operator sees them
    (left before right within an epoch; a window takes a record unless its end - 1 is at or
    below the watermark in effect, judged after sessions merged; windows fire once the
    watermark passes their end - 1)."""
    inf = float("inf")
    out: Counter[Any] = Counter()
    windows: dict[str, dict[int, tuple[int, list[str], list[str]]]] = {}
    watermark, marks = -inf, [-inf] * len(sources)
    for ranges in epochs:
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
    got, epochs = _run(
        case,
        lambda a, b: a.co_group(b, assigner, _ids, uid="cg"),
        tmp_path_factory.mktemp("cg"),
        monkeypatch,
    )
    assert Counter(got) == window_model([case["left"], case["right"]], epochs, assigner)


@_SETTINGS
@given(case=join_cases(), assigner=ASSIGNERS)
def test_window_join_equals_the_model(
    case: dict[str, Any],
    assigner: Any,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    got, epochs = _run(
        case,
        lambda a, b: a.window_join(b, assigner, uid="wj", join=lambda x, y: (x[2], y[2])),
        tmp_path_factory.mktemp("wj"),
        monkeypatch,
    )
    model = window_model([case["left"], case["right"]], epochs, assigner)
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
    with pytest.raises(PipelineError, match=r"\(0, 1\) holds no timestamp.*make a bound"):
        a.interval_join(b, 0, 1, uid="j", lower_exclusive=True, upper_exclusive=True)
    with pytest.raises(PipelineError, match="upper_exclusive must be True or False"):
        a.interval_join(b, 0, 1, uid="j", upper_exclusive="yes")  # type: ignore[arg-type]
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


# ------------------------------------------------ across restores, rescales and lost disks

# What ends or breaks a driver after an epoch (as in test_state_model.py): the epoch's job
# fails (failover from local state), the same with the executor's disk gone (restore from
# the checkpoint store), the driver dies (a new one restores the latest checkpoint).
BREAKS = st.sampled_from(["epoch-fails", "executor-lost", "driver-crash"])


class DriverCrash(BaseException):
    """The driver process dies (not an ``Exception``: nothing in the loop may catch it)."""


@st.composite
def restored_cases(draw: st.DrawFn) -> dict[str, Any]:
    """A join case with a break and a stop-with-savepoint, in either order, at epochs within
    its run (the savepoint is restored at the next parallelism of ``rescale_to``)."""
    # at least 3 and 15 records, 4 to 6 an epoch: 4 epochs or more
    case = {**draw(join_cases(least=3)), "epoch": draw(st.integers(2, 3))}
    epochs = len(list_epochs([len(case["left"]), len(case["right"])], case["epoch"] * 2))
    # An event at epoch e is armed after epoch e - 1, and leaves an epoch to read after it.
    first = draw(st.integers(2, epochs - 2))
    second = draw(st.integers(first + 1, epochs - 1))
    if draw(st.booleans()):
        first, second = second, first
    return {
        **case,
        "events": {first: draw(BREAKS), second: "savepoint-rescale"},
        "rescale_to": draw(st.lists(st.integers(1, 4), min_size=2, max_size=2)),
        "native": draw(st.booleans()),
    }


class Injector:
    """The driver's epoch listener: arms the next epoch's break in the harness, crashes the
    driver, or asks for a stop-with-savepoint, as the case says for that epoch."""

    def __init__(
        self, events: dict[int, str], driver: Job, harness: InProcessJob, native: bool
    ) -> None:
        self.events, self.driver, self.harness, self.native = events, driver, harness, native
        self.savepoint: SavepointRequest | None = None

    def __call__(self, result: EpochResult) -> None:
        if self.savepoint is not None:  # this driver is stopping
            return
        nxt = result.epoch + 1
        what = self.events.pop(nxt, None)
        if what is None:
            return
        self.harness.seen[what] += 1
        if what in ("epoch-fails", "executor-lost"):
            self.harness.faults.job_fails[nxt] = self.harness.rng.randrange(3)
            if what == "executor-lost":
                self.harness.faults.disk_lost.add(nxt)
        elif what == "driver-crash":
            raise DriverCrash
        else:
            fmt = "native" if self.native else "canonical"
            self.savepoint = self.driver.request_savepoint(stop=True, format_type=fmt)


def _run_restored(
    case: dict[str, Any], build: Any, root: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[Any], Epochs]:
    """The case's join through drivers, a new one after a crash or a savepoint; the output
    its sink committed (each epoch once, though a new driver may commit it again) and the
    epochs it read."""
    sink = CollectSink()
    harness = _harness(case, Faults(), seed=len(case["left"]))
    monkeypatch.setattr(epoch_loop, "run_epoch_job", harness)
    events, rescales = dict(case["events"]), iter(case["rescale_to"])
    parallelism, restore = case["parallelism"], "latest"
    for _ in range(10):  # drivers; each event ends at most one
        cfg = load_config(
            None,
            job_settings(
                root,
                f"parallelism={parallelism}",
                f"epoch.max_records={case['epoch'] * 2}",
                f"restore.source={restore}",
            ),
        )
        driver = Job(_pipeline(case["left"], case["right"], build, sink, None), cfg)
        injector = Injector(events, driver, harness, case["native"])
        driver.on_epoch(injector)
        plan = driver.check_restore_source()
        (loop,) = driver.loops
        try:
            loop.recovery.start(plan[None])
            loop._loop()
        except DriverCrash:
            restore = "latest"
            continue
        finally:
            loop.checkpoints.in_flight.abort_all("the driver is gone")
        if injector.savepoint is None:
            break
        assert injector.savepoint.status == "COMPLETED", injector.savepoint.error
        restore, parallelism = str(injector.savepoint.location), next(rescales)
    else:
        raise AssertionError("the job did not finish")
    for what in harness.seen:
        event(what)
    out = [item for epoch in sorted(sink.by_epoch) for item in sink.by_epoch[epoch]]
    return out, harness.epochs()


_RESTORED = settings(_SETTINGS, max_examples=15)


@_RESTORED
@given(case=restored_cases())
def test_interval_join_across_restores_and_rescales_equals_the_model(
    case: dict[str, Any], tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path_factory.mktemp("ij-restored")
    try:
        got, epochs = _run_restored(case, _interval_stamped(case), root, monkeypatch)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert all(ts == max(pair[0][1], pair[1][1]) for pair, ts in got)
    assert Counter(pair for pair, _ in got) == interval_model(case, epochs)


@_RESTORED
@given(case=restored_cases(), assigner=ASSIGNERS)
def test_co_group_across_restores_and_rescales_equals_the_model(
    case: dict[str, Any],
    assigner: Any,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = tmp_path_factory.mktemp("cg-restored")
    try:
        got, epochs = _run_restored(
            case, lambda a, b: a.co_group(b, assigner, _ids, uid="cg"), root, monkeypatch
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert Counter(got) == window_model([case["left"], case["right"]], epochs, assigner)
