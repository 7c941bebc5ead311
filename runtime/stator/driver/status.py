"""What a running job shows: its state, counters and recent checkpoint outcomes. Written by
the epoch loop, read (never blocked on) by the control API, the CLI and metrics."""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from ..checkpoint.coordinator import now_ms
from ..checkpoint.metadata import CheckpointMetadata
from ..checkpoint.pending import CheckpointResult
from ..epoch.reports import RestoreSource, StandbyTally, StateReport
from ..keygroups import SubtaskId
from ..locality.placement import EpochPlacement
from ..sources.base import SplitLag
from .checkpoint_health import HealthReport
from .job_metrics import JobMetrics

log = logging.getLogger("stator.driver")


def process_started_ms() -> int | None:
    """When this process started (epoch ms), from /proc; None where there is no /proc."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        boot = next(
            int(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        return int((boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")) * 1000)
    except (OSError, ValueError, IndexError, StopIteration):
        return None


@dataclass
class StartupTimes:
    """Wall-clock marks (epoch ms, None until reached) of this driver's start-up: the
    operator splits an upgrade's or rescale's downtime by them."""

    process_started_ms: int | None = field(default_factory=process_started_ms)
    driver_started_ms: int | None = None  # the job driver runs: imports and pipeline loaded
    # A pre-started driver (``--await-handover``) was told what to restore from; the marks
    # before it were taken while the old driver still ran.
    handover_ms: int | None = None
    spark_ready_ms: int | None = None  # the SparkSession (and its executors) is up
    recovered_ms: int | None = None  # the checkpoint or savepoint to start from is read
    first_epoch_ms: int | None = None  # the first epoch (with the state restore) ended
    # Before any epoch, a plan found nothing to read: nothing has waited for it since.
    caught_up_ms: int | None = None

    def to_json(self) -> dict[str, int | None]:
        return dataclasses.asdict(self)


class JobState(StrEnum):
    CREATED = "CREATED"
    STANDBY = "STANDBY"  # pre-started, waiting for its hand-over (driver/handover.py)
    RECOVERING = "RECOVERING"
    RUNNING = "RUNNING"
    FINISHED = "FINISHED"  # every bounded source is exhausted and committed
    STOPPED = "STOPPED"  # stopped with a savepoint
    FAILED = "FAILED"  # the restart strategy gave up, or the failure cannot be retried

    @property
    def ended(self) -> bool:
        return self in (JobState.FINISHED, JobState.STOPPED, JobState.FAILED)


@dataclass
class RestoreCounts:
    """Subtask restores since the driver started, by where the state came from."""

    local: int = 0
    remote: int = 0
    local_bytes: int = 0
    remote_bytes: int = 0

    def add(self, source: RestoreSource, local_bytes: int, remote_bytes: int) -> None:
        if source == RestoreSource.LOCAL:
            self.local += 1
        else:
            self.remote += 1
        self.local_bytes += local_bytes
        self.remote_bytes += remote_bytes

    def to_json(self) -> dict[str, int]:
        return {
            "local": self.local,
            "remote": self.remote,
            "local_bytes": self.local_bytes,
            "remote_bytes": self.remote_bytes,
        }


@dataclass
class StandbyCopies:
    """Standby copies made for this driver's job, from each uploader's newest tally."""

    tallies: dict[str, StandbyTally] = field(default_factory=dict)  # uploader -> tally

    def note(self, tally: StandbyTally | None) -> None:
        """Replaces the dict instead of changing it: the orders' thread calls this while the
        control API reads it."""
        if tally is not None and tally.newer_than(self.tallies.get(tally.uploader)):
            self.tallies = {**self.tallies, tally.uploader: tally}

    def merge(self, other: StandbyCopies) -> None:
        for tally in other.tallies.values():
            self.note(tally)

    def to_json(self) -> dict[str, int]:
        tallies = self.tallies.values()
        return {
            "copies": sum(t.copies for t in tallies),
            "bytes": sum(t.bytes for t in tallies),
            "failed": sum(t.failed for t in tallies),
        }


@dataclass
class JobStatus:
    job: str
    epoch: int = 0
    records_in: int = 0
    records_out: int = 0
    checkpoints: int = 0
    failed_checkpoints: int = 0
    # Checkpoints taken whose uploads are not confirmed yet (asynchronous uploads), oldest first.
    in_flight_checkpoints: tuple[int, ...] = ()
    restarts: int = 0
    last_checkpoint: CheckpointMetadata | None = None
    last_error: str | None = None
    started_ms: int = field(default_factory=now_ms)
    state: JobState = JobState.CREATED
    stopped_with_savepoint: str | None = None
    restores: RestoreCounts = field(default_factory=RestoreCounts)
    standby_copies: StandbyCopies = field(default_factory=StandbyCopies)
    # Keyed tasks that ran on the executor holding their local state, of those placed
    # (only with several executors: local-cluster or k8s).
    keyed_tasks_local: int = 0
    keyed_tasks_total: int = 0
    last_placement: EpochPlacement | None = None
    # (uid, subtask) -> the latest restore of that subtask, for the control API.
    last_restores: dict[SubtaskId, dict[str, Any]] = field(default_factory=dict)
    startup: StartupTimes = field(default_factory=StartupTimes)
    # Source uid -> split -> lag, as measured when the latest epoch was planned, and when
    # (epoch ms): during a long epoch the lag is that old.
    source_lag: dict[str, dict[str, SplitLag]] = field(default_factory=dict)
    source_lag_ms: int | None = None
    # Source uid -> records its decoder rejected to a dead-letter sink.
    dead_letters: dict[str, int] = field(default_factory=dict)
    # Per operator and subtask: records, latency, busy ratio, state bytes (one object for
    # every region of a job: job.py).
    metrics: JobMetrics = field(default_factory=JobMetrics)
    # Its checkpoint health now (``checkpoint_health.py``; a region's loop sets it, the
    # control API calls it from its thread). The default: a job without checkpoint rules.
    checkpoint_health: Callable[[], HealthReport] = HealthReport
    # Waiting out a restart delay or rewinding after a failure: not processing.
    restarting: bool = False

    @property
    def finished(self) -> bool:
        return self.state is JobState.FINISHED

    def keyed_tasks_done(
        self, epoch: int, states: list[StateReport], placement: EpochPlacement | None
    ) -> None:
        """Count an epoch's restores (by source and bytes), its task placement and the
        standby copies its executors made; log the restores, and the tasks that ran away
        from their local state."""
        for s in states:
            self.standby_copies.note(s.standby)
            r = s.restore
            if not r.restored:
                continue
            log.info(
                "epoch %d: operator '%s' subtask %d restored %s from %s "
                "(%d bytes local, %d bytes from the object store, %d ms)%s%s%s",
                epoch,
                s.uid,
                s.subtask,
                "the savepoint" if r.savepoint else f"checkpoint {r.checkpoint_id}",
                r.source,
                r.local_bytes,
                r.remote_bytes,
                r.duration_ms,
                f" on executor {s.executor}" if s.executor else "",
                f" (node {s.node})" if s.node else "",
                f"; not local: {r.fallback}" if r.fallback else "",
            )
            self.restores.add(r.source, r.local_bytes, r.remote_bytes)
            self.last_restores[SubtaskId(s.uid, s.subtask)] = {
                "operator": s.uid,
                "subtask": s.subtask,
                "epoch": epoch,
                "checkpoint_id": r.checkpoint_id,
                "savepoint": r.savepoint,
                "source": r.source,
                "local_bytes": r.local_bytes,
                "remote_bytes": r.remote_bytes,
                "duration_ms": r.duration_ms,
                "fallback": r.fallback,
                "executor": s.executor,
                "host": s.host,
                "node": s.node,
            }
        if placement is not None:
            self.last_placement = placement
            self.keyed_tasks_local += placement.local
            self.keyed_tasks_total += placement.total
            if placement.local < placement.total:
                log.info(
                    "epoch %d: %d of %d keyed tasks ran where their local state is",
                    epoch,
                    placement.local,
                    placement.total,
                )


@dataclass(frozen=True)
class CheckpointOutcome:
    """One checkpoint attempt, as the control API lists it."""

    id: int
    epoch: int
    status: CheckpointResult
    at_ms: int
    state_bytes: int = 0
    incremental_bytes: int = 0
    duration_ms: int = 0
    error: str | None = None
    region: str | None = None  # in a job of several failover regions

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "epoch": self.epoch,
            "status": self.status,
            "at_ms": self.at_ms,
            "state_bytes": self.state_bytes,
            "incremental_bytes": self.incremental_bytes,
            "duration_ms": self.duration_ms,
        }
        if self.error is not None:
            out["error"] = self.error
        if self.region is not None:
            out["region"] = self.region
        return out


class CheckpointHistory:
    """The most recent checkpoint outcomes (thread-safe: appended by the loop, read by HTTP)."""

    def __init__(self, size: int = 50) -> None:
        self._items: deque[CheckpointOutcome] = deque(maxlen=size)
        self._lock = threading.Lock()

    def completed(self, meta: CheckpointMetadata) -> None:
        self._add(
            CheckpointOutcome(
                meta.checkpoint_id,
                meta.epoch,
                CheckpointResult.COMPLETED,
                meta.created_ms,
                meta.state_bytes,
                meta.incremental_bytes,
                meta.duration_ms,
            )
        )

    def failed(self, checkpoint_id: int, epoch: int, error: str) -> None:
        self._add(
            CheckpointOutcome(
                checkpoint_id, epoch, CheckpointResult.FAILED, now_ms(), error=error[:500]
            )
        )

    def _add(self, item: CheckpointOutcome) -> None:
        with self._lock:
            self._items.append(item)

    def items(self) -> list[CheckpointOutcome]:
        with self._lock:
            return list(self._items)
