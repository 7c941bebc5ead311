"""Non-keyed state (broadcast state, split and union operator list state) against a
plain-Python model (hypothesis), through the real driver loop and tasks
(``inprocess_job.py``), with failovers, lost disks, retried attempts, driver crashes and
two stop-with-savepoint rescales, 3 -> 5 -> 2 subtasks (each savepoint canonical or
native).

Every logical record is sent to all 8 key-groups (one physical copy per key-group), so every
subtask sees every record, as a broadcast input would. Each subtask works in the copy of its
first key-group (records are in input order within one key only): it applies every
record's broadcast operations there, so every subtask applies them in the same order, and
records the sequence number in the broadcast state; the list operations and reads of a
record run in the subtask owning the record's key-group. The model keeps each subtask's
lists exactly, and redistributes them at a rescale as Stator must (split: the old lists
concatenated in subtask order and cut into even runs, the longer first; union: every old
element on every new subtask; broadcast: the one copy).

Checked: every state commit of every subtask (epochs, restores, replays after failures)
equals the model at that commit's sequence number, and the committed output (the reads)
equals the model's. The unit suite runs 15 fixed examples (~30 s);
``STATOR_MODEL_EXAMPLES=60`` runs a random search of that many (~4 min).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from stator import EpochResult, Job
from stator.api.functions import Context, KeyedProcessFunction, RuntimeContext
from stator.api.pipeline import Pipeline
from stator.config import load_config
from stator.driver import epoch_loop
from stator.driver.savepoints import SavepointRequest
from stator.keygroups import encode_key, key_group, range_for_subtask, subtask_for_key_group
from stator.sinks.collect import CollectSink
from stator.sources.generator import list_source
from stator.state import operator_state as opstate
from stator.state.backend import KeyedBackend
from stator.state.descriptors import ListStateDescriptor, MapStateDescriptor
from stator.state.serializers import PICKLE
from tests.unit.inprocess_job import Faults, InProcessJob, TaskFailed

MP = 8
PARALLELISMS = (3, 5, 2)
SEQ = "_seq"


def _key_for(kg: int) -> str:
    return next(k for i in range(1000) if key_group(encode_key(k := f"g{kg}-{i}"), MP) == kg)


KEYS = [_key_for(kg) for kg in range(MP)]

Op = tuple[Any, ...]
Logical = tuple[int, int, tuple[Op, ...]]  # (seq, owning key-group, ops)


class OperatorStateProgram(KeyedProcessFunction):
    """Only the records of one key are processed in input order, so each subtask works in
    the copy of its first key-group (its leader): there, every subtask applies each
    record's broadcast operations in the same order, and the list operations and reads of
    the records its key-groups own, in sequence order."""

    def open(self, ctx: RuntimeContext) -> None:
        self.owned = range_for_subtask(ctx.subtask_index, ctx.parallelism, ctx.max_parallelism)
        self.rules = ctx.get_broadcast_state(MapStateDescriptor("rules"))
        self.buffer = ctx.get_operator_list_state(ListStateDescriptor("buffer"))
        self.offsets = ctx.get_union_list_state(ListStateDescriptor("offsets"))

    def process_element(self, value: Any, ctx: Context) -> Iterable[Any]:
        _, seq, copy, owner, ops = value
        if copy != self.owned.start:
            return []
        out = []
        for op in ops:
            name = op[0]
            if name == "b.put":
                self.rules.put(op[1], op[2])
            elif name == "b.remove":
                self.rules.remove(op[1])
            elif name == "b.clear":
                self.rules.clear()
            elif owner not in self.owned:
                continue
            elif name == "s.add":
                self.buffer.add((seq, op[1]))
            elif name == "s.clear":
                self.buffer.clear()
            elif name == "u.add":
                self.offsets.add((seq, op[1]))
            elif name == "u.clear":
                self.offsets.update([])
            elif name == "read":
                rules = [(k, v) for k, v in self.rules.items() if k != SEQ]
                out.append((seq, rules, self.buffer.get(), self.offsets.get()))
        self.rules.put(SEQ, seq)
        return out


# ---------------------------------------------------------------------------- the model


@dataclass
class ModelState:
    parallelism: int
    rules: dict[Any, Any] = field(default_factory=dict)
    buffer: list[list[Any]] = field(default_factory=list)
    offsets: list[list[Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.buffer = self.buffer or [[] for _ in range(self.parallelism)]
        self.offsets = self.offsets or [[] for _ in range(self.parallelism)]

    def copy(self) -> ModelState:
        return ModelState(
            self.parallelism,
            dict(self.rules),
            [list(b) for b in self.buffer],
            [list(o) for o in self.offsets],
        )

    def rescaled(self, p: int) -> ModelState:
        if p == self.parallelism:
            return self.copy()
        every = [e for b in self.buffer for e in b]
        sizes = [len(every) // p + (1 if i < len(every) % p else 0) for i in range(p)]
        runs, at = [], 0
        for size in sizes:
            runs.append(every[at : at + size])
            at += size
        union = [e for o in self.offsets for e in o]
        return ModelState(p, dict(self.rules), runs, [list(union) for _ in range(p)])


def model(
    records: list[Logical], segments: list[tuple[int, int]]
) -> tuple[dict[tuple[int, int], ModelState], list[Any]]:
    """The state after each (segment, last seq) and the reads. ``segments``: each driver
    segment's parallelism and the last seq it processed (its savepoint's)."""
    states: dict[tuple[int, int], ModelState] = {}
    state = ModelState(segments[0][0])
    states[(0, -1)] = state.copy()
    out: list[Any] = []
    segment = 0
    for seq, owner, ops in records:
        while segment + 1 < len(segments) and seq > segments[segment][1]:
            segment += 1
            state = state.rescaled(segments[segment][0])
            states[(segment, segments[segment - 1][1])] = state.copy()
        own = subtask_for_key_group(owner, MP, state.parallelism)
        for op in ops:
            name = op[0]
            if name == "b.put":
                state.rules[op[1]] = op[2]
            elif name == "b.remove":
                state.rules.pop(op[1], None)
            elif name == "b.clear":
                state.rules.clear()
            elif name == "s.add":
                state.buffer[own].append((seq, op[1]))
            elif name == "s.clear":
                state.buffer[own] = []
            elif name == "u.add":
                state.offsets[own].append((seq, op[1]))
            elif name == "u.clear":
                state.offsets[own] = []
            elif name == "read":
                rules = sorted(state.rules.items(), key=lambda kv: PICKLE.dumps(kv[0]))
                out.append((seq, rules, list(state.buffer[own]), list(state.offsets[own])))
        states[(segment, seq)] = state.copy()
    while segment + 1 < len(segments):  # a rescale after the last record
        segment += 1
        state = state.rescaled(segments[segment][0])
        states[(segment, segments[segment - 1][1])] = state.copy()
    return states, out


# ---------------------------------------------------------------------------- strategies

OPS = st.one_of(
    st.tuples(st.just("b.put"), st.integers(0, 3), st.integers(0, 9)),
    st.tuples(st.just("b.remove"), st.integers(0, 3)),
    st.tuples(st.just("b.clear")),
    st.tuples(st.just("s.add"), st.integers(0, 9)),
    st.tuples(st.just("s.clear")),
    st.tuples(st.just("u.add"), st.integers(0, 9)),
    st.tuples(st.just("u.clear")),
    st.tuples(st.just("read")),
)
FAULTS = st.sampled_from(
    ["retry-before-commit", "retry-after-return", "epoch-fails", "executor-lost", "driver-crash"]
)


@dataclass
class Case:
    records: list[Logical]
    per_epoch: int  # logical records per epoch
    events: dict[int, str]
    formats: tuple[str, str]  # of the two rescales' savepoints
    local_recovery: bool
    incremental: bool
    seed: int


@st.composite
def cases(draw: st.DrawFn) -> Case:
    per_epoch = draw(st.integers(1, 2))
    n = draw(st.integers(4 * per_epoch, 16))
    records = [
        (seq, draw(st.integers(0, MP - 1)), tuple(draw(st.lists(OPS, min_size=1, max_size=4))))
        for seq in range(n)
    ]
    epochs = -(-n // per_epoch)
    # Asked for after epoch e - 1, taken in epoch e; the restored job's first epoch is e + 1.
    first = draw(st.integers(2, epochs - 2))
    rescale_at = [first, first + 2]
    events = {e: "savepoint-rescale" for e in rescale_at}
    faults = draw(st.dictionaries(st.integers(1, epochs), FAULTS, max_size=3))
    events.update({e: f for e, f in faults.items() if e not in events})
    formats = draw(st.tuples(*[st.sampled_from(["canonical", "native"])] * 2))
    return Case(
        records,
        per_epoch,
        events,
        formats,
        draw(st.booleans()),
        draw(st.booleans()),
        draw(st.integers(0, 2**16)),
    )


# ---------------------------------------------------------------------------- the job


class DriverCrash(BaseException):
    """The driver process dies (nothing in the loop may catch it)."""


@dataclass(frozen=True)
class Commit:
    segment: int
    epoch: int
    subtask: int
    parallelism: int
    image: opstate.Image


class Injector:
    def __init__(
        self, case: Case, driver: Job, harness: InProcessJob, parallelism: int, fmt: str
    ) -> None:
        self.case, self.driver, self.harness = case, driver, harness
        self.parallelism, self.fmt = parallelism, fmt
        self.savepoint: SavepointRequest | None = None

    def __call__(self, result: EpochResult) -> None:
        if self.savepoint is not None:
            return
        nxt = result.epoch + 1
        what = self.case.events.pop(nxt, None)
        if what is None:
            return
        harness, faults = self.harness, self.harness.faults
        harness.seen[what] += 1
        subtask = ("program", harness.rng.randrange(self.parallelism))
        if what == "retry-before-commit":
            faults.before_commit.add((nxt, *subtask))
        elif what == "retry-after-return":
            faults.after_return.add((nxt, *subtask))
        elif what in ("epoch-fails", "executor-lost"):
            faults.job_fails[nxt] = harness.rng.randrange(self.parallelism + 1)
            if what == "executor-lost":
                faults.disk_lost.add(nxt)
        elif what == "driver-crash":
            raise DriverCrash
        else:
            self.savepoint = self.driver.request_savepoint(stop=True, format_type=self.fmt)


def run_job(
    case: Case, root: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[Any], list[Commit], list[int], InProcessJob]:
    """The committed reads, every state commit, and each segment's parallelism."""
    sink = CollectSink()
    harness = InProcessJob(workers=2, seed=case.seed, faults=Faults())
    monkeypatch.setattr(epoch_loop, "run_epoch_job", harness)
    commits: list[Commit] = []
    segment = [0]
    original = KeyedBackend.commit

    def recording(self: KeyedBackend, epoch: int, watermark: int) -> int:
        written = original(self, epoch, watermark)
        index, _, p = self.path.parent.name.partition("-of-")
        image = opstate.decode(self.operator_blob)
        commits.append(Commit(segment[0], epoch, int(index), int(p), image))
        return written

    monkeypatch.setattr(KeyedBackend, "commit", recording)
    physical = [
        (KEYS[copy], seq, copy, owner, ops)
        for seq, owner, ops in case.records
        for copy in range(MP)
    ]
    parallelisms = iter(PARALLELISMS)
    parallelism = next(parallelisms)
    used = [parallelism]
    formats = iter(case.formats)
    fmt = next(formats)
    restore = "latest"
    for _ in range(20):
        driver = _driver(case, root, sink, physical, parallelism, restore)
        injector = Injector(case, driver, harness, parallelism, fmt)
        driver.on_epoch(injector)
        plan = driver.check_restore_source()
        (loop,) = driver.loops
        try:
            loop.recovery.start(plan[None])
            loop._loop()
        except DriverCrash:
            restore = "latest"
            continue
        except TaskFailed as failed:
            raise AssertionError(f"user code raised: {failed.__cause__}") from failed
        finally:
            loop.checkpoints.in_flight.abort_all("the driver is gone")
        request = injector.savepoint
        if request is None:
            break
        assert request.status == "COMPLETED", request.error
        restore = str(request.location)
        parallelism = next(parallelisms)
        fmt = next(formats, fmt)
        used.append(parallelism)
        segment[0] += 1
    else:
        raise AssertionError("the job did not finish")
    reads = [item for epoch in sorted(sink.by_epoch) for item in sink.by_epoch[epoch]]
    return reads, commits, used, harness


def _driver(
    case: Case, root: Path, sink: CollectSink, physical: list[Any], parallelism: int, restore: str
) -> Job:
    p = Pipeline("opstate-model", max_parallelism=MP)
    (
        p.source(list_source(physical), uid="src", timestamps=lambda r: r[1])
        .key_by(lambda r: r[0])
        .process(OperatorStateProgram(), uid="program")
        .sink(sink, uid="out")
    )
    cfg = load_config(
        None,
        [
            f"checkpoint.storage=file://{root}/ck",
            f"savepoint.dir=file://{root}/sp",
            f"state.local_dir={root}/state",
            f"parallelism={parallelism}",
            f"epoch.max_records={case.per_epoch * MP}",
            "epoch.idle_wait_ms=1",
            "restart.delay_ms=0",
            "restart.attempts=20",
            "checkpoint.async_upload=false",
            f"checkpoint.incremental={str(case.incremental).lower()}",
            f"local_recovery.enabled={str(case.local_recovery).lower()}",
            f"restore.source={restore}",
        ],
    )
    return Job(p, cfg)


def _as_model(c: Commit) -> tuple[int, ModelState]:
    """A commit's sequence number and its state, in the model's terms (one subtask's)."""
    raw = {name: opstate.RawState(s.kind, s.elements) for name, s in c.image.items()}
    rules: dict[Any, Any] = {}
    if "rules" in raw:
        e = raw["rules"].elements
        rules = {PICKLE.loads(e[i]): PICKLE.loads(e[i + 1]) for i in range(0, len(e), 2)}
    seq = rules.pop(SEQ, -1)

    def elements(name: str) -> list[Any]:
        return [PICKLE.loads(x) for x in raw[name].elements] if name in raw else []

    state = ModelState(1, rules, [elements("buffer")], [elements("offsets")])
    return seq, state


def check(case: Case, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reads, commits, used, harness = run_job(
        dataclasses.replace(case, events=dict(case.events)), root, monkeypatch
    )
    assert len(used) == 3, f"the case must rescale twice: {used}"
    # Each segment's last seq: the highest any of its commits holds.
    last: dict[int, int] = {}
    for c in commits:
        last[c.segment] = max(last.get(c.segment, -1), _as_model(c)[0])
    segments = [(p, last.get(i, -1)) for i, p in enumerate(used)]
    for i in range(1, len(segments)):  # a segment that ran no record ends where it began
        if segments[i][1] < segments[i - 1][1]:
            segments[i] = (segments[i][0], segments[i - 1][1])
    states, expected_reads = model(case.records, segments)
    rescaled = 0
    for c in commits:
        assert c.parallelism == used[c.segment], c
        seq, got = _as_model(c)
        want = states[(c.segment, seq)]
        where = f"segment {c.segment} epoch {c.epoch} subtask {c.subtask}/{c.parallelism} seq {seq}"
        assert got.rules == want.rules, f"broadcast state at {where}"
        assert got.buffer[0] == want.buffer[c.subtask], f"split list at {where}"
        assert got.offsets[0] == want.offsets[c.subtask], f"union list at {where}"
        rescaled += c.segment > 0 and seq == segments[c.segment - 1][1]
    assert sorted(reads, key=repr) == sorted(expected_reads, key=repr)
    for what in harness.seen:
        event(what)
    event(f"savepoints {case.formats}")
    event("state checked right after a rescale" if rescaled else "no commit at a rescale's seq")


EXAMPLES = int(os.environ.get("STATOR_MODEL_EXAMPLES", "0"))
_SETTINGS = settings(
    max_examples=EXAMPLES or 15,
    deadline=None,
    derandomize=not EXAMPLES,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    print_blob=True,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
)


@_SETTINGS
@given(case=cases())
def test_operator_state_equals_the_model(
    case: Case, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path_factory.mktemp("opstate")
    try:
        check(case, root, monkeypatch)
    finally:
        shutil.rmtree(root, ignore_errors=True)
