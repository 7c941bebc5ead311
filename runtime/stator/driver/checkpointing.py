"""A region's checkpoints as its epoch loop sees them (steps 4-5 of ``epoch_loop.py``): each
one is a ``PendingCheckpoint`` the coordinator owns (``checkpoint/coordinator.py`` numbers
its steps), triggered with an epoch, acknowledged after it (``completion.py``), completed at
once or when its uploads are confirmed (``in_flight.py``), and settled here: recorded
(history, status, schedule, recovery), sinks commit what a completed one covers, listeners
are told, and their health is tracked (``checkpoint_health.py``)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..checkpoint.coordinator import CheckpointCoordinator, now_ms
from ..checkpoint.metadata import CheckpointMetadata
from ..checkpoint.pending import Verdict
from ..config import JobConfig
from ..epoch.reports import StateReport
from ..epoch.spec import CheckpointTask, EpochSpec
from .checkpoint_base import incremental_base
from .checkpoint_health import CheckpointHealth
from .completion import PendingOutput, acknowledge, commit_completed, notify_sources
from .in_flight import InFlightCheckpoints
from .parallelism import Parallelism
from .planning import CheckpointSchedule, EpochPlanner
from .recovery import Recovery
from .status import CheckpointHistory, JobStatus

log = logging.getLogger("stator.driver")


class RegionCheckpoints:
    def __init__(
        self,
        coordinator: CheckpointCoordinator,
        config: JobConfig,
        parallelism: Parallelism,
        planner: EpochPlanner,
        output: PendingOutput,
        recovery: Recovery,
        status: JobStatus,
        listeners: list[Callable[[CheckpointMetadata], None]],
    ) -> None:
        self.coordinator, self.config, self.parallelism = coordinator, config, parallelism
        self.planner, self.output, self.recovery = planner, output, recovery
        self.status, self.listeners = status, listeners
        self.history = CheckpointHistory()
        self.schedule = CheckpointSchedule(config.checkpoint)
        self.in_flight = InFlightCheckpoints(
            coordinator.store, coordinator, config.checkpoint.timeout_ms
        )
        self.health = CheckpointHealth(config.checkpoint)
        status.checkpoint_health = self.health.report

    def trigger(self, epoch: int, last: bool, savepoint: bool) -> CheckpointTask | None:
        """The checkpoint ``epoch`` takes, if one is due (``last``: the epoch reads the end
        of the bounded input; a ``savepoint`` epoch takes one whenever checkpointing is on).
        It first waits while ``checkpoint.max_concurrent`` are in flight."""
        ck = self.config.checkpoint
        due = self.schedule.due(last, len(self.in_flight.ids()))
        if not (due or (savepoint and ck.enabled)):
            return None
        self.settle(self.in_flight.wait(ck.max_concurrent - 1))
        self.schedule.triggered()
        base, previous = incremental_base(
            self.in_flight.newest(),
            self.recovery.position.target,
            self.coordinator.store,
            self.parallelism.operators,
            ck.incremental,
        )
        pending = self.coordinator.trigger(epoch, ck.incremental)
        return CheckpointTask(
            pending.checkpoint_id,
            self.coordinator.store,
            ck.incremental,
            previous,
            keep_local=self.config.local_recovery.enabled,
            async_upload=ck.async_upload,
            deadline_ms=now_ms() + ck.timeout_ms,
            base_in_flight=base,
            inline_max_bytes=ck.inline_max_bytes,
        )

    def after_epoch(
        self, job: str, spec: EpochSpec, states: list[StateReport], started: float
    ) -> list[Verdict]:
        """Step 4 of ``epoch_loop.py`` for the epoch ``spec`` ran (``started``: monotonic):
        its checkpoint acknowledged and completed, or in flight; then every verdict settled."""
        self.schedule.epoch_done()
        verdicts: list[Verdict] = []
        task = spec.checkpoint
        self.health.epoch_ended(spec.epoch, task is not None)
        if task is not None:
            pending = self.coordinator.pending[task.checkpoint_id]
            refused = acknowledge(
                pending,
                job,
                self.recovery.lineage,
                self.parallelism.operators,
                self.parallelism.max_parallelism,
                states,
                self.planner.to_json(),
                self.output,
                self.coordinator,
                started,
            )
            if refused is not None:
                verdicts.append(refused)
            elif task.async_upload:
                self.in_flight.add(pending, states, task.base_in_flight)
            else:
                verdicts.append(self.coordinator.finish(pending))
        elif not self.config.checkpoint.enabled:
            self.output.commit_upto(spec.epoch)  # no checkpoints: output is at-least-once
        verdicts += self.in_flight.poll()
        return self.settle(verdicts)

    def poll(self) -> list[Verdict]:
        return self.settle(self.in_flight.poll())

    def drain(self) -> list[Verdict]:
        """Wait for every checkpoint in flight (a savepoint, a stop, the end of the input)."""
        return self.settle(self.in_flight.wait(0))

    def abort_all(self, reason: str) -> list[Verdict]:
        """The epoch failed: what is confirmed completes, the rest is aborted (its epochs
        will be replayed), and a checkpoint the failed epoch was to take is forgotten."""
        self.coordinator.forget_triggered()
        return self.settle(self.in_flight.abort_all(reason), counted=False)

    def check_health(self) -> None:
        """Raise ``CheckpointsUnhealthy`` if the region must fail over (``checkpoint_health``)."""
        self.health.check()

    def restarted(self) -> None:
        """The region rewound to its latest completed checkpoint after a failure."""
        self.health.restarted()

    def settle(self, verdicts: list[Verdict], counted: bool = True) -> list[Verdict]:
        """Record checkpoints that completed or failed, in order; for each completed one,
        sinks commit what it covers (``completion.commit_completed``). ``counted`` False:
        checkpoints aborted because the job fails over, which the health rules ignore."""
        for v in verdicts:
            if v.meta is None:
                self.history.failed(v.checkpoint_id, v.epoch, v.error or "")
                self.status.failed_checkpoints += 1
                self.schedule.checkpoint_failed()
                self.health.failed(v.error or "", counted)
                continue
            self.health.completed(v.meta.epoch)
            self.recovery.checkpoint_completed(v.meta)
            self.history.completed(v.meta)
            self.status.checkpoints += 1
            self.status.last_checkpoint = v.meta
            self.schedule.checkpoint_done()
            commit_completed(v.meta, self.output, self.coordinator)
            notify_sources(v.meta, self.planner.sources)
            for listener in self.listeners:
                listener(v.meta)
        self.status.in_flight_checkpoints = tuple(sorted(self.in_flight.ids()))
        return verdicts
