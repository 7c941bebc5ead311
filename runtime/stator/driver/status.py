"""What a running job shows: its state, counters and recent checkpoint outcomes. Written by
the epoch loop, read (never blocked on) by the control API, the CLI and metrics."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ..checkpoint.coordinator import now_ms
from ..checkpoint.metadata import CheckpointMetadata


class JobState(StrEnum):
    CREATED = "CREATED"
    RECOVERING = "RECOVERING"
    RUNNING = "RUNNING"
    FINISHED = "FINISHED"  # every bounded source is exhausted and committed
    STOPPED = "STOPPED"  # stopped with a savepoint
    FAILED = "FAILED"  # the restart strategy gave up, or the failure cannot be retried

    @property
    def ended(self) -> bool:
        return self in (JobState.FINISHED, JobState.STOPPED, JobState.FAILED)


@dataclass
class JobStatus:
    job: str
    epoch: int = 0
    records_in: int = 0
    records_out: int = 0
    checkpoints: int = 0
    failed_checkpoints: int = 0
    restarts: int = 0
    last_checkpoint: CheckpointMetadata | None = None
    last_error: str | None = None
    started_ms: int = field(default_factory=now_ms)
    state: JobState = JobState.CREATED
    stopped_with_savepoint: str | None = None

    @property
    def finished(self) -> bool:
        return self.state is JobState.FINISHED


@dataclass(frozen=True)
class CheckpointOutcome:
    """One checkpoint attempt, as the control API lists it."""

    id: int
    epoch: int
    status: str  # COMPLETED | FAILED
    at_ms: int
    state_bytes: int = 0
    incremental_bytes: int = 0
    duration_ms: int = 0
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = {
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
                "COMPLETED",
                meta.created_ms,
                meta.state_bytes,
                meta.incremental_bytes,
                meta.duration_ms,
            )
        )

    def failed(self, checkpoint_id: int, epoch: int, error: str) -> None:
        self._add(CheckpointOutcome(checkpoint_id, epoch, "FAILED", now_ms(), error=error[:500]))

    def _add(self, item: CheckpointOutcome) -> None:
        with self._lock:
            self._items.append(item)

    def items(self) -> list[CheckpointOutcome]:
        with self._lock:
            return list(self._items)
