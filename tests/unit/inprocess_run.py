"""Run a whole pipeline through the real driver loop without Spark (``inprocess_job.py`` runs
the real tasks in this process), to the end of its finite sources: for tests of what a
pipeline computes (operators, joins, side outputs) that need no cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from stator import EpochResult, Job
from stator.api.pipeline import Pipeline
from stator.config import load_config
from stator.driver import epoch_loop
from stator.driver.savepoints import SavepointRequest
from tests.unit.inprocess_job import InProcessJob
from tests.unit.inprocess_longrun import LongRunningInProcess


def settings(root: Path, *extra: str) -> list[str]:
    """Checkpoints, savepoints and local state under ``root``; small epochs, no waiting."""
    return [
        f"checkpoint.storage=file://{root}/ck",
        f"savepoint.dir=file://{root}/sp",
        f"state.local_dir={root}/state",
        "epoch.idle_wait_ms=1",
        "restart.delay_ms=0",
        "restart.attempts=20",
        "checkpoint.async_upload=false",
        *extra,
    ]


def run_in_process(
    pipeline: Pipeline,
    root: Path,
    monkeypatch: pytest.MonkeyPatch,
    *config: str,
    harness: InProcessJob | LongRunningInProcess | None = None,
    stop_after_epoch: int | None = None,
    long_running: bool = False,
) -> Job:
    """Run ``pipeline`` (one failover region or several, one after another) until its sources
    are exhausted, or until ``stop_after_epoch`` ended and a stop-with-savepoint (one region)
    completed (its location: :func:`stopped_with`); ``config``: job config lines over
    :func:`settings`; ``long_running``: epochs on long-running tasks
    (``inprocess_longrun.py``) unless a ``harness`` is given."""
    if harness is None:
        harness = LongRunningInProcess(monkeypatch) if long_running else InProcessJob()
    monkeypatch.setattr(epoch_loop, "run_epoch_job", harness)
    job = Job(pipeline, load_config(None, settings(root, *config)))
    if stop_after_epoch is not None:
        requests: list[SavepointRequest] = []

        def stop(result: EpochResult) -> None:
            if result.epoch == stop_after_epoch and not requests:
                requests.append(job.request_savepoint(stop=True))

        job.on_epoch(stop)
        _STOPS[id(job)] = requests
    plan = job.check_restore_source()
    for loop in job.loops:
        try:
            loop.recovery.start(plan.get(loop.region))
            loop._loop()
        finally:
            loop.checkpoints.in_flight.abort_all("the run ended")
            if isinstance(harness, LongRunningInProcess):
                harness.tasks.stop()
    return job


_STOPS: dict[int, list[SavepointRequest]] = {}


def stopped_with(job: Job) -> str:
    """Where the stop-with-savepoint of a :func:`run_in_process` run wrote its savepoint."""
    (request,) = _STOPS.pop(id(job))
    assert request.status == "COMPLETED", request.error
    return str(request.location)


def list_epochs(sizes: list[int], max_records: int) -> list[list[tuple[int, int]]]:
    """The records each epoch reads of sources of one split each (``list_source``) of these
    sizes: ``[(start, end) per source]`` per epoch. ``epoch.max_records`` is shared by the
    sources still reading; a source is done after the epoch that read its last record (an
    empty one after the first epoch)."""
    done = [0] * len(sizes)
    open_ = [True] * len(sizes)
    epochs: list[list[tuple[int, int]]] = []
    while any(open_):
        budget = max(1, max_records // sum(open_))
        ranges = []
        for i, size in enumerate(sizes):
            if not open_[i]:
                ranges.append((done[i], done[i]))
                continue
            end = min(size, done[i] + budget)
            ranges.append((done[i], end))
            done[i] = end
            open_[i] = end < size
        epochs.append(ranges)
    return epochs
