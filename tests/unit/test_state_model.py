"""The keyed state API against a plain-Python model (hypothesis).

A random program is a list of records, each carrying operations on a key's Value, List, Map,
Reducing and Aggregating state (also with TTL) and its event-time timers. The processing
time is injected: epoch e runs at e * CLOCK_STEP ms, so TTL-enabled values expire a few
epochs after their last access, and the model checks expiry through every fault below. The
job runs it through the real driver loop (``Job`` and its ``RegionLoop``: checkpoints,
failover, savepoints, restores) and the real source and keyed tasks (``inprocess_job.py``
runs them without Spark), with the things that move state around injected between and
inside epochs: subtasks moving between Python workers (warm cache on, off, partial),
retried task attempts, failed epochs (restored from local copies, or from the object store
when the executor's disk is lost), driver crashes, and stop-with-savepoint then restore at
another parallelism. Every read a function makes is
part of its output, and the output the sink committed must equal what the model gives, key
by key.

``STATOR_MODEL_EXAMPLES=500 pytest tests/unit/test_state_model.py`` runs a longer, random
search; the unit suite runs a fixed set of examples.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import os
import pickle
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from stator import EpochResult, Job
from stator.api.pipeline import Pipeline
from stator.api.time import BoundedOutOfOrderness
from stator.config import load_config
from stator.driver import epoch_loop
from stator.driver.savepoints import SavepointRequest
from stator.sinks.collect import CollectSink
from stator.sources.generator import list_source
from stator.state import warm
from stator.state.markers import MISSING
from tests.state_model import Program, Record, model, record_times
from tests.unit.inprocess_job import Faults, InProcessJob, TaskFailed
from tests.unit.inprocess_longrun import LongRunningInProcess

EXAMPLES = int(os.environ.get("STATOR_MODEL_EXAMPLES", "0"))
MAX_PARALLELISM = 8
CLOCK_STEP = 10  # ms of processing time per epoch

# ---------------------------------------------------------------------------- strategies

_small = st.integers(0, 9)
_stamp = st.integers(0, 60)
OPS = st.one_of(
    st.tuples(st.just("v.get")),
    st.tuples(st.just("v.set"), _small),
    st.tuples(st.just("v.clear")),
    st.tuples(st.just("v.due"), _stamp),
    st.tuples(st.just("l.get")),
    st.tuples(st.just("l.add"), _small),
    st.tuples(st.just("l.update"), st.lists(_small, max_size=3).map(tuple)),
    st.tuples(st.just("l.clear")),
    st.tuples(st.just("m.get"), st.integers(0, 3)),
    st.tuples(st.just("m.put"), st.integers(0, 3), _small),
    st.tuples(st.just("m.remove"), st.integers(0, 3)),
    st.tuples(st.just("m.contains"), st.integers(0, 3)),
    st.tuples(st.just("m.items")),
    st.tuples(st.just("m.empty")),
    st.tuples(st.just("m.clear")),
    st.tuples(st.just("r.get")),
    st.tuples(st.just("r.add"), _small),
    st.tuples(st.just("r.clear")),
    st.tuples(st.just("t.reg"), _stamp),
    st.tuples(st.just("t.del"), _stamp),
)
# The aggregating and TTL-enabled states' operations.
TTL_OPS = st.one_of(
    st.tuples(st.just("a.get")),
    st.tuples(st.just("a.add"), _small),
    st.tuples(st.just("a.clear")),
    st.tuples(st.just("tv.get")),
    st.tuples(st.just("tv.set"), _small),
    st.tuples(st.just("tv.clear")),
    st.tuples(st.just("tl.get")),
    st.tuples(st.just("tl.add"), _small),
    st.tuples(st.just("tl.update"), st.lists(_small, max_size=3).map(tuple)),
    st.tuples(st.just("tm.get"), st.integers(0, 3)),
    st.tuples(st.just("tm.put"), st.integers(0, 3), _small),
    st.tuples(st.just("tm.remove"), st.integers(0, 3)),
    st.tuples(st.just("tm.contains"), st.integers(0, 3)),
    st.tuples(st.just("tm.items")),
    st.tuples(st.just("tm.empty")),
    st.tuples(st.just("tr.get")),
    st.tuples(st.just("tr.add"), _small),
    st.tuples(st.just("ta.get")),
    st.tuples(st.just("ta.add"), _small),
)
ALL_OPS = st.one_of(OPS, TTL_OPS)

# What happens after an epoch (by the driver's epoch listener) or inside it (the harness).
EVENTS = st.sampled_from(
    [
        "retry-before-commit",  # a keyed task attempt dies as it commits; Spark retries it
        "retry-after-return",  # a finished keyed task is run again (its executor was lost)
        "epoch-fails",  # the epoch's job fails after some keyed tasks committed: failover
        "executor-lost",  # the same, and the executor's disk is gone: restore remotely
        "driver-crash",  # the driver dies after the epoch; a new one recovers
        "savepoint-rescale",  # stop with a savepoint, restore it at another parallelism
    ]
)


@dataclass
class Case:
    records: list[Record]
    epoch_size: int
    delay: int
    parallelism: int
    rescale_to: list[int]
    warm_entries: int
    local_recovery: bool
    incremental: bool
    every_epochs: int
    native_savepoints: bool
    workers: int
    seed: int
    events: dict[int, str]
    ttl_ms: int


@st.composite
def cases(draw: st.DrawFn, ops_of: st.SearchStrategy[Any] = ALL_OPS, max_keys: int = 12) -> Case:
    n_keys = draw(st.integers(1, max_keys))
    keys = [f"k{i}" for i in range(n_keys)]
    n = draw(st.integers(1, 40))
    records: list[Record] = []
    for seq in range(n):
        key = draw(st.sampled_from(keys))
        ts = draw(_stamp)
        ops = tuple(draw(st.lists(ops_of, min_size=1, max_size=5)))
        records.append((key, seq, ts, ops))
    epoch_size = draw(st.integers(1, 6))
    epochs = -(-n // epoch_size)
    events = draw(st.dictionaries(st.integers(1, epochs), EVENTS, max_size=min(epochs, 5)))
    return Case(
        records=records,
        epoch_size=epoch_size,
        delay=draw(st.integers(0, 10)),
        parallelism=draw(st.integers(1, 3)),
        rescale_to=draw(st.lists(st.integers(1, 4), min_size=4, max_size=4)),
        warm_entries=draw(st.sampled_from([100_000, 4, 0])),
        local_recovery=draw(st.booleans()),
        incremental=draw(st.booleans()),
        every_epochs=draw(st.integers(1, 2)),
        native_savepoints=draw(st.booleans()),
        workers=draw(st.integers(1, 3)),
        seed=draw(st.integers(0, 2**16)),
        events=events,
        ttl_ms=draw(st.sampled_from([15, 25, 45])),  # 1 to 4 epochs of CLOCK_STEP
    )


# ---------------------------------------------------------------------------- the job


class DriverCrash(BaseException):
    """The driver process dies (not an ``Exception``: nothing in the loop may catch it)."""


class Injector:
    """The driver's epoch listener: arms the next epoch's faults in the harness, crashes the
    driver, or asks for a stop-with-savepoint, as the case says for that epoch."""

    def __init__(
        self,
        case: Case,
        driver: Job,
        harness: InProcessJob | LongRunningInProcess,
        parallelism: int,
    ) -> None:
        self.case, self.driver, self.harness, self.parallelism = case, driver, harness, parallelism
        self.savepoint: SavepointRequest | None = None

    def __call__(self, result: EpochResult) -> None:
        if self.savepoint is not None:  # this driver is stopping
            return
        nxt = result.epoch + 1
        event = self.case.events.pop(nxt, None)
        if event is None:
            return
        harness, faults = self.harness, self.harness.faults
        harness.seen[event] += 1
        subtask = ("program", harness.rng.randrange(self.parallelism))
        if event == "retry-before-commit":
            faults.before_commit.add((nxt, *subtask))
        elif event == "retry-after-return":
            faults.after_return.add((nxt, *subtask))
        elif event in ("epoch-fails", "executor-lost"):
            faults.job_fails[nxt] = harness.rng.randrange(self.parallelism + 1)
            if event == "executor-lost":
                faults.disk_lost.add(nxt)
        elif event == "driver-crash":
            raise DriverCrash
        elif event == "savepoint-rescale":
            fmt = "native" if self.case.native_savepoints else "canonical"
            self.savepoint = self.driver.request_savepoint(stop=True, format_type=fmt)


def run_job(
    case: Case, root: Path, monkeypatch: pytest.MonkeyPatch, long_running: bool = False
) -> tuple[dict[str, list[Any]], Counter[str]]:
    """Run the case's program through drivers (a new one after a crash or a savepoint);
    the committed output per key in epoch order, and what moved state around.
    ``long_running``: epochs run on long-running tasks (``inprocess_longrun.py``)."""
    sink = CollectSink()
    harness: InProcessJob | LongRunningInProcess = (
        LongRunningInProcess(monkeypatch, seed=case.seed, faults=Faults())
        if long_running
        else InProcessJob(workers=case.workers, seed=case.seed, faults=Faults())
    )
    monkeypatch.setattr(epoch_loop, "run_epoch_job", harness)
    monkeypatch.setattr(epoch_loop, "epoch_processing_time", lambda epoch: epoch * CLOCK_STEP)
    read_file = warm._read

    def counted_read(file: Path, token: bytes, key: bytes) -> warm.Tables:
        tables = read_file(file, token, key)
        if tables:
            harness.seen["a task took its cache from the warm cache file"] += 1
        return tables

    monkeypatch.setattr(warm, "_read", counted_read)
    parallelism = case.parallelism
    rescales = iter(case.rescale_to)
    restore = "latest"
    warm.clear()
    for _ in range(20):  # drivers; each event ends at most one
        driver = _driver(case, root, sink, parallelism, restore)
        injector = Injector(case, driver, harness, parallelism)
        driver.on_epoch(injector)
        plan = driver.check_restore_source()
        (loop,) = driver.loops  # its loop, run in this thread without Spark
        try:
            loop.recovery.start(plan[None])
            loop._loop()
        except DriverCrash:
            restore = "latest"
            continue
        except TaskFailed as failed:  # an Exception, so that hypothesis shrinks the case
            raise AssertionError(f"user code raised: {failed.__cause__}") from failed
        finally:
            loop.checkpoints.in_flight.abort_all("the driver is gone")
            if isinstance(harness, LongRunningInProcess):  # its tasks end with the driver
                harness.tasks.abort()
        request = injector.savepoint
        if request is None:
            break
        assert request.status == "COMPLETED", request.error
        restore = str(request.location)
        parallelism = next(rescales)
    else:
        raise AssertionError("the job did not finish")
    if isinstance(harness, LongRunningInProcess):
        assert harness.runs >= 1, "no epoch ran on long-running tasks"
        if harness.runs > 1:
            harness.seen["long-running tasks relaunched"] += 1
    out: dict[str, list[Any]] = {}
    for epoch in sorted(sink.by_epoch):
        for key, item in sink.by_epoch[epoch]:
            out.setdefault(key, []).append(item)
    return out, harness.seen


def _driver(case: Case, root: Path, sink: CollectSink, parallelism: int, restore: str) -> Job:
    p = Pipeline("model", max_parallelism=MAX_PARALLELISM)
    (
        p.source(
            list_source(case.records),
            uid="src",
            timestamps=lambda r: r[2],
            watermarks=BoundedOutOfOrderness(case.delay),
        )
        .key_by(lambda r: r[0])
        .process(Program(case.ttl_ms), uid="program")
        .sink(sink, uid="out")
    )
    cfg = load_config(
        None,
        [
            f"checkpoint.storage=file://{root}/ck",
            f"savepoint.dir=file://{root}/sp",
            f"state.local_dir={root}/state",
            f"parallelism={parallelism}",
            f"epoch.max_records={case.epoch_size}",
            "epoch.idle_wait_ms=1",
            "restart.delay_ms=0",
            "restart.attempts=20",
            "checkpoint.async_upload=false",
            f"checkpoint.every_epochs={case.every_epochs}",
            f"checkpoint.incremental={str(case.incremental).lower()}",
            f"state.warm_cache_entries={case.warm_entries}",
            f"local_recovery.enabled={str(case.local_recovery).lower()}",
            f"restore.source={restore}",
        ],
    )
    return Job(p, cfg)


def check(
    case: Case, root: Path, monkeypatch: pytest.MonkeyPatch, long_running: bool = False
) -> None:
    got, seen = run_job(
        dataclasses.replace(case, events=dict(case.events)), root, monkeypatch, long_running
    )
    times = record_times(got)
    assert set(times) == {r[1] for r in case.records}
    stamps = [times[r[1]] for r in case.records]
    # One time per epoch, from the injected clock, advancing with the input.
    assert all(t % CLOCK_STEP == 0 for t in stamps) and stamps == sorted(stamps)
    expected = model(case.records, case.epoch_size, case.delay, times, case.ttl_ms)
    for what in seen:
        event(what)
    event({0: "warm cache off", 4: "warm cache partial"}.get(case.warm_entries, "warm cache on"))
    assert got == expected


_SETTINGS = settings(
    max_examples=EXAMPLES or 40,
    deadline=None,
    derandomize=not EXAMPLES,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    print_blob=True,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
)


@_SETTINGS
@given(case=cases())
def test_state_reads_equal_the_model(
    case: Case, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path_factory.mktemp("model")
    try:
        check(case, root, monkeypatch)
    finally:
        shutil.rmtree(root, ignore_errors=True)


_TTL_SETTINGS = settings(_SETTINGS, max_examples=EXAMPLES or 20)


@_TTL_SETTINGS
@given(case=cases(TTL_OPS, max_keys=3))
def test_ttl_state_reads_equal_the_model(
    case: Case, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Few keys and only aggregating and TTL-enabled state: a key's values are read again
    after they expired, after a read restarted their time, and after cleanup ran."""
    root = tmp_path_factory.mktemp("model-ttl")
    try:
        check(case, root, monkeypatch)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_absent_marker_survives_pickling_and_copies() -> None:
    """The warm cache file pickles caches holding the marker of a deleted key."""

    assert pickle.loads(pickle.dumps(MISSING)) is MISSING  # noqa: S301 - our own bytes
    assert copy.deepcopy(MISSING) is MISSING
    assert copy.copy(MISSING) is MISSING


def test_no_marker_is_a_bare_object() -> None:
    """A marker made with ``object()`` does not survive pickling or copying (issue 37): the
    runtime and the operator define none."""
    repo = Path(__file__).resolve().parents[2]
    found = []
    for path in [*(repo / "runtime").rglob("*.py"), *(repo / "operator").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            value = getattr(node, "value", None)
            if (
                isinstance(node, ast.Assign | ast.AnnAssign)
                and isinstance(value, ast.Call)
                and isinstance(value.func, ast.Name)
                and value.func.id == "object"
                and not value.args
            ):
                found.append(f"{path.relative_to(repo)}:{node.lineno}")
    assert not found, f"use an enum member (state/markers.py) instead of object(): {found}"


@settings(_SETTINGS, max_examples=EXAMPLES or 20)
@given(case=cases())
def test_state_reads_equal_the_model_on_long_running_tasks(
    case: Case, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same programs and faults with epochs on long-running tasks (``epoch.tasks:
    long-running``): the data plane, the inbox's barrier and a run relaunched after each
    failure. A task that dies fails the epoch there (no task retries): "retry" events are
    failed epochs."""
    root = tmp_path_factory.mktemp("model-lr")
    try:
        check(case, root, monkeypatch, long_running=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
