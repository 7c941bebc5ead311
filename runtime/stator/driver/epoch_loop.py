"""The job driver: the epoch loop, and the parts it is made of.

One epoch:

1. Plan (``planning.py``): every unfinished split gets a range (possibly empty: it still
   carries the split's watermark). Nothing to read and nothing finishing -> wait, re-plan.
2. Run (``sparkjob.py``): source tasks -> shuffle by key-group -> keyed tasks -> ... ->
   sinks, as one Spark job. Keyed tasks commit their state for the epoch atomically
   (``tasks/keyed.py``); if a checkpoint is due they also snapshot and upload.
3. Advance: source positions move to the ranges' ends; staged sink output joins the output
   pending commit (``completion.py``).
4. Checkpoint (if due, ``completion.py``): the coordinator completes it (metadata last),
   then sinks commit every epoch it covers. With asynchronous uploads (the default) it is
   in flight instead (``in_flight.py``): it completes at the end of a later epoch, when every
   upload is confirmed; an epoch that takes a checkpoint first waits while
   ``checkpoint.max_concurrent`` are in flight. A failed checkpoint is aborted; processing
   goes on.
5. Listeners registered with :meth:`JobDriver.on_epoch` see the result; those registered
   with :meth:`JobDriver.on_checkpoint` see every checkpoint that completed.

Between epochs the loop takes queued savepoints (``savepoints.py``); a savepoint, a stop and
the end of a bounded job first wait for the checkpoints in flight. A failed epoch fails over
(``recovery.py``): checkpoints in flight are aborted (their epochs will be replayed) and the
job rewinds to its latest completed checkpoint.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..api.pipeline import KeyedNode, Pipeline, SinkNode, SourceNode
from ..checkpoint.coordinator import CheckpointCoordinator, now_ms
from ..checkpoint.metadata import CheckpointMetadata
from ..checkpoint.ownership import Ownership
from ..cluster.fencing import guard
from ..cluster.jvm import fail_futile_retries, live_executors, load_helper, watch_lost_pods
from ..cluster.placement import EpochLocations, PlacementTracker, Placer, uses_placement
from ..cluster.session import share_python_path, starts_executor_pods, warm_python_workers
from ..cluster.standby import StandbyAssigner
from ..config import JobConfig
from ..epoch.reports import Report, SinkReport, SplitFailure, SplitReport, StateReport
from ..epoch.spec import CheckpointTask, EpochSpec, SavepointTask, StandbyTask
from ..errors import JobFailed, StateMismatchError
from ..lineage import Target
from ..storage import ObjectStore, open_store
from .checkpoint_base import incremental_base, local_restore
from .completion import (
    CheckpointRequest,
    PendingOutput,
    assemble_checkpoint,
    commit_completed,
    finish_checkpoint,
    uploaded_files,
)
from .handover import Handover, HandoverRequest
from .in_flight import InFlightCheckpoints, Outcome
from .parallelism import Parallelism, resolve_parallelism
from .planning import CheckpointSchedule, EpochPlanner, Plan
from .preflight import check_storage, restore_target
from .recovery import Recovery
from .restore import restore_task
from .savepoints import (
    SavepointEpoch,
    SavepointRefused,
    SavepointRequest,
    SavepointRequests,
    take_savepoint,
)
from .sparkjob import run_epoch_job
from .split_failover import SplitFailover
from .status import CheckpointHistory, JobState, JobStatus

log = logging.getLogger("stator.driver")


def checkpoint_root(config: JobConfig, job: str, region: str | None = None) -> str:
    """Where a job's checkpoints are: ``<checkpoint.storage>/<job>``, and each failover
    region's under ``regions/<region>/`` in a job of several regions (``regions.py``)."""
    root = f"{config.checkpoint.storage.rstrip('/')}/{job}"
    return f"{root}/regions/{region}" if region else root


# A pre-started driver waiting for its hand-over warms its Python workers again this often
# (Spark ends a worker that idled for a minute).
WARM_AGAIN_S = 30.0
# How long a job that ends waits for standby orders still being handed to idle executors.
STANDBY_ORDERS_WAIT_S = 10.0


@dataclass(frozen=True)
class EpochResult:
    """What one epoch did, as :meth:`JobDriver.on_epoch` listeners see it."""

    epoch: int
    savepoint: bool  # the epoch of a savepoint (it reads nothing)
    records_in: int
    records_out: int
    duration_s: float
    states: list[StateReport]
    checkpoint_id: int  # the checkpoint this epoch took (0: none)
    outcomes: list[Outcome]  # checkpoints (of this or earlier epochs) completed or failed
    region: str | None = None  # the failover region's id (a job of several regions)


EpochListener = Callable[[EpochResult], None]
CheckpointListener = Callable[[CheckpointMetadata], None]


class JobDriver:
    """Runs a pipeline. Thread-safe entry points for other threads (the control API):
    :meth:`stop`, :meth:`request_savepoint`, and reading :attr:`status`."""

    def __init__(
        self,
        pipeline: Pipeline,
        config: JobConfig,
        spark: Any = None,
        python_path: Sequence[str] = (),
        await_handover: bool = False,
        region: str | None = None,
    ) -> None:
        """``python_path``: where the pipeline's module was imported from; Spark's Python
        workers get it too (``loader.py`` says why). ``await_handover``: a pre-started driver,
        see :meth:`await_handover`. ``region``: this drives one failover region of a job of
        several (``regions.py``): its checkpoints are its own, under ``regions/<region>/``."""
        pipeline.validate()
        self.pipeline, self.config, self.spark = pipeline, config, spark
        self.python_path = tuple(python_path)
        self.job = config.name or pipeline.name
        self.region = region
        self.parallelism: Parallelism = resolve_parallelism(pipeline, config)
        self.store: ObjectStore = open_store(checkpoint_root(config, self.job, region), config.s3)
        self.status = JobStatus(self.job)
        self.history = CheckpointHistory()
        self.savepoints = SavepointRequests(config.savepoint.dir, config.savepoint.any_target)
        ck = config.checkpoint
        self.coordinator = CheckpointCoordinator(
            self.store, ck.retained, Ownership(ck.owner, ck.adopt)
        )
        self.planner = EpochPlanner(
            {n.uid: n for n in pipeline.nodes if isinstance(n, SourceNode)}, config.epoch
        )
        self.output = PendingOutput({n.uid: n for n in pipeline.nodes if isinstance(n, SinkNode)})
        self.schedule = CheckpointSchedule(config.checkpoint)
        self.recovery = Recovery(
            self.job,
            config,
            self.store,
            self.coordinator,
            self.parallelism,
            self.planner,
            self.output,
            self.status,
        )
        if region is not None:
            self.recovery.label = f"job '{self.job}' region '{region}'"
        # Without keyed operators every source split fails over on its own.
        keyless = not any(isinstance(n, KeyedNode) for n in pipeline.nodes)
        self.split_failover = (
            SplitFailover(self.recovery.label, config.restart)
            if keyless and config.failover.strategy == "region"
            else None
        )
        self._task_attempts = 0  # Spark's attempts of a task, once Spark is known
        self.in_flight = InFlightCheckpoints(
            self.store, self.coordinator, config.checkpoint.timeout_ms
        )
        self._listeners: list[EpochListener] = []
        self._checkpoint_listeners: list[CheckpointListener] = []
        self._stop = False
        self._owns_spark = spark is None
        # Given through the control API (POST /v1/handover) to a pre-started driver.
        self.handover = Handover() if await_handover else None
        # Where keyed subtasks run, with several executors (set when Spark is known).
        self.placer: Placer | None = None
        self.standby: StandbyAssigner | None = None  # local_recovery.standby, several executors
        self.placement: PlacementTracker | None = None
        # A region of a job of several (``regions.py``): whether it may end once its bounded
        # sources are exhausted (the others may still run: it serves savepoints until then).
        self.may_end: Callable[[], bool] | None = None
        self.finished_work = False
        self._preflighted: Target | None = None  # what check_restore_source found
        # MACs the warm cache files of this driver's tasks (state/warm.py): random per
        # driver, so a file another pod planted on a state volume is never unpickled.
        self.warm_key = os.urandom(32)

    # ------------------------------------------------------------------ public

    def on_epoch(self, listener: EpochListener) -> None:
        """Call ``listener`` after every epoch (in the loop's thread; it may call
        :meth:`stop` or :meth:`request_savepoint`)."""
        self._listeners.append(listener)

    def on_checkpoint(self, listener: CheckpointListener) -> None:
        """Call ``listener`` with every checkpoint that completes (in the loop's thread)."""
        self._checkpoint_listeners.append(listener)

    def stop(self) -> None:
        """Stop after the current epoch."""
        self._stop = True

    def _stopping(self) -> bool:
        return self._stop

    def request_savepoint(
        self, target: str | None = None, stop: bool = False, format_type: str | None = None
    ) -> SavepointRequest:
        """Queue a savepoint, optionally stopping the job after it; thread-safe."""
        return self.savepoints.request(target, stop, format_type)

    def close(self) -> None:
        """Stop the SparkSession if :meth:`run` created it (its last log lines, e.g. about
        tasks it cancels after a failure, then come before the job's result)."""
        if self._owns_spark and self.spark is not None:
            self.spark.stop()
            self.spark = None

    def retained_checkpoints(self) -> list[CheckpointMetadata]:
        return list(self.coordinator.completed)

    def region_view(self) -> dict[str, Any]:
        """This driver's region (or whole job) as the control API and the operator show it."""
        st, latest = self.status, self.status.last_checkpoint
        return {
            "id": self.region or self.job,
            "nodes": [name for part in self.pipeline.regions() for name in part],
            # Waiting out a restart delay or rewinding: the region does not process.
            "state": JobState.RECOVERING if self.recovery.restarting else st.state,
            "epoch": st.epoch,
            "records_in": st.records_in,
            "records_out": st.records_out,
            "restarts": st.restarts,
            "checkpoints": {"completed": st.checkpoints, "failed": st.failed_checkpoints},
            "latest_checkpoint": (
                {"id": latest.checkpoint_id, "epoch": latest.epoch, "created_ms": latest.created_ms}
                if latest
                else None
            ),
            "last_error": st.last_error,
            "storage": self.store.uri,
            # Per source split that failed over on its own (a job without keyed operators).
            "splits": self.split_failover.to_json() if self.split_failover else [],
        }

    def region_views(self) -> list[dict[str, Any]]:
        """One entry per failover region; run by this one driver, they share its state
        (``failover.strategy=full`` restarts all of them together)."""
        view = self.region_view()
        return [
            {**view, "id": region.id, "nodes": region.pipeline.regions()[0]}
            for region in self.pipeline.split()
        ]

    # ------------------------------------------------------------------ preflight

    def check_storage(self) -> None:
        check_storage(self.job, self.config, self.store)

    def preflight(self) -> Target | None:
        """``preflight.py``: everything that can be checked before Spark starts."""
        target = self.check_restore_source()
        self.check_storage()
        return target

    def check_restore_source(self) -> Target | None:
        """Preflight step 2; :meth:`run` restores from what it found unless given another."""
        self._preflighted = restore_target(
            self.job,
            self.config,
            self.parallelism,
            self.store,
            set(self.planner.sources),
            whole_job=self.region is None,
        )
        return self._preflighted

    def await_handover(self, start_executors: bool = False) -> HandoverRequest:
        """A pre-started driver: start what does not touch the job's state while the old
        driver still runs, then wait for the hand-over and restore from what it names
        (``handover.py``). Spark, with warm Python workers that hold clients of the job's
        stores, starts now unless its executors are pods that the old driver's executors
        hold (their StatefulSet and claims, until the old driver is gone); with
        ``start_executors`` they are a set of its own, and start now too."""
        assert self.handover is not None, "built without await_handover"
        startup = self.status.startup
        startup.driver_started_ms = now_ms()
        warm = start_executors or not starts_executor_pods(self.config.spark)
        if warm:
            self._start_spark()
            warm_python_workers(self.spark, self.connections())
            startup.spark_ready_ms = now_ms()
        self.status.state = JobState.STANDBY
        log.info("pre-started: waiting for the hand-over (POST /v1/handover)")
        while (request := self.handover.wait(WARM_AGAIN_S)) is None:
            if warm:  # Spark ends Python workers that idled for a minute
                warm_python_workers(self.spark, self.connections())
        startup.handover_ms = now_ms()
        self.handed_over(request)
        return request

    def handed_over(self, request: HandoverRequest) -> None:
        """Restore from what the hand-over names (``regions.py`` calls it per region)."""
        restore = replace(
            self.config.restore,
            source=request.restore,
            allow_non_restored_state=request.allow_non_restored_state,
            force_empty=False,
        )
        self.config = replace(self.config, restore=restore)
        self.recovery.config = self.config
        self.status.state = JobState.CREATED
        log.info("handed over: restoring from %s", request.restore)

    def connections(self) -> list[Callable[[], None]]:
        """What tasks connect to: the checkpoint and savepoint stores, and the sinks."""
        cfg = self.config
        stores = [self.store, open_store(cfg.savepoint.dir, cfg.s3)]
        sinks = [n.sink for n in self.pipeline.nodes if isinstance(n, SinkNode)]
        return [s.connect for s in stores] + [s.connect for s in sinks]

    def _start_spark(self) -> None:
        if self.spark is None:
            from ..cluster.session import create_session  # noqa: PLC0415 - starts a JVM

            self.spark = create_session(self.config.spark, f"stator-{self.job}")
        share_python_path(self.spark, self.python_path)

    def run(self, restore_target: Target | None = None) -> JobStatus:
        """Run until the job stops, ends or fails. ``restore_target``: what preflight found
        for ``restore.source`` (it is not read again; default: what
        :meth:`check_restore_source` found)."""
        restore_target = restore_target or self._preflighted
        startup = self.status.startup
        if startup.driver_started_ms is None:
            startup.driver_started_ms = now_ms()
        self._start_spark()
        sc = self.spark.sparkContext
        if self.region is not None:  # this thread's Spark jobs share the cores fairly
            sc.setLocalProperty("spark.scheduler.pool", self.region)
        self._task_attempts = int(sc.getConf().get("spark.task.maxFailures", "4"))
        if uses_placement(str(sc.master)) and load_helper(sc):
            fail_futile_retries(sc)
            watch_lost_pods(sc)
            cfg = self.config
            self.placer = Placer(
                sc,
                self.job,
                cfg.state.local_dir,
                cfg.local_recovery.executor_wait_ms,
                cfg.local_recovery.standby,
            )
            self.placement = self.placer.tracker
            if cfg.local_recovery.standby:
                self.standby = StandbyAssigner(self.store, self.status.standby_copies.note)
            self.in_flight.alive = lambda: live_executors(sc)
        if startup.spark_ready_ms is None:
            startup.spark_ready_ms = now_ms()
        self.status.state = JobState.RECOVERING
        try:
            self.recovery.start(restore_target)
            startup.recovered_ms = now_ms()
            self.status.state = JobState.RUNNING
            self._loop()
        except BaseException:
            self.status.state = JobState.FAILED
            self.savepoints.close("failed", f"{self.recovery.label} failed")
            raise
        finally:
            self.planner.close()
            if self.standby is not None:  # its Spark job ends before the session may stop
                self.standby.wait_sent(STANDBY_ORDERS_WAIT_S)
        self.savepoints.close(
            self.status.state.value.lower(), "the job ended before the savepoint was taken"
        )
        return self.status

    # ------------------------------------------------------------------ the loop

    def _loop(self) -> None:
        while not self._stop:
            try:
                request = self.savepoints.next()
                if request is not None:
                    self._take_savepoint(request)
                    continue
                if self.planner.finished():
                    self._settle(self.in_flight.wait(0))
                    uncommitted = sorted({e for es in self.output.pending.values() for e in es})
                    if uncommitted:
                        # The last epoch's checkpoint failed: its output (and maybe earlier
                        # epochs') would never be committed. Fail over: the replay ends with
                        # a checkpoint again, under the restart strategy.
                        raise RuntimeError(
                            f"the input is finished, but the output of epochs "
                            f"{uncommitted[0]}-{uncommitted[-1]} is not committed: the last "
                            f"checkpoint failed"
                        )
                    self.finished_work = True
                    self.status.state = JobState.FINISHED
                    if self.may_end is None or self.may_end():
                        return
                    time.sleep(self.config.epoch.idle_wait_ms / 1000)
                    continue
                paused = self.split_failover.paused() if self.split_failover else set()
                plan = self.planner.plan(frozenset(paused))
                if plan is None:
                    self._settle(self.in_flight.poll())
                    time.sleep(self.config.epoch.idle_wait_ms / 1000)
                    continue
                guard(f"epoch {self.next_epoch()}")
                self._run_epoch(plan)
                self.recovery.epoch_completed()
            except JobFailed:  # a split's failover gave up (split_failover.py)
                self._settle(self.in_flight.abort_all("the job failed"))
                self.recovery.discard_staged()
                raise
            except Exception as exc:
                self._settle(self.in_flight.abort_all(f"the job fails over: {exc}"[:500]))
                self.recovery.failover(exc)
        self._settle(self.in_flight.wait(0))

    def _take_savepoint(self, request: SavepointRequest) -> None:
        cfg = self.config
        try:
            meta = take_savepoint(request, self, cfg.savepoint, cfg.s3)
        except SavepointRefused:  # logged, and the request says why: the job goes on
            if request.part is not None:
                request.part.give(False)
            return
        if request.stop and request.part is not None and not request.part.wait(self._stopping):
            log.info("region '%s' goes on: the job's savepoint failed", self.region)
            return
        if request.stop:
            self.stop()
            self.status.state = JobState.STOPPED
            self.status.stopped_with_savepoint = request.location
        log.debug("savepoint epoch %d done", meta.epoch)

    # SavepointRunner
    def next_epoch(self) -> int:
        return self.recovery.position.epoch + 1

    def run_savepoint_epoch(self, task: SavepointTask) -> SavepointEpoch:
        paused = self.split_failover.paused() if self.split_failover else set()
        result = self._run_epoch(self.planner.empty_plan(frozenset(paused)), savepoint=task)
        outcomes = result.outcomes + self._settle(self.in_flight.wait(0))
        completed = {o.checkpoint_id for o in outcomes if o.meta is not None}
        return SavepointEpoch(
            result.epoch,
            result.states,
            self.planner.to_json(),
            checkpoint_failed=bool(result.checkpoint_id) and result.checkpoint_id not in completed,
        )

    # ------------------------------------------------------------------ one epoch

    def _run_epoch(self, plan: Plan, savepoint: SavepointTask | None = None) -> EpochResult:
        spec = self._spec(plan, savepoint)
        started = time.monotonic()
        placement = None
        if self.placer is not None:
            local = local_restore(
                self.recovery.position.target,
                self.store,
                self.parallelism.operators,
                self.config.local_recovery.enabled,
            )
            placement = self.placer.for_epoch(self.parallelism.operators, local)
            self._check_resumable(placement)
            spec = replace(spec, pinned=placement.pinned)
            if self.standby is not None:
                spec = replace(spec, standby=self._standby_orders(placement, spec.local_dir))
        where = f"{self.job} region {self.region}" if self.region else self.job
        group = f"{self.region}-epoch-{spec.epoch}" if self.region else f"epoch-{spec.epoch}"
        reports = run_epoch_job(self.spark, spec, group, f"{where} epoch {spec.epoch}", placement)
        result = self._advance(spec, reports, started)
        if self.status.startup.first_epoch_ms is None:
            self.status.startup.first_epoch_ms = now_ms()
        for listener in self._listeners:
            listener(result)
        return result

    def _check_resumable(self, placement: EpochLocations) -> None:
        """Fail over now, without running the epoch, when subtasks handed to their standby
        copies cannot continue it: a standby copy is of the latest *completed* checkpoint, and
        the job went on past it (with asynchronous uploads, the executor was lost while its
        checkpoint was in flight). The epoch's keyed task would only fail with the same error
        after its Spark job ran (measured: 1.7 s of a 3.7 s recovery at 1 GB). Only where
        executors are pods: each keeps its state on its own volume, so no other executor has
        the lost one's database (``local-cluster`` executors share a disk, and may)."""
        position = self.recovery.position
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

    def _standby_orders(self, placement: EpochLocations, local_dir: str) -> StandbyTask | None:
        """This epoch's standby copies (``cluster/standby.py``): in the spec for the executors
        its keyed tasks run on, sent now to the others; and shown in the placement status."""
        assert self.standby is not None and self.placer is not None
        nodes = {**self.standby.nodes, **self.placer.tracker.nodes()}
        task = self.standby.orders(
            placement, self.parallelism.operators, self.coordinator.latest, nodes
        )
        if task is not None:
            self.standby.send_to_idle(self.spark.sparkContext, task, placement, self.job, local_dir)
            nodes = {**self.standby.nodes, **nodes}
        self.placer.tracker.standby = {
            key: (executor, nodes.get(executor, ""))
            for key, executor in self.standby.assigned.items()
        }
        return task

    def _spec(self, plan: Plan, savepoint: SavepointTask | None) -> EpochSpec:
        position = self.recovery.position
        checkpoint = None
        ck = self.config.checkpoint
        due = self.schedule.due(self.planner.is_last(plan), len(self.in_flight.ids()))
        if due or (savepoint is not None and ck.enabled):
            self._settle(self.in_flight.wait(ck.max_concurrent - 1))
            self.schedule.triggered()
            base, previous = incremental_base(
                self.in_flight.newest(),
                position.target,
                self.store,
                self.parallelism.operators,
                ck.incremental,
            )
            checkpoint = CheckpointTask(
                self.coordinator.new_checkpoint_id(),
                self.store,
                ck.incremental,
                previous,
                keep_local=self.config.local_recovery.enabled,
                async_upload=ck.async_upload,
                deadline_ms=now_ms() + ck.timeout_ms,
                base_in_flight=base,
                inline_max_bytes=ck.inline_max_bytes,
            )
        verify, position.verify_states = position.verify_states, False
        target = position.target
        latest = self.coordinator.latest
        return EpochSpec(
            job=self.job,
            epoch=position.epoch + 1,
            base_epoch=position.epoch,
            processing_time_ms=now_ms(),
            pipeline=self.pipeline,
            parallelism=self.parallelism.operators,
            max_parallelism=self.parallelism.max_parallelism,
            local_dir=self.config.state.local_dir,
            rocksdb=self.config.state.rocksdb,
            warm_entries=self.config.state.warm_cache_entries,
            ranges=plan,
            split_max_ts=self.planner.max_timestamps(),
            checkpoint=checkpoint,
            restore=(
                restore_task(
                    target,
                    self.parallelism.operators,
                    self.store if self.config.local_recovery.enabled else None,
                )
                if target
                else None
            ),
            savepoint=savepoint,
            verify_states=verify,
            allow_non_restored_state=self.config.restore.allow_non_restored_state,
            completed_checkpoint=latest.checkpoint_id if latest else 0,
            in_flight=self.in_flight.ids(),
            split_failover_attempts=self._task_attempts if self.split_failover else 0,
            commits=dict(position.commits),
            warm_key=self.warm_key,
        )

    def _keyed_tasks_done(self, epoch: int, states: list[StateReport]) -> None:
        """Placement and restores of an epoch's keyed tasks: status, metrics and the log."""
        placed = (
            self.placement.record(states, self.parallelism.operators)
            if self.placement is not None
            else None
        )
        self.status.keyed_tasks_done(epoch, states, placed)

    def _advance(self, spec: EpochSpec, reports: list[Report], started: float) -> EpochResult:
        """Steps 3-4 of the module docstring."""
        reads = [r for r in reports if isinstance(r, SplitReport)]
        ranges = spec.ranges
        failures = [r for r in reports if isinstance(r, SplitFailure)]
        if failures and self.split_failover is not None:  # read again after their delay
            failed = {(f.uid, f.split) for f in failures}
            ranges = {u: [r for r in rs if (u, r.split) not in failed] for u, rs in ranges.items()}
            try:
                self.split_failover.failed(failures)
            finally:
                self.status.last_error = self.split_failover.last_error
            self.status.restarts += len(failures)
        if self.split_failover is not None:
            self.split_failover.read(reads)
        records_in = self.planner.advance(ranges, reads)
        records_out = self.output.add([r for r in reports if isinstance(r, SinkReport)])
        states = [r for r in reports if isinstance(r, StateReport)]
        self.status.records_in += records_in
        self.status.records_out += records_out
        self.recovery.position.epoch = self.status.epoch = spec.epoch
        self.recovery.position.commits.update({(r.uid, r.subtask): r.commit for r in states})
        self._keyed_tasks_done(spec.epoch, states)
        self.schedule.epoch_done()
        outcomes: list[Outcome] = []
        if spec.checkpoint is not None:
            cid = spec.checkpoint.checkpoint_id
            draft = assemble_checkpoint(
                self.job,
                CheckpointRequest(
                    cid, spec.epoch, spec.checkpoint.incremental, self.recovery.lineage
                ),
                self.parallelism.operators,
                self.parallelism.max_parallelism,
                states,
                self.planner.to_json(),
                self.output,
                self.coordinator,
            )
            if isinstance(draft, str):
                outcomes.append(Outcome(cid, spec.epoch, None, draft))
            elif spec.checkpoint.async_upload:
                self.in_flight.add(draft, states, started, spec.checkpoint.base_in_flight)
            else:
                done = finish_checkpoint(draft, uploaded_files(states), self.coordinator, started)
                meta = done if isinstance(done, CheckpointMetadata) else None
                outcomes.append(Outcome(cid, spec.epoch, meta, None if meta else str(done)))
        elif not self.config.checkpoint.enabled:
            self.output.commit_upto(spec.epoch)  # no checkpoints: output is at-least-once
        outcomes += self.in_flight.poll()
        self._settle(outcomes)
        return EpochResult(
            spec.epoch,
            spec.savepoint is not None,
            records_in,
            records_out,
            time.monotonic() - started,
            states,
            spec.checkpoint.checkpoint_id if spec.checkpoint else 0,
            outcomes,
            self.region,
        )

    def _settle(self, outcomes: list[Outcome]) -> list[Outcome]:
        """Record checkpoints that completed or failed, in order; for each completed one,
        sinks commit what it covers (``completion.commit_completed``)."""
        for o in outcomes:
            if o.meta is None:
                self.history.failed(o.checkpoint_id, o.epoch, o.error or "")
                self.status.failed_checkpoints += 1
                self.schedule.checkpoint_failed()
                continue
            self.recovery.checkpoint_completed(o.meta)
            self.history.completed(o.meta)
            self.status.checkpoints += 1
            self.status.last_checkpoint = o.meta
            self.schedule.checkpoint_done()
            commit_completed(o.meta, self.output, self.coordinator)
            for listener in self._checkpoint_listeners:
                listener(o.meta)
        self.status.in_flight_checkpoints = tuple(sorted(self.in_flight.ids()))
        return outcomes
