"""The control API's answers (``schema.py``) out of a running job's view: the one place where
the driver's status objects and region views become the API's schema."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..api.nodes import KeyedNode, Node, Route, TransformNode
from ..api.time import MAX_TIMESTAMP
from ..checkpoint.metadata import CheckpointMetadata
from ..driver.checkpoint_health import HealthReport
from ..driver.job_metrics import KEYED, MetricsView, OperatorMetrics, SubtaskEpoch
from ..driver.savepoints import SavepointRequest as DriverSavepointRequest
from ..driver.status import JobState, JobStatus
from ..epoch.histogram import BOUNDS_MS, Histogram
from ..keygroups import range_for_subtask
from .schema import (
    CheckpointAttempt,
    CheckpointCounts,
    CheckpointHealthInfo,
    CheckpointsInfo,
    CheckpointSummary,
    EpochLocality,
    GraphNode,
    HistogramInfo,
    HistoryInfo,
    JobGraph,
    JobInfo,
    MetricsInfo,
    OperatorMetricsInfo,
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
    SubtaskMetricsInfo,
)
from .view import JobView

if TYPE_CHECKING:
    from .timeline import Timeline


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
        lag_at_ms=st.source_lag_ms,
        metrics=metrics_info(st.metrics.view()),
        graph=job_graph(d),
        checkpoint_health=checkpoint_health(st.checkpoint_health()),
    )


def job_graph(d: JobView) -> JobGraph:
    """The job's graph with each node's failover region, and each keyed operator's
    parallelism and key groups per subtask."""
    p = d.parallelism
    region_of = {label: r.id for r in d.pipeline.split() for label in r.pipeline.regions()[0]}

    def node(n: Node) -> GraphNode:
        label = getattr(n, "uid", None) or n.name
        subtasks = p.operators.get(label) if isinstance(n, KeyedNode) else None
        keyed = isinstance(n, KeyedNode) and n.route(0) is Route.KEYED and subtasks is not None
        return GraphNode(
            id=n.id,
            label=label,
            kind=_kind(n),
            inputs=tuple(n.inputs),
            region=region_of.get(label, ""),
            parallelism=subtasks,
            key_groups=_key_groups(subtasks, p.max_parallelism) if keyed and subtasks else (),
            pinned=label in p.pinned,
        )

    return JobGraph(nodes=tuple(node(n) for n in d.pipeline.nodes))


def _key_groups(parallelism: int, max_parallelism: int) -> tuple[tuple[int, int], ...]:
    ranges = (range_for_subtask(i, parallelism, max_parallelism) for i in range(parallelism))
    return tuple((r.start, r.end) for r in ranges)


def _kind(n: Node) -> str:
    """``map``, ``filter``, ... for a transform; else the node's class: ``SourceNode`` ->
    ``source``, ``CoProcessNode`` -> ``co_process``."""
    if isinstance(n, TransformNode):
        return n.kind
    name = type(n).__name__.removesuffix("Node")
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def history_info(d: JobView, timeline: Timeline) -> HistoryInfo:
    """``GET /v1/history``."""
    return HistoryInfo(
        samples=timeline.time_series(),
        epochs=timeline.epochs(),
        epochs_capacity=timeline.epochs_capacity,
        checkpoints=tuple(CheckpointAttempt.from_wire(h.to_json()) for h in d.history.items()),
        failovers=timeline.failovers(),
    )


def metrics_info(view: MetricsView) -> MetricsInfo:
    """The ``metrics`` of ``GET /v1/job``."""
    operators = {uid: _operator_metrics(op) for uid, op in sorted(view.operators.items())}
    busiest = view.busiest()
    delays = [d for op in view.operators.values() if (d := op.event_time_delay_ms) is not None]
    committed = view.latency(committed=True)
    return MetricsInfo(
        epoch_duration=histogram_info(view.epochs),
        operators=operators,
        processing_latency_p99_ms=round(view.latency().quantile(0.99)),
        committed_latency_p99_ms=round(committed.quantile(0.99)),
        max_busy_ratio=round(busiest[2].busy_ratio, 4) if busiest else 0.0,
        busiest_subtask=f"{busiest[0]}/{busiest[1]}" if busiest else None,
        event_time_delay_ms=max(delays, default=None),
    )


def histogram_info(h: Histogram) -> HistogramInfo:
    return HistogramInfo(
        le_ms=BOUNDS_MS,
        counts=tuple(h.counts),
        count=h.count,
        sum_ms=round(h.sum_ms),
        p50_ms=round(h.quantile(0.5)),
        p99_ms=round(h.quantile(0.99)),
    )


def _operator_metrics(op: OperatorMetrics) -> OperatorMetricsInfo:
    subtasks = []
    for i in sorted(set(op.latest) | set(op.state_bytes)):
        latest, totals = op.latest.get(i), op.totals.get(i)
        subtasks.append(
            SubtaskMetricsInfo(
                subtask=i,
                state_bytes=op.state_bytes.get(i, 0),
                **(_latest(latest) if latest else {}),
                **(
                    {
                        "records_in_total": totals.records_in,
                        "records_out_total": totals.records_out,
                        "busy_ms_total": round(totals.busy_s * 1000),
                    }
                    if totals
                    else {}
                ),
            )
        )
    keyed = op.kind == KEYED
    return OperatorMetricsInfo(
        kind=op.kind,
        records_in=op.records_in,
        records_out=op.records_out,
        watermark_ms=op.watermark,
        event_time_delay_ms=op.event_time_delay_ms,
        state_bytes=sum(op.state_bytes.values()),
        processing_latency=histogram_info(op.latency) if keyed else None,
        committed_latency=histogram_info(op.committed) if op.committed.count else None,
        subtasks=tuple(subtasks),
    )


def _latest(s: SubtaskEpoch) -> dict[str, Any]:
    mark = s.watermark
    return {
        "epoch": s.epoch,
        "records_in": s.records_in,
        "records_out": s.records_out,
        "busy_ms": round(s.busy_s * 1000),
        "epoch_ms": round(s.epoch_s * 1000),
        "busy_ratio": round(s.busy_ratio, 4),
        "true_rate": round(s.true_rate, 1),
        "watermark_ms": mark if 0 <= mark < MAX_TIMESTAMP else None,
    }


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
