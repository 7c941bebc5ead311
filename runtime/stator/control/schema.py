"""The control API's answers (docs/control-api.md), written once: the server builds them, the
client reads them (``from_wire`` refuses what does not fit, ``wire.py``), and the operator
mirrors parts of them into a pipeline's status under the camelCase of their field names
(``mirror``). Standard library only, as the client: the operator image needs nothing more.

A field without a default is required in an answer; one with a default may be missing (the
operator reads it as that default). The server always sends every field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Self

from .wire import OMIT_NONE, Json, camel, from_wire, to_wire


class Answer:
    """What every answer can do: be written as JSON data, and be read from it."""

    def to_wire(self) -> dict[str, Json]:
        data = to_wire(self)
        assert isinstance(data, dict)
        return data

    @classmethod
    def from_wire(cls, obj: object) -> Self:
        return from_wire(cls, obj)


def mirror(part: object, *names: str) -> dict[str, Json]:
    """The fields ``names`` of ``part`` under their camelCase names, as JSON data: how the
    operator copies a driver's answer into a pipeline's status."""
    return {camel(name): to_wire(getattr(part, name)) for name in names}


@dataclass(frozen=True, kw_only=True)
class Health(Answer):
    """``GET /healthz``: the process serves."""

    status: str


@dataclass(frozen=True, kw_only=True)
class Readiness(Answer):
    """``GET /readyz`` (503 unless ready, with the same body): ready while the job processes
    (RUNNING, not restarting after a failure; idle without input counts) and its checkpoints
    are healthy (``CheckpointHealthInfo``)."""

    ready: bool
    state: str  # CREATED, STANDBY, RECOVERING, RUNNING, FINISHED, STOPPED, FAILED
    reason: str | None = field(default=None, metadata=OMIT_NONE)  # why it is not ready


@dataclass(frozen=True, kw_only=True)
class CheckpointHealthInfo(Answer):
    """The job's checkpoint health (``checkpoint.tolerable_failures``,
    ``checkpoint.progress_window_ms``): unhealthy, it fails over to its latest checkpoint."""

    healthy: bool = True
    consecutive_failures: int = 0  # failed in a row (those aborted by a failover not counted)
    tolerable_failures: int | None = None  # None: no limit
    progress_window_ms: int = 0  # 0: off
    waiting_ms: int = 0  # how long the oldest epoch's output has waited for a checkpoint
    failovers: int = 0  # failovers these rules caused since the driver started
    last_failover: str | None = None  # the reason of the latest
    last_failover_ms: int | None = None
    problem: str | None = None  # why it is unhealthy now


@dataclass(frozen=True, kw_only=True)
class CheckpointCounts(Answer):
    completed: int = 0
    failed: int = 0


@dataclass(frozen=True, kw_only=True)
class CheckpointSummary(Answer):
    """A completed checkpoint (the job's latest, and each retained one)."""

    id: int
    epoch: int
    created_ms: int
    state_bytes: int
    incremental_bytes: int
    duration_ms: int
    incremental: bool


@dataclass(frozen=True, kw_only=True)
class RegionCheckpoint(Answer):
    """A region's latest completed checkpoint."""

    id: int
    epoch: int
    created_ms: int


@dataclass(frozen=True, kw_only=True)
class SplitInfo(Answer):
    """A source split that failed over on its own (a job without keyed operators)."""

    source: str
    split: str
    restarts: int
    state: str  # RUNNING or RESTARTING
    last_error: str | None = None


@dataclass(frozen=True, kw_only=True)
class RegionInfo(Answer):
    """One failover region (a job run by one driver lists its regions with the job's state)."""

    id: str  # the region's smallest source uid
    state: str
    epoch: int
    restarts: int
    nodes: tuple[str, ...] = ()
    records_in: int = 0
    records_out: int = 0
    checkpoints: CheckpointCounts = field(default_factory=CheckpointCounts)
    latest_checkpoint: RegionCheckpoint | None = None
    last_error: str | None = None
    storage: str = ""  # where its checkpoints are
    splits: tuple[SplitInfo, ...] = ()
    # Executors lost with the region in them (a job of several regions only).
    lost_executors: tuple[str, ...] | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True, kw_only=True)
class StartupMarks(Answer):
    """Wall-clock marks (epoch ms, None until reached) of the driver's start-up."""

    process_started_ms: int | None = None
    driver_started_ms: int | None = None
    handover_ms: int | None = None  # a pre-started driver was told what to restore
    spark_ready_ms: int | None = None
    recovered_ms: int | None = None
    first_epoch_ms: int | None = None
    caught_up_ms: int | None = None  # before any epoch, it found nothing to read

    @property
    def processing_ms(self) -> int | None:
        """When the driver began processing: it found nothing to read before any epoch (no
        input waited for it), else its first epoch ended; None before either."""
        return self.caught_up_ms or self.first_epoch_ms


@dataclass(frozen=True, kw_only=True)
class RestoreEntry(Answer):
    """The latest restore of one subtask."""

    operator: str
    subtask: int
    checkpoint_id: int
    source: str  # local or remote
    local_bytes: int
    remote_bytes: int
    epoch: int = 0
    savepoint: bool = False
    duration_ms: int = 0
    fallback: str | None = None  # why a local copy was not used
    executor: str | None = None
    host: str | None = None
    node: str | None = ""


@dataclass(frozen=True, kw_only=True)
class Restores(Answer):
    """Subtask restores since the driver started, and the latest one per subtask."""

    local: int = 0
    remote: int = 0
    local_bytes: int = 0
    remote_bytes: int = 0
    latest: tuple[RestoreEntry, ...] = ()


@dataclass(frozen=True, kw_only=True)
class StandbyHolder(Answer):
    executor: str
    node: str | None = None


@dataclass(frozen=True, kw_only=True)
class PlacedSubtask(Answer):
    """Where one keyed subtask runs, which key groups it holds, and its local checkpoint."""

    subtask: int
    parallelism: int
    executor: str
    host: str | None = None
    node: str | None = ""
    standby: StandbyHolder | None = field(default=None, metadata=OMIT_NONE)
    key_groups: tuple[int, int] | None = None  # [start, end)
    checkpoint_id: int | None = None


@dataclass(frozen=True, kw_only=True)
class EpochLocality(Answer):
    local: int
    total: int


@dataclass(frozen=True, kw_only=True)
class Placement(Answer):
    """Where keyed subtasks run (only with several executors)."""

    keyed_tasks_local: int = 0
    keyed_tasks: int = 0
    last_epoch: EpochLocality | None = None
    subtasks: Mapping[str, tuple[PlacedSubtask, ...]] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class StandbyCopies(Answer):
    """What ``local_recovery.standby``'s copies read from the object store."""

    copies: int = 0
    bytes: int = 0
    failed: int = 0


@dataclass(frozen=True, kw_only=True)
class SplitLagInfo(Answer):
    """A source split's consumer lag when the latest epoch was planned: ``records`` not yet
    read, ``lag_ms`` from the timestamp of the next unread record to then (0: caught up)."""

    records: int = 0
    lag_ms: int = 0


@dataclass(frozen=True, kw_only=True)
class SourceInfo(Answer):
    """One source: its lag per split and in total, and records sent to dead letters."""

    splits: Mapping[str, SplitLagInfo] | None = None
    lag_records: int = 0  # the sum over the splits
    lag_ms: int = 0  # the largest over the splits
    dead_letters: int = 0


@dataclass(frozen=True, kw_only=True)
class HistogramInfo(Answer):
    """A duration histogram since the driver started: ``counts`` per bucket, whose upper
    bounds are ``le_ms`` (the last count: above the last bound), their ``count`` and
    ``sum_ms``, and quantiles estimated from the buckets."""

    le_ms: tuple[int, ...] = ()
    counts: tuple[int, ...] = ()
    count: int = 0
    sum_ms: int = 0
    p50_ms: int = 0
    p99_ms: int = 0


@dataclass(frozen=True, kw_only=True)
class SubtaskMetricsInfo(Answer):
    """A keyed subtask: its latest epoch (``busy_ratio``: time in its task over the epoch's
    wall time; ``true_rate``: records in per busy second) and its totals."""

    subtask: int
    epoch: int = 0
    records_in: int = 0
    records_out: int = 0
    busy_ms: int = 0
    epoch_ms: int = 0
    busy_ratio: float = 0.0
    true_rate: float = 0.0
    watermark_ms: int | None = None
    records_in_total: int = 0
    records_out_total: int = 0
    busy_ms_total: int = 0
    state_bytes: int = 0  # in the latest checkpoint


@dataclass(frozen=True, kw_only=True)
class OperatorMetricsInfo(Answer):
    """One operator (``kind``: source, keyed or sink); the latencies are from when a record
    became available to when a keyed operator processed it, or an exactly-once sink
    committed it."""

    kind: str
    records_in: int = 0
    records_out: int = 0
    watermark_ms: int | None = None
    event_time_delay_ms: int | None = None
    state_bytes: int = 0
    processing_latency: HistogramInfo | None = None
    committed_latency: HistogramInfo | None = None
    subtasks: tuple[SubtaskMetricsInfo, ...] = ()


@dataclass(frozen=True, kw_only=True)
class MetricsInfo(Answer):
    """Per operator metrics, and what a person looks at first (the operator mirrors these
    into ``status.metrics``)."""

    epoch_duration: HistogramInfo = field(default_factory=HistogramInfo)
    operators: Mapping[str, OperatorMetricsInfo] = field(default_factory=dict)
    processing_latency_p99_ms: int = 0  # over every keyed operator
    committed_latency_p99_ms: int = 0  # over every exactly-once sink
    max_busy_ratio: float = 0.0  # of any keyed subtask, in its latest epoch
    busiest_subtask: str | None = None  # "<operator uid>/<subtask>" of that ratio
    event_time_delay_ms: int | None = None  # the largest of any keyed operator


@dataclass(frozen=True, kw_only=True)
class GraphNode(Answer):
    """One node of the job graph: ``label`` is its uid (sources, keyed operators, sinks) or
    its name (stateless transforms); ``inputs`` the ids of the nodes it reads."""

    id: int
    label: str
    kind: str  # source, map, ..., process, co_process, ..., sink: docs/control-api.md
    inputs: tuple[int, ...] = ()
    region: str = ""  # the failover region it belongs to
    parallelism: int | None = None  # keyed operators only
    # Keyed operators: each subtask's key groups [start, end), by subtask index.
    key_groups: tuple[tuple[int, int], ...] = ()
    # A keyed operator whose parallelism the pipeline fixes (``.process(...,
    # parallelism=N)``): replicas, and so the autoscaler, do not change it.
    pinned: bool = False


@dataclass(frozen=True, kw_only=True)
class JobGraph(Answer):
    """The job's graph (the console draws it): nodes in the order the pipeline added them;
    an edge goes from each of a node's ``inputs`` to it."""

    nodes: tuple[GraphNode, ...] = ()


@dataclass(frozen=True, kw_only=True)
class JobInfo(Answer):
    """``GET /v1/job``: the job's state and progress."""

    epoch: int
    job: str = ""
    state: str | None = None
    max_parallelism: int = 0
    parallelism: Mapping[str, int] | None = None  # operator uid -> its parallelism
    regions: tuple[RegionInfo, ...] = ()
    records_in: int = 0
    records_out: int = 0
    restarts: int = 0
    checkpoints: CheckpointCounts = field(default_factory=CheckpointCounts)
    latest_checkpoint: CheckpointSummary | None = None
    last_error: str | None = None
    started_ms: int = 0
    startup: StartupMarks = field(default_factory=StartupMarks)
    stopped_with_savepoint: str | None = None
    restores: Restores | None = None
    placement: Placement | None = None  # None with one executor
    standby_copies: StandbyCopies | None = None
    sources: Mapping[str, SourceInfo] | None = None  # source uid -> its lag
    lag_records: int = 0  # consumer lag of every source, in records
    lag_ms: int = 0  # the largest of any split, in ms
    # When the lag was measured (the latest planning, epoch ms; None before one): a long
    # epoch's lag is as old as the epoch.
    lag_at_ms: int | None = None
    metrics: MetricsInfo | None = None
    graph: JobGraph | None = None
    checkpoint_health: CheckpointHealthInfo | None = None


@dataclass(frozen=True, kw_only=True)
class CheckpointAttempt(Answer):
    """One checkpoint attempt of the recent history."""

    id: int
    epoch: int
    status: str  # COMPLETED or FAILED
    at_ms: int
    state_bytes: int = 0
    incremental_bytes: int = 0
    duration_ms: int = 0
    error: str | None = field(default=None, metadata=OMIT_NONE)
    region: str | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True, kw_only=True)
class RegionStorage(Answer):
    id: str
    storage: str
    latest_checkpoint: RegionCheckpoint | None = None


@dataclass(frozen=True, kw_only=True)
class CheckpointsInfo(Answer):
    """``GET /v1/checkpoints``: retained checkpoints, recent attempts, those in flight."""

    storage: str
    latest: CheckpointSummary | None = None
    retained: tuple[CheckpointSummary, ...] = ()
    history: tuple[CheckpointAttempt, ...] = ()
    in_flight: tuple[int, ...] = ()
    regions: tuple[RegionStorage, ...] = ()
    counts: CheckpointCounts = field(default_factory=CheckpointCounts)


@dataclass(frozen=True, kw_only=True)
class SeriesInfo(Answer):
    """A time series of ``GET /v1/history``: its unit, and the plot it belongs in."""

    name: str
    unit: str
    group: str  # throughput, latency, lag, failovers, ...


@dataclass(frozen=True, kw_only=True)
class TimeSeries(Answer):
    """Status samples, one every ``interval_ms``, the newest ``capacity`` kept: their times
    (epoch ms) and each series' values at them (null: no value, e.g. a rate's first)."""

    interval_ms: int
    capacity: int
    series: tuple[SeriesInfo, ...] = ()
    t_ms: tuple[int, ...] = ()
    values: Mapping[str, tuple[float | None, ...]] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class EpochSample(Answer):
    """One epoch: when it ended, how long it took, what it read and wrote."""

    epoch: int
    at_ms: int
    duration_ms: int
    records_in: int = 0
    records_out: int = 0
    region: str | None = field(default=None, metadata=OMIT_NONE)
    # ms after it was planned: submitted, source_start, ..., handed_off (``epoch/phases.py``)
    phases: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class FailoverSample(Answer):
    """The job restarted: seen at ``at_ms`` (a status sample), ``restarts`` in all then, and
    the job's last error then."""

    at_ms: int
    restarts: int
    error: str | None = None


@dataclass(frozen=True, kw_only=True)
class HistoryInfo(Answer):
    """``GET /v1/history``: the driver's recent past, for plots (``control/timeline.py``)."""

    samples: TimeSeries
    epochs: tuple[EpochSample, ...] = ()
    epochs_capacity: int = 0
    checkpoints: tuple[CheckpointAttempt, ...] = ()  # as in ``GET /v1/checkpoints``
    failovers: tuple[FailoverSample, ...] = ()  # the latest 100


@dataclass(frozen=True, kw_only=True)
class SavepointRequest(Answer):
    """A savepoint request (``POST /v1/savepoints``, ``GET /v1/savepoints/{id}``)."""

    id: str
    status: str  # PENDING, IN_PROGRESS, COMPLETED, FAILED
    stop: bool = False
    target: str | None = None
    format_type: str | None = None
    location: str | None = None
    epoch: int | None = None
    state_bytes: int | None = None
    error: str | None = None
    created_ms: int = 0
    started_ms: int | None = None  # its epoch began: a stop's driver processed no record after it
    completed_ms: int | None = None

    @property
    def finished(self) -> bool:
        return self.status in ("COMPLETED", "FAILED")


@dataclass(frozen=True, kw_only=True)
class SavepointList(Answer):
    """``GET /v1/savepoints``."""

    savepoints: tuple[SavepointRequest, ...] = ()


@dataclass(frozen=True, kw_only=True)
class HandoverAnswer(Answer):
    """``POST /v1/handover``: what the pre-started driver restores from."""

    restore: str
    allow_non_restored_state: bool = False


@dataclass(frozen=True, kw_only=True)
class ErrorAnswer(Answer):
    """Any refusal (4xx/5xx)."""

    error: str
