"""One checkpoint from the epoch that triggers it to its verdict: a
:class:`PendingCheckpoint`, owned by the coordinator (``coordinator.py`` numbers the steps),
as Flink's ``CheckpointCoordinator`` owns its ``PendingCheckpoint`` objects.

States, and who moves a checkpoint between them::

    TRIGGERED     the epoch that takes it is planned (``CheckpointCoordinator.trigger``)
    ACKNOWLEDGED  every keyed subtask reported its snapshot: the draft metadata is assembled
                  (``driver/completion.py``)
    UPLOADING     asynchronous uploads still run; the driver waits for their confirmations
                  (``driver/in_flight.py``)
    COMPLETED     its metadata is written (``CheckpointCoordinator.finish``)
    ABORTED       it failed at any step before (``CheckpointCoordinator.fail``)

COMPLETED and ABORTED are final and carry a :class:`Verdict`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, StrEnum

from .metadata import CheckpointMetadata, RemoteFile


class CheckpointState(Enum):
    TRIGGERED = "TRIGGERED"
    ACKNOWLEDGED = "ACKNOWLEDGED"
    UPLOADING = "UPLOADING"
    COMPLETED = "COMPLETED"
    ABORTED = "ABORTED"


# Which state may follow which (the final ones have none).
_NEXT = {
    CheckpointState.TRIGGERED: {CheckpointState.ACKNOWLEDGED, CheckpointState.ABORTED},
    CheckpointState.ACKNOWLEDGED: {
        CheckpointState.UPLOADING,
        CheckpointState.COMPLETED,
        CheckpointState.ABORTED,
    },
    CheckpointState.UPLOADING: {CheckpointState.COMPLETED, CheckpointState.ABORTED},
}


class CheckpointResult(StrEnum):
    """How a checkpoint attempt ended, as the control API lists it."""

    COMPLETED = "COMPLETED"
    FAILED = "FAILED"


@dataclass(frozen=True)
class Verdict:
    """A checkpoint that is no longer pending: completed (``meta``) or failed (``error``)."""

    checkpoint_id: int
    epoch: int
    meta: CheckpointMetadata | None
    error: str | None = None

    @property
    def result(self) -> CheckpointResult:
        return CheckpointResult.COMPLETED if self.meta is not None else CheckpointResult.FAILED


@dataclass(frozen=True)
class Upload:
    """One subtask's asynchronous upload the checkpoint waits for."""

    who: str  # "operator 'x' subtask n"
    executor: str  # where it runs ("" under local[*])


@dataclass(eq=False)
class PendingCheckpoint:
    checkpoint_id: int
    epoch: int
    incremental: bool
    state: CheckpointState = CheckpointState.TRIGGERED
    # ACKNOWLEDGED: the metadata to write (its ``duration_ms`` set when it completes), the
    # files its tasks uploaded, and when its epoch started (monotonic).
    draft: CheckpointMetadata | None = None
    uploaded: list[RemoteFile] = field(default_factory=list)
    started: float = 0.0
    # UPLOADING: key of each expected confirmation -> its upload; the deadline (monotonic);
    # the in-flight checkpoint whose new files it re-references (0: none); and what a failure
    # deletes if nothing else references it: its own uploads and those of the in-flight
    # checkpoints it builds on, which fail with it.
    confirmations: dict[str, Upload] = field(default_factory=dict)
    deadline: float = 0.0
    base: int = 0
    cleanup: list[RemoteFile] = field(default_factory=list)
    verdict: Verdict | None = None

    def move(self, to: CheckpointState) -> None:
        if to not in _NEXT.get(self.state, set()):
            raise RuntimeError(f"checkpoint {self.checkpoint_id}: {self.state.value} -> {to.value}")
        self.state = to

    def acknowledged(
        self, draft: CheckpointMetadata, uploaded: list[RemoteFile], started: float
    ) -> None:
        self.move(CheckpointState.ACKNOWLEDGED)
        self.draft, self.uploaded, self.started = draft, uploaded, started
