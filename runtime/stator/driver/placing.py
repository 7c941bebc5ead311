"""Where an epoch's keyed subtasks run when there are several executors: pinned to the
executor holding their local state (``locality/placement.py``), with standby copies on others
(``locality/standby.py``). Built by the epoch loop once Spark is known."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..checkpoint.metadata import CheckpointMetadata
from ..cluster.jvm import fail_futile_retries, watch_lost_pods
from ..config import JobConfig
from ..epoch.spec import EpochSpec, StandbyTask
from ..errors import StateMismatchError
from ..locality.placement import EpochLocations, Placer
from ..locality.standby import StandbyAssigner
from ..storage import ObjectStore
from .checkpoint_base import local_restore
from .recovery import Position
from .spark_session import starts_executor_pods
from .status import JobStatus


class Placing:
    """Places one region's keyed subtasks, epoch by epoch."""

    def __init__(
        self,
        spark: Any,
        job: str,
        config: JobConfig,
        store: ObjectStore,
        parallelism: dict[str, int],
        placer: Placer,
        standby: StandbyAssigner | None,
    ) -> None:
        self.spark, self.job, self.config, self.store = spark, job, config, store
        self.parallelism, self.placer, self.standby = parallelism, placer, standby

    @classmethod
    def start(
        cls,
        spark: Any,
        job: str,
        config: JobConfig,
        store: ObjectStore,
        parallelism: dict[str, int],
        status: JobStatus,
    ) -> Placing:
        """Placement for a region, once Spark has several executors and the JVM helper."""
        sc = spark.sparkContext
        fail_futile_retries(sc)
        watch_lost_pods(sc)
        placer = Placer(
            sc,
            job,
            config.state.local_dir,
            config.local_recovery.executor_wait_ms,
            config.local_recovery.standby,
        )
        standby = None
        if config.local_recovery.standby:
            standby = StandbyAssigner(store, status.standby_copies.note)
        return cls(spark, job, config, store, parallelism, placer, standby)

    def place(
        self, spec: EpochSpec, position: Position, latest: CheckpointMetadata | None
    ) -> tuple[EpochSpec, EpochLocations]:
        """The epoch's spec with its keyed subtasks pinned (and its standby orders), and
        where they run."""
        local = local_restore(
            position.target, self.store, self.parallelism, self.config.local_recovery.enabled
        )
        placement = self.placer.for_epoch(self.parallelism, local)
        self._check_resumable(placement, position)
        spec = replace(spec, pinned=placement.pinned)
        if self.standby is not None:
            spec = replace(spec, standby=self._standby_orders(placement, spec.local_dir, latest))
        return spec, placement

    def _check_resumable(self, placement: EpochLocations, position: Position) -> None:
        """Fail over now, without running the epoch, when subtasks handed to their standby
        copies cannot continue it: a standby copy is of the latest *completed* checkpoint, and
        the job went on past it (with asynchronous uploads, the executor was lost while its
        checkpoint was in flight). The epoch's keyed task would only fail with the same error
        after its Spark job ran (measured: 1.7 s of a 3.7 s recovery at 1 GB). Only where
        executors are pods: each keeps its state on its own volume, so no other executor has
        the lost one's database (``local-cluster`` executors share a disk, and may)."""
        base = position.target.epoch if position.target is not None else 0
        if not placement.resumed or position.epoch <= base:
            return
        if not starts_executor_pods(self.config.spark):
            return
        names = ", ".join(f"operator '{u}' subtask {s}" for u, s, _ in placement.resumed)
        raise StateMismatchError(
            f"{names}: the executor holding the state at epoch {position.epoch} was lost, and "
            f"the standby copies are of the latest completed checkpoint, at epoch {base}: the "
            f"job must rewind to it"
        )

    def _standby_orders(
        self, placement: EpochLocations, local_dir: str, latest: CheckpointMetadata | None
    ) -> StandbyTask | None:
        """This epoch's standby copies (``locality/standby.py``): in the spec for the executors
        its keyed tasks run on, sent now to the others; and shown in the placement status."""
        assert self.standby is not None
        nodes = {**self.standby.nodes, **self.placer.tracker.nodes()}
        task = self.standby.orders(placement, self.parallelism, latest, nodes)
        if task is not None:
            self.standby.send_to_idle(self.spark.sparkContext, task, placement, self.job, local_dir)
            nodes = {**self.standby.nodes, **nodes}
        self.placer.tracker.standby = {
            key: (executor, nodes.get(executor, ""))
            for key, executor in self.standby.assigned.items()
        }
        return task
