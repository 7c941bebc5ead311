"""The control API's answers (``schema.py``) out of a running job's view: the one place where
the driver's status objects and region views become the API's schema."""

from __future__ import annotations

from dataclasses import replace

from ..checkpoint.metadata import CheckpointMetadata
from ..driver.checkpoint_health import HealthReport
from ..driver.savepoints import SavepointRequest as DriverSavepointRequest
from ..driver.status import JobState, JobStatus
from ..keygroups import range_for_subtask
from .schema import (
    CheckpointAttempt,
    CheckpointCounts,
    CheckpointHealthInfo,
    CheckpointsInfo,
    CheckpointSummary,
    EpochLocality,
    JobInfo,
    PlacedSubtask,
    Placement,
    Readiness,
    RegionInfo,
    RegionStorage,
    RestoreEntry,
    Restores,
    SavepointRequest,
    SourceInfo,
    SplitLagInfo,
    StandbyCopies,
    StartupMarks,
)
from .view import JobView


def job_info(d: JobView, st: JobStatus) -> JobInfo:
    """``GET /v1/job`` (``st``: the job's status, read once)."""
    latest, restored = st.last_checkpoint, st.last_restores
    sources = source_infos(st)
    return JobInfo(
        job=d.job,
        state=st.state,
        epoch=st.epoch,
        max_parallelism=d.parallelism.max_parallelism,
        parallelism=dict(d.parallelism.operators),
        regions=tuple(RegionInfo.from_wire(r) for r in d.region_views()),
        records_in=st.records_in,
        records_out=st.records_out,
        restarts=st.restarts,
        checkpoints=CheckpointCounts(completed=st.checkpoints, failed=st.failed_checkpoints),
        latest_checkpoint=checkpoint_summary(latest) if latest else None,
        last_error=st.last_error,
        started_ms=st.started_ms,
        startup=StartupMarks.from_wire(st.startup.to_json()),
        stopped_with_savepoint=st.stopped_with_savepoint,
        restores=Restores(
            **st.restores.to_json(),
            latest=tuple(RestoreEntry.from_wire(st.last_restores[k]) for k in sorted(restored)),
        ),
        placement=_placement(d, st),
        standby_copies=StandbyCopies(**st.standby_copies.to_json()),
        sources=sources,
        lag_records=sum(s.lag_records for s in sources.values()),
        lag_ms=max((s.lag_ms for s in sources.values()), default=0),
        checkpoint_health=checkpoint_health(st.checkpoint_health()),
    )


def checkpoint_health(h: HealthReport) -> CheckpointHealthInfo:
    return CheckpointHealthInfo(
        healthy=h.healthy,
        consecutive_failures=h.consecutive_failures,
        tolerable_failures=None if h.tolerable_failures < 0 else h.tolerable_failures,
        progress_window_ms=h.progress_window_ms,
        waiting_ms=h.waiting_ms,
        failovers=h.failovers,
        last_failover=h.last_failover,
        last_failover_ms=h.last_failover_ms,
        problem=h.problem,
    )


def readiness(st: JobStatus) -> Readiness:
    """``GET /readyz``: processing and checkpointing. Not ready before the job runs, after it
    ended, while it waits out a restart or rewinds, and while its checkpoints are unhealthy
    (it is about to fail over, or cannot: an epoch is still running). An idle job (no input)
    processes: its epochs wait for input, and nothing waits for a checkpoint."""
    if st.state is not JobState.RUNNING:
        return Readiness(ready=False, state=st.state, reason=f"the job is {st.state}")
    if st.restarting:
        why = f": {st.last_error}" if st.last_error else ""
        reason = f"the job is restarting after a failure{why}"
        return Readiness(ready=False, state=st.state, reason=reason[:1000])
    problem = st.checkpoint_health().problem
    if problem is not None:
        return Readiness(ready=False, state=st.state, reason=problem[:1000])
    return Readiness(ready=True, state=st.state)


def source_infos(st: JobStatus) -> dict[str, SourceInfo]:
    """Lag per source and split (sources that measure it) and dead letters per source."""
    out = {}
    for uid in sorted(set(st.source_lag) | set(st.dead_letters)):
        splits = {
            split: SplitLagInfo(records=lag.records, lag_ms=round(lag.seconds * 1000))
            for split, lag in sorted(st.source_lag.get(uid, {}).items())
        }
        out[uid] = SourceInfo(
            splits=splits,
            lag_records=sum(s.records for s in splits.values()),
            lag_ms=max((s.lag_ms for s in splits.values()), default=0),
            dead_letters=st.dead_letters.get(uid, 0),
        )
    return out


def checkpoints_info(d: JobView) -> CheckpointsInfo:
    """``GET /v1/checkpoints``."""
    retained = tuple(checkpoint_summary(m) for m in d.retained_checkpoints())
    regions = tuple(RegionInfo.from_wire(v) for v in d.region_views())
    return CheckpointsInfo(
        storage=d.store.uri,
        latest=retained[-1] if retained else None,
        retained=retained,
        history=tuple(CheckpointAttempt.from_wire(h.to_json()) for h in d.history.items()),
        in_flight=tuple(d.status.in_flight_checkpoints),
        regions=tuple(
            RegionStorage(id=r.id, storage=r.storage, latest_checkpoint=r.latest_checkpoint)
            for r in regions
        ),
        counts=CheckpointCounts(completed=d.status.checkpoints, failed=d.status.failed_checkpoints),
    )


def savepoint_request(request: DriverSavepointRequest) -> SavepointRequest:
    return SavepointRequest.from_wire(request.to_json())


def checkpoint_summary(meta: CheckpointMetadata) -> CheckpointSummary:
    return CheckpointSummary(
        id=meta.checkpoint_id,
        epoch=meta.epoch,
        created_ms=meta.created_ms,
        state_bytes=meta.state_bytes,
        incremental_bytes=meta.incremental_bytes,
        duration_ms=meta.duration_ms,
        incremental=meta.incremental,
    )


def _placement(d: JobView, st: JobStatus) -> Placement | None:
    """Where keyed subtasks run; None with one executor (local[*]: no placement)."""
    if d.placement is None:
        return None
    last, latest = st.last_placement, st.last_checkpoint
    max_p = d.parallelism.max_parallelism

    def placed(entry: dict[str, object]) -> PlacedSubtask:
        s = PlacedSubtask.from_wire(entry)
        r = range_for_subtask(s.subtask, s.parallelism, max_p)
        # Each subtask keeps its local copy of the latest completed checkpoint.
        checkpoint_id = latest.checkpoint_id if latest else None
        return replace(s, key_groups=(r.start, r.end), checkpoint_id=checkpoint_id)

    return Placement(
        keyed_tasks_local=st.keyed_tasks_local,
        keyed_tasks=st.keyed_tasks_total,
        last_epoch=EpochLocality(local=last.local, total=last.total) if last else None,
        subtasks={
            uid: tuple(placed(e) for e in entries) for uid, entries in d.placement.to_json().items()
        },
    )
