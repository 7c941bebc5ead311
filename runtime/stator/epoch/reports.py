"""What tasks report to the driver at the end of an epoch, through one accumulator.

One name per field from the task to the status: ``records``, ``watermark``, ``bytes`` and
``incremental_bytes`` mean the same thing here, in checkpoint metadata, in the control API
and (camel-cased) in the operator's status.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ..checkpoint.metadata import SubtaskSnapshot
from .availability import Availability
from .histogram import Histogram


@dataclass(frozen=True)
class SplitReport:
    """A source task read its range of ``split``."""

    uid: str
    split: str
    epoch: int
    max_timestamp: int
    records: int
    rejected: int = 0  # records the source sent to its dead-letter sink
    # When its records became available (``availability.py``): committed latency.
    available: Availability = ()
    # The task's start and end, wall clock ms (``phases.py``).
    started_ms: int = 0
    ended_ms: int = 0


@dataclass(frozen=True)
class SplitFailure:
    """A source task's last attempt at its range of ``split`` failed (a job without keyed
    operators, where each split fails over on its own: ``driver/split_failover.py``)."""

    uid: str
    split: str
    epoch: int
    error: str  # "<ExceptionType>: <message>", as a failed Spark task's text would carry it


@dataclass(frozen=True)
class SinkReport:
    """A task staged one part of a sink's output for ``epoch``.

    ``descriptor`` is the sink's own JSON-able description of the part (kept in checkpoint
    metadata until committed); ``payload`` travels to the driver only (e.g. collected rows).
    """

    uid: str
    epoch: int
    descriptor: dict[str, Any]
    payload: Any

    @property
    def part(self) -> str:
        return str(self.descriptor["part"])

    @property
    def records(self) -> int:
        return int(self.descriptor.get("records", 0))


@dataclass(frozen=True)
class SavepointPart:
    """A keyed subtask's part of a savepoint: its key-group files (canonical) or its database
    files (native), and its state catalog."""

    key_groups: dict[int, dict[str, Any]]
    states: dict[str, dict[str, Any]]
    snapshot: SubtaskSnapshot | None = None
    # canonical: the subtask's non-keyed state, base64 (native: in ``snapshot``)
    operator_state: str = ""


class RestoreSource(StrEnum):
    """Where a keyed subtask's state came from at the start of an epoch."""

    NONE = "none"  # its local database was at the expected epoch, or it started empty
    LOCAL = "local"  # the executor's copy of the checkpoint
    REMOTE = "remote"  # the object store: a checkpoint, a rescaled checkpoint or a savepoint


@dataclass(frozen=True)
class RestoreReport:
    """How a keyed subtask got its state at the start of an epoch.

    ``source``: ``none`` (its local database was already at the expected epoch, or it started
    empty), ``local`` (from the executor's copy of the checkpoint) or ``remote`` (from the
    object store: a checkpoint, a rescaled checkpoint or a savepoint). ``remote_bytes`` counts
    what was read from the object store, ``local_bytes`` what came from local files (a remote
    restore links the SSTs an older local copy holds); ``fallback`` says why a local copy was
    not used when a remote restore happened. ``savepoint``: the state came from a savepoint
    (``checkpoint_id`` is then 0).
    """

    source: RestoreSource
    checkpoint_id: int = 0
    savepoint: bool = False
    local_bytes: int = 0
    remote_bytes: int = 0
    duration_ms: int = 0
    fallback: str | None = None

    @property
    def restored(self) -> bool:
        return self.source != RestoreSource.NONE


NO_RESTORE = RestoreReport(RestoreSource.NONE)


@dataclass(frozen=True)
class StandbyTally:
    """The standby copies one uploader process made since it started
    (``locality/standby_copy.py``): a copy's cost is bytes read from the object store on an
    executor that does not run the subtask, which no restore counts. Cumulative, so the
    driver keeps each uploader's newest and a tally reported twice or late counts once."""

    uploader: str  # a token of the uploader process
    copies: int = 0  # copies that read from the object store
    bytes: int = 0  # what they read
    failed: int = 0  # copies that failed (the next checkpoint's order tries again)

    def newer_than(self, other: StandbyTally | None) -> bool:
        return other is None or (self.copies + self.failed, self.bytes) > (
            other.copies + other.failed,
            other.bytes,
        )


@dataclass(frozen=True)
class StateReport:
    """A keyed subtask committed ``epoch`` (and, if asked, took its part of a checkpoint and
    of a savepoint)."""

    uid: str
    subtask: int
    epoch: int
    watermark: int
    records_in: int
    records_out: int
    snapshot: SubtaskSnapshot | None = None
    checkpoint_error: str | None = None
    savepoint: SavepointPart | None = None
    restore: RestoreReport = NO_RESTORE
    # Where the task ran (Spark's executor id and host; empty under local[*], where there is
    # one executor and no placement): the driver asks for the same executor next epoch.
    executor: str = ""
    host: str = ""
    node: str = ""  # the Kubernetes node, for the placement the status shows
    # The token of this attempt's asynchronous upload of ``snapshot`` ("": uploaded before
    # the task returned): the driver waits for its confirmation (``checkpoint/uploads.py``).
    upload: str = ""
    # The database commit of ``epoch`` (``KeyedBackend.commit_token``): the next epoch keeps
    # the local state only if it is this commit (``EpochSpec.commits``).
    commit: str = ""
    # The standby copies this executor's uploader made (None: it made none yet).
    standby: StandbyTally | None = None
    # Wall time of the task, less a restore of its state (one-off), in ns: busy ratio and
    # true processing rate (``driver/job_metrics.py``).
    busy_ns: int = 0
    # Latency of its records from available to processed (``availability.py``).
    latency: Histogram | None = None
    # Wall clock ms (``phases.py``): the task started, had read its input (the shuffle),
    # had run its functions over it, and ended (state committed, snapshot taken).
    started_ms: int = 0
    input_ms: int = 0
    processed_ms: int = 0
    ended_ms: int = 0


Report = SplitReport | SplitFailure | SinkReport | StateReport
