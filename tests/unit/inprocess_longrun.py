"""Long-running tasks without Spark, for model-based tests: the real driver side
(``longrun/driver.py``: launch, epochs, failure, relaunch) and the real task loops
(``longrun/task.py``: sockets, the inbox's barrier, the same per-epoch task code), each task
a thread of this process, in place of ``driver/sparkjob.run_epoch_job``.

Each task gets its own unpickled copy of the run's launch (cloudpickle, as Spark ships a
task's closure). Faults (``inprocess_job.Faults``), as a long-running task meets them:
- ``before_commit``: the subtask's task dies as it commits the epoch's state;
- ``after_return``: the subtask's task dies after its epoch, state committed, before it
  reports;
- ``job_fails[e] = n``: the task of the n-th keyed subtask (mod parallelism) dies after its
  epoch; with ``disk_lost`` the executor's local state and caches go with it, once the run
  ended (an executor's tasks die with its disk).
A task that dies fails the run: the driver fails over, and the next epoch launches a new
run, as when a Spark task of a long-running job fails.
"""

from __future__ import annotations

import random
import shutil
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from pyspark import cloudpickle

from stator.epoch.reports import Report, StateReport
from stator.epoch.spec import EpochSpec
from stator.longrun.driver import LongRunningTasks, Run, Shape
from stator.longrun.messages import KEYED, Launch
from stator.longrun.task import TaskLoop
from stator.state import warm
from stator.state.backend import KeyedBackend
from tests.unit.inprocess_job import Faults, InjectedFailure

_dying = threading.local()  # set in a task thread whose next commit fails


class FaultyTaskLoop(TaskLoop):
    def __init__(self, launch: Launch, index: int, harness: LongRunningInProcess) -> None:
        super().__init__(launch, index)
        self.harness = harness

    def _epoch(self, spec: EpochSpec) -> list[Report]:
        role, faults = self.role, self.harness.faults
        where = (spec.epoch, role.uid, role.index)
        if role.kind != KEYED:
            return super()._epoch(spec)
        _dying.commit = where in faults.before_commit
        faults.before_commit.discard(where)
        try:
            reports = super()._epoch(spec)
        finally:
            _dying.commit = False
        fails = faults.job_fails.get(spec.epoch)
        p = spec.parallelism[role.uid]
        if fails is not None and fails % p == role.index:
            del faults.job_fails[spec.epoch]
            if spec.epoch in faults.disk_lost:  # once every task of the run ended
                faults.disk_lost.discard(spec.epoch)
                self.harness.disk_lost = spec.local_dir
            raise InjectedFailure(f"injected: subtask {role.index} dies after epoch {spec.epoch}")
        if where in faults.after_return:
            faults.after_return.discard(where)
            raise InjectedFailure(f"injected: subtask {role.index} dies before it reports")
        for report in reports:
            if isinstance(report, StateReport) and report.restore.source != "none":
                kind = "savepoint" if report.restore.savepoint else "checkpoint"
                self.harness.seen[f"restore from a {report.restore.source} {kind}"] += 1
        return reports


class ThreadTasks:
    """A run's tasks as threads; cancelling closes the run's connections, which ends them."""

    def __init__(self, harness: LongRunningInProcess) -> None:
        self.harness = harness

    def start(self, launch: Launch, shape: Shape, run: Run) -> None:
        shipped = cloudpickle.dumps(launch)
        errors: list[BaseException] = []

        def task(index: int) -> None:
            try:
                FaultyTaskLoop(cloudpickle.loads(shipped), index, self.harness).run()
            except BaseException as exc:  # the run's failure: the driver hears of it
                errors.append(exc)

        threads = [
            threading.Thread(target=task, args=(i,), daemon=True) for i in range(len(launch.roles))
        ]
        for t in threads:
            t.start()

        def join() -> None:
            for t in threads:
                t.join()
            run.ended(errors[0] if errors else None)

        threading.Thread(target=join, daemon=True).start()
        self.harness.runs += 1

    def cancel(self, run: Run) -> None:
        pass  # closing the run's connections ends its tasks


class LongRunningInProcess:
    """A ``run_epoch_job`` that runs each epoch on long-running tasks in this process."""

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, seed: int = 0, faults: Faults | None = None
    ) -> None:
        self.rng = random.Random(seed)
        self.faults = faults or Faults()
        self.seen: Counter[str] = Counter()
        self.runs = 0  # runs launched
        self.disk_lost = ""  # the local state directory the failed run's executor lost
        self.tasks = LongRunningTasks(ThreadTasks(self), loopback=True, driver_host="127.0.0.1")
        _commit_fault(monkeypatch)

    def __call__(
        self,
        spark: Any,
        spec: EpochSpec,
        group: str,
        description: str,
        placement: Callable[[str, int], list[str]] | None = None,
    ) -> list[Report]:
        try:
            return self.tasks.run_epoch(spec, group, description, placement)
        finally:  # the run ended: none of its tasks uses the disk any more
            if self.disk_lost:
                shutil.rmtree(self.disk_lost, ignore_errors=True)
                warm.clear()
                self.disk_lost = ""

    def close(self) -> None:
        self.tasks.stop()


def _commit_fault(monkeypatch: pytest.MonkeyPatch) -> None:
    """``KeyedBackend.commit`` fails in a task thread marked to die as it commits (once per
    test: hypothesis's examples share the monkeypatch)."""
    original = KeyedBackend.commit
    if getattr(original, "faulty", False):
        return

    def commit(self: KeyedBackend, epoch: int, watermark: int) -> Any:
        if getattr(_dying, "commit", False):
            raise InjectedFailure(f"injected: the task dies as it commits epoch {epoch}")
        return original(self, epoch, watermark)

    commit.faulty = True  # type: ignore[attr-defined]
    monkeypatch.setattr(KeyedBackend, "commit", commit)
