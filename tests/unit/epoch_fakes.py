"""The driver's epoch loop without Spark: ``run_epoch_job`` replaced by a fake that reports
what the tasks of a one-source, one-keyed-subtask, one-sink job would (positions, a state
report with a checkpoint snapshot or a checkpoint error, a staged sink part)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stator import Job
from stator.api.pipeline import Pipeline
from stator.checkpoint.metadata import RemoteFile, SubtaskSnapshot
from stator.config import load_config
from stator.driver import epoch_loop
from stator.epoch.reports import SinkReport, SplitReport, StateReport
from stator.sinks.base import Sink
from stator.sources.generator import list_source

SUM = "xxh3:0123456789abcdef"  # a stored file's checksum (its bytes are never read here)


class RecordingSink(Sink):
    """Remembers which epochs were committed and what was discarded."""

    def __init__(self) -> None:
        self.commits: list[int] = []
        self.discards: list[int] = []

    def writer(self, uid: str, epoch: int, part: str) -> Any:
        raise NotImplementedError("the fake job stages nothing")

    def commit(self, uid: str, epoch: int, parts: list[Any], payloads: list[Any]) -> None:
        self.commits.append(epoch)

    def discard_after(self, uid: str, epoch: int) -> None:
        self.discards.append(epoch)


def build(tmp: Path, records: int, *config: str) -> tuple[epoch_loop.RegionLoop, RecordingSink]:
    """The one region loop of a job reading ``records`` records, 2 per epoch."""
    sink = RecordingSink()
    p = Pipeline("job", max_parallelism=8)
    (
        p.source(list_source(list(range(records)), splits=1), uid="src")
        .key_by(lambda x: x)
        .count(uid="cnt", parallelism=1)
        .sink(sink, uid="out")
    )
    cfg = load_config(
        None,
        [
            f"checkpoint.storage=file://{tmp}/ck",
            f"savepoint.dir=file://{tmp}/sp",
            f"state.local_dir={tmp}/state",
            "epoch.max_records=2",
            "epoch.idle_wait_ms=1",
            "restart.delay_ms=1",
            *config,
        ],
    )
    (loop,) = Job(p, cfg).loops
    return loop, sink


Behaviour = Callable[[Any], dict[str, Any]]


def fake_job(driver: epoch_loop.RegionLoop, behaviour: Behaviour) -> Callable[..., list[Any]]:
    """A ``run_epoch_job``: ``behaviour(spec)`` may return ``{"raise": exc}`` (the epoch
    fails) or ``{"checkpoint_error": text}`` (the subtask declines the checkpoint)."""
    store = driver.store
    counter = itertools.count()

    def run(spark: Any, spec: Any, group: Any, description: Any, placement: Any = None) -> Any:
        b = behaviour(spec)
        if b.get("raise"):
            raise b["raise"]
        reports: list[Any] = [
            SplitReport(uid, r.split, spec.epoch, 0, int(r.end) - int(r.start))
            for uid, ranges in spec.ranges.items()
            for r in ranges
        ]
        snap, error = None, None
        if spec.checkpoint is not None:
            error = b.get("checkpoint_error")
            if error is None:
                key = f"shared/cnt/{next(counter):04d}-000001.sst"
                store.put(key, b"x" * 10)
                files = (RemoteFile("000001.sst", key, 10, True, checksum=SUM),)
                snap = SubtaskSnapshot(0, 1, (0, 8), spec.epoch, files, 10, f"c{spec.epoch}")
        reports.append(
            StateReport("cnt", 0, spec.epoch, 0, 0, 0, snap, error, None, commit=f"c{spec.epoch}")
        )
        reports.append(SinkReport("out", spec.epoch, {"part": "cnt-0", "records": 1}, None))
        return reports

    return run
