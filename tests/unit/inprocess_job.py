"""An epoch's job without Spark, for model-based tests: the real source and keyed tasks
(``tasks/source.py``, ``tasks/keyed.py``) run one after another in this process, in place of
``driver/sparkjob.run_epoch_job``.

What Spark does around the tasks is done here the way Spark does it, so that the state code
meets what it meets on an executor:
- the epoch's spec reaches each task pickled (cloudpickle, as Spark ships a task's closure),
  so every task gets its own copy of the pipeline and its functions;
- each task runs on one of several simulated Python workers of one executor: a worker is
  what the warm state cache keeps per process (``state/warm.py``), swapped in for the task,
  so subtasks move between workers as they do under ``local[2]``;
- a task attempt may fail (before its state commit, or after it returned, as a lost
  executor's finished task is re-run) and is then run again, and the failed attempt's
  reports are dropped, as Spark drops a failed attempt's accumulator updates.
"""

from __future__ import annotations

import random
import shutil
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pyspark import cloudpickle

from stator.api.nodes import KeyedNode, SourceNode
from stator.epoch.reports import Report, StateReport
from stator.epoch.spec import EpochSpec
from stator.state import warm
from stator.state.backend import KeyedBackend
from stator.tasks.keyed import keyed_task
from stator.tasks.source import source_task
from stator.tasks.user_errors import USER_ERROR_MARKER


class InjectedFailure(RuntimeError):
    """A task attempt failed on purpose (the harness retries it)."""


class TaskFailed(BaseException):
    """User code raised in a task: ends the test at once, past the driver's failover (which
    would retry it), with the user's exception as its cause."""


@dataclass
class Worker:
    """One simulated Python worker: the warm cache a process keeps between tasks."""

    caches: dict[str, Any] = field(default_factory=dict)
    moved: set[str] = field(default_factory=set)


@dataclass
class Faults:
    """Which keyed task attempts fail: (epoch, operator uid, subtask) -> where.

    ``before_commit``: the attempt raises as it commits its state (its user code ran and
    changed the caches); ``after_return``: the attempt ran to the end, committed and
    returned, and is run again (its reports dropped)."""

    before_commit: set[tuple[int, str, int]] = field(default_factory=set)
    after_return: set[tuple[int, str, int]] = field(default_factory=set)
    # epoch -> how many keyed tasks commit before the epoch's job fails (the driver fails
    # over); with ``disk_lost`` the executor's local state goes with it.
    job_fails: dict[int, int] = field(default_factory=dict)
    disk_lost: set[int] = field(default_factory=set)


class _Reports:
    """The accumulator a task adds its reports to."""

    def __init__(self) -> None:
        self.items: list[Report] = []

    def add(self, reports: list[Report]) -> None:
        self.items.extend(reports)


class InProcessJob:
    """A ``run_epoch_job`` that runs the real tasks in this process."""

    def __init__(self, workers: int = 2, seed: int = 0, faults: Faults | None = None) -> None:
        self.workers = [Worker() for _ in range(workers)]
        self.rng = random.Random(seed)
        self.faults = faults or Faults()
        self.attempts: list[tuple[int, str, int, str]] = []  # (epoch, uid, subtask, outcome)
        # What moved state around, for the test's statistics: restores by source, and keyed
        # tasks that ran on another worker than their subtask's previous task.
        self.seen: Counter[str] = Counter()
        self._last_worker: dict[tuple[str, int], int] = {}

    def __call__(
        self,
        spark: Any,
        spec: EpochSpec,
        group: str,
        description: str,
        placement: Callable[[str, int], list[str]] | None = None,
    ) -> list[Report]:
        shipped = cloudpickle.dumps(spec)
        accumulator: list[Report] = []
        pipeline = spec.pipeline
        inputs: dict[int, dict[int, list[tuple[int, bytes]]]] = {}
        for uid, ranges in spec.ranges.items():
            source = next(n for n in pipeline.nodes if isinstance(n, SourceNode) and n.uid == uid)
            for index in range(len(ranges)):
                reports = _Reports()
                with self._on_a_worker():
                    task_spec = cloudpickle.loads(shipped)
                    out = list(source_task(task_spec, source.id, reports, index, iter([index])))
                accumulator.extend(reports.items)
                self._route(out, inputs)
        snapshots = spec.checkpoint is not None or spec.savepoint is not None
        ran = 0
        for node in pipeline.nodes:  # node ids are in topological order
            if not isinstance(node, KeyedNode):
                continue
            if node.id not in inputs and not snapshots:
                continue
            per_subtask = inputs.get(node.id, {})
            for subtask in range(spec.parallelism[node.uid]):
                self._maybe_fail(spec, ran)
                ran += 1
                items = per_subtask.get(subtask, [])
                out = self._keyed(shipped, spec, node, subtask, items, accumulator)
                self._route(out, inputs)
        self._maybe_fail(spec, ran)
        return accumulator

    def _maybe_fail(self, spec: EpochSpec, ran: int) -> None:
        """The epoch's job fails once ``ran`` keyed tasks have run, if it is to."""
        if self.faults.job_fails.get(spec.epoch) != ran:
            return
        del self.faults.job_fails[spec.epoch]
        if spec.epoch in self.faults.disk_lost:
            self.faults.disk_lost.discard(spec.epoch)
            shutil.rmtree(spec.local_dir, ignore_errors=True)
            for worker in self.workers:  # the executor's processes went with it
                worker.caches.clear()
                worker.moved.clear()
        self.attempts.append((spec.epoch, "", ran, "job failed"))
        raise InjectedFailure(f"injected: epoch {spec.epoch}'s job fails after {ran} keyed tasks")

    def _keyed(
        self,
        shipped: bytes,
        spec: EpochSpec,
        node: KeyedNode,
        subtask: int,
        items: list[tuple[int, bytes]],
        accumulator: list[Report],
    ) -> list[Any]:
        """Spark's task attempts of one keyed subtask: failed attempts are run again."""
        epoch, uid = spec.epoch, node.uid
        where = (epoch, uid, subtask)
        while True:
            reports = _Reports()
            fail_commit = where in self.faults.before_commit
            fail_after = where in self.faults.after_return
            try:
                with self._on_a_worker((uid, subtask)), _commit_fails(fail_commit):
                    task_spec = cloudpickle.loads(shipped)
                    out = list(keyed_task(task_spec, node.id, reports, subtask, iter(items)))
            except InjectedFailure:
                self.faults.before_commit.discard(where)
                self.attempts.append((*where, "failed before commit"))
                continue
            except Exception as exc:
                if USER_ERROR_MARKER in f"{type(exc).__name__}: {exc}":
                    raise TaskFailed(f"{uid} subtask {subtask} epoch {epoch}: {exc}") from exc
                raise  # the epoch fails: the driver classifies it (e.g. rewinds the job)
            if fail_after:
                self.faults.after_return.discard(where)
                self.attempts.append((*where, "ran again after it returned"))
                continue
            self.attempts.append((*where, "ok"))
            accumulator.extend(reports.items)
            for report in reports.items:
                if isinstance(report, StateReport) and report.restore.source != "none":
                    kind = "savepoint" if report.restore.savepoint else "checkpoint"
                    self.seen[f"restore from a {report.restore.source} {kind}"] += 1
            return out

    def _route(self, out: list[Any], inputs: dict[int, dict[int, list[tuple[int, bytes]]]]) -> None:
        for target, subtask, packed in out:
            inputs.setdefault(target, {}).setdefault(subtask, []).append((subtask, packed))

    @contextmanager
    def _on_a_worker(self, subtask: tuple[str, int] | None = None) -> Iterator[None]:
        """Run the block on a worker picked at random (the idle one Spark hands it to)."""
        index = self.rng.randrange(len(self.workers))
        worker = self.workers[index]
        if subtask is not None:
            last = self._last_worker.get(subtask)
            if last is not None and last != index:
                self.seen["a subtask moved to another worker"] += 1
            self._last_worker[subtask] = index
        warm._caches, warm._moved = worker.caches, worker.moved
        try:
            yield
        finally:
            warm._caches, warm._moved = {}, set()


@contextmanager
def _commit_fails(fail: bool) -> Iterator[None]:
    if not fail:
        yield
        return
    original = KeyedBackend.commit

    def failing(self: KeyedBackend, epoch: int, watermark: int) -> int:
        raise InjectedFailure(f"injected: the task attempt dies as it commits epoch {epoch}")

    KeyedBackend.commit = failing  # type: ignore[method-assign]
    try:
        yield
    finally:
        KeyedBackend.commit = original  # type: ignore[method-assign]
