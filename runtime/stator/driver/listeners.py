"""What the job tells its listeners (``Job.on_epoch``, ``Job.on_checkpoint``): every
region's loop calls them, in that loop's thread."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..checkpoint.metadata import CheckpointMetadata
from ..checkpoint.pending import Verdict
from ..epoch.phases import EpochPhases
from ..epoch.reports import StateReport


@dataclass(frozen=True)
class EpochResult:
    """What one epoch did, as :meth:`Job.on_epoch` listeners see it."""

    epoch: int
    savepoint: bool  # the epoch of a savepoint (it reads nothing)
    records_in: int
    records_out: int
    duration_s: float
    states: list[StateReport]
    checkpoint_id: int  # the checkpoint this epoch took (0: none)
    outcomes: list[Verdict]  # checkpoints (of this or earlier epochs) completed or failed
    region: str | None = None  # the failover region's id (a job of several regions)
    phases: EpochPhases | None = None  # where its time went (``epoch/phases.py``)


EpochListener = Callable[[EpochResult], None]
CheckpointListener = Callable[[CheckpointMetadata], None]


@dataclass
class Listeners:
    """The job's listeners, called by every region's loop (in that loop's thread)."""

    epoch: list[EpochListener] = field(default_factory=list)
    checkpoint: list[CheckpointListener] = field(default_factory=list)
