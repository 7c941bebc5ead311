"""The read-and-request view of a running job that the control API and metrics use (the job
driver provides it; nothing here imports the driver)."""

from __future__ import annotations

from typing import Any, Protocol

from ..api.graph import PipelineGraph
from ..checkpoint.metadata import CheckpointMetadata
from ..driver.handover import Handover
from ..driver.listeners import EpochListener
from ..driver.parallelism import Parallelism
from ..driver.savepoints import SavepointRequest, SavepointRequests
from ..driver.status import CheckpointOutcome, JobStatus
from ..locality.placement import PlacementTracker
from ..storage import ObjectStore


class History(Protocol):
    def items(self) -> list[CheckpointOutcome]: ...


class JobView(Protocol):
    """What the control API reads from a running job (the job driver provides it)."""

    job: str
    pipeline: PipelineGraph
    parallelism: Parallelism

    @property
    def status(self) -> JobStatus: ...

    @property
    def history(self) -> History: ...

    savepoints: SavepointRequests
    store: ObjectStore
    placement: PlacementTracker | None
    handover: Handover | None  # a pre-started driver's (``stator run --await-handover``)

    def retained_checkpoints(self) -> list[CheckpointMetadata]: ...

    def on_epoch(self, listener: EpochListener) -> None:
        """Call ``listener`` after every epoch (the control API's history samples them)."""
        ...

    def region_views(self) -> list[dict[str, Any]]:
        """Per failover region: ``id``, ``nodes``, ``state``, ``epoch``, ``restarts``,
        ``latest_checkpoint``, ``last_error``, ... (``RegionLoop.region_view``)."""
        ...

    def request_savepoint(
        self, target: str | None = None, stop: bool = False, format_type: str | None = None
    ) -> SavepointRequest: ...
