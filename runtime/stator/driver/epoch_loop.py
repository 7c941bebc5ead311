"""The epoch loop of one failover region (a whole job is the case of one region, ``job.py``):
it only runs epochs; the job around it starts Spark, hands over, checks before starting,
queues savepoints and answers the control API.

One epoch:

1. Plan (``planning.py``): every unfinished split gets a range (possibly empty: it still
   carries the split's watermark), within the epoch's budget (``epoch_budget.py``: the
   records of ``epoch.max_ms``, measured after each epoch). Nothing to read and nothing
   finishing -> wait, re-plan.
2. Run (``sparkjob.py``): source tasks -> shuffle by key-group -> keyed tasks -> ... ->
   sinks, as one Spark job; with ``epoch.tasks: long-running``, the same tasks fed the
   epoch in a Spark job that stays up across epochs (``longrun/driver.py``). Keyed tasks
   commit their state for the epoch atomically (``tasks/keyed.py``); if a checkpoint is
   due they also snapshot and upload.
3. Advance: source positions move to the ranges' ends; staged sink output joins the output
   pending commit (``completion.py``).
4. Checkpoint (if due, ``completion.py``): the coordinator completes it (metadata last),
   then sinks commit every epoch it covers. With asynchronous uploads (the default) it is
   in flight instead (``in_flight.py``): it completes at the end of a later epoch, when every
   upload is confirmed; an epoch that takes a checkpoint first waits while
   ``checkpoint.max_concurrent`` are in flight. A failed checkpoint is aborted; processing
   goes on, unless more fail in a row than ``checkpoint.tolerable_failures`` or an epoch's
   output waits longer than ``checkpoint.progress_window_ms`` for one: then the region fails
   over (``checkpoint_health.py``, checked before each step of the loop).
5. Listeners registered with :meth:`Job.on_epoch <stator.driver.job.Job.on_epoch>` see the
   result; those registered with ``Job.on_checkpoint`` see every checkpoint that completed.

Between epochs the loop takes queued savepoints (``savepoints.py``); a savepoint, a stop and
the end of a bounded job first wait for the checkpoints in flight. A failed epoch fails over
(``recovery.py``): checkpoints in flight are aborted (their epochs will be replayed) and the
region rewinds to its latest completed checkpoint.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from .. import failpoints
from ..api.graph import PipelineGraph
from ..api.nodes import KeyedNode, SinkNode, SourceNode
from ..checkpoint.coordinator import CheckpointCoordinator, now_ms
from ..checkpoint.ownership import Ownership
from ..cluster.jvm import live_executors, load_helper
from ..config import LONG_RUNNING, JobConfig
from ..epoch.phases import phases
from ..epoch.reports import Report, SinkReport, SplitFailure, SplitReport, StateReport
from ..epoch.spec import EpochSpec, SavepointTask
from ..errors import JobFailed
from ..ha.fencing import guard
from ..keygroups import SubtaskId
from ..lineage import Target
from ..locality.placement import PlacementTracker, uses_placement
from ..longrun.driver import LongRunningTasks
from ..sinks.base import SinkContext
from ..storage import ObjectStore
from .checkpointing import RegionCheckpoints
from .completion import PendingOutput
from .heap import freeze_startup_heap
from .listeners import EpochResult, Listeners
from .parallelism import Parallelism
from .placing import Placing
from .planning import EpochPlanner, Plan
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
from .status import JobState, JobStatus

log = logging.getLogger("stator.driver")

# How long a job that ends waits for standby orders still being handed to idle executors.
STANDBY_ORDERS_WAIT_S = 10.0


def epoch_processing_time(epoch: int) -> int:
    """The processing time an epoch's records, timers and state TTL see: the wall clock when
    the driver plans the epoch. Tests replace it (with a function of the epoch, a replayed
    epoch sees the same time)."""
    return now_ms()


class RegionLoop:
    """Runs the epochs of one failover region (``region`` None: the whole job, whose
    checkpoints are at the job's root). Built by :class:`~stator.driver.job.Job`, which
    resolved ``parallelism`` once and gives each region its part."""

    def __init__(
        self,
        pipeline: PipelineGraph,
        config: JobConfig,
        parallelism: Parallelism,
        store: ObjectStore,
        status: JobStatus,
        savepoints: SavepointRequests,
        listeners: Listeners,
        region: str | None = None,
    ) -> None:
        self.pipeline, self.config, self.parallelism = pipeline, config, parallelism
        self.store, self.status, self.savepoints = store, status, savepoints
        self.listeners, self.region = listeners, region
        self.job = status.job
        self.spark: Any = None  # the job's SparkSession, set before :meth:`run`
        ck = config.checkpoint
        self.coordinator = CheckpointCoordinator(store, ck.retained, Ownership(ck.owner, ck.adopt))
        self.planner = EpochPlanner(
            {n.uid: n for n in pipeline.nodes if isinstance(n, SourceNode)}, config.epoch
        )
        self.output = PendingOutput({n.uid: n for n in pipeline.nodes if isinstance(n, SinkNode)})
        self.output.on_commit = self._committed
        for uid, node in self.output.sinks.items():
            node.sink.bind(SinkContext(self.job, uid, store, config.checkpoint.enabled))
        self.recovery = Recovery(
            self.job,
            config,
            store,
            self.coordinator,
            parallelism,
            self.planner,
            self.output,
            status,
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
        self.checkpoints = RegionCheckpoints(
            self.coordinator,
            config,
            parallelism,
            self.planner,
            self.output,
            self.recovery,
            status,
            listeners.checkpoint,
        )
        self._stop = False
        self.long_running: LongRunningTasks | None = None  # epoch.tasks: long-running
        self.placing: Placing | None = None  # several executors (set when Spark is known)
        self.placement: PlacementTracker | None = None
        # Whether the region may end once its bounded sources are exhausted (the others may
        # still run: it serves savepoints until then).
        self.may_end: Callable[[], bool] = lambda: True
        self.finished_work = False
        # MACs the warm cache files of this loop's tasks (state/warm.py): random per
        # driver, so a file another pod planted on a state volume is never unpickled.
        self.warm_key = os.urandom(32)

    def stop(self) -> None:
        """Stop after the current epoch."""
        self._stop = True

    def _stopping(self) -> bool:
        return self._stop

    def _committed(self, sink: str, epoch: int) -> None:
        """A sink committed an epoch's output: its committed latency, if exactly-once."""
        if self.output.sinks[sink].sink.exactly_once:
            self.status.metrics.committed(self.region, sink, epoch, now_ms())

    # ------------------------------------------------------------------ running

    def attach(self, spark: Any) -> None:
        """The job's SparkSession: where this region's keyed subtasks run is decided per
        epoch when there are several executors (``placing.py``)."""
        self.spark, sc = spark, spark.sparkContext
        self._task_attempts = int(sc.getConf().get("spark.task.maxFailures", "4"))
        if self.config.epoch.tasks == LONG_RUNNING:
            self.long_running = LongRunningTasks.on_spark(spark)
        if not (uses_placement(str(sc.master)) and load_helper(sc)):
            return
        self.placing = Placing.start(
            spark, self.job, self.config, self.store, self.parallelism.operators, self.status
        )
        self.placement = self.placing.placer.tracker
        self.checkpoints.in_flight.alive = lambda: live_executors(sc)

    def run(self, restore_target: Target | None) -> JobStatus:
        """Run until the region stops, ends or fails, from ``restore_target`` (what the job's
        preflight found for ``restore.source``), once :meth:`attach` gave it Spark."""
        if self.region is not None:  # this thread's Spark jobs share the cores fairly
            self.spark.sparkContext.setLocalProperty("spark.scheduler.pool", self.region)
        standby = self.placing.standby if self.placing is not None else None
        self.status.state = JobState.RECOVERING
        try:
            self.recovery.start(restore_target)
            self.status.startup.recovered_ms = now_ms()
            self.status.state = JobState.RUNNING
            self._loop()
        except BaseException:
            self.status.state = JobState.FAILED
            self.savepoints.close("failed", f"{self.recovery.label} failed")
            raise
        finally:
            if self.long_running is not None:
                self.long_running.stop()
            self.planner.close()
            if standby is not None:  # its Spark job ends before the session may stop
                standby.wait_sent(STANDBY_ORDERS_WAIT_S)
        self.savepoints.close(
            self.status.state.value.lower(), "the job ended before the savepoint was taken"
        )
        return self.status

    def _loop(self) -> None:
        while not self._stop:
            try:
                self.checkpoints.check_health()  # failing checkpoints fail over
                request = self.savepoints.next()
                if request is not None:
                    self._take_savepoint(request)
                    continue
                if self.planner.finished():
                    self.checkpoints.drain()
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
                    if self.may_end():
                        return
                    time.sleep(self.config.epoch.idle_wait_ms / 1000)
                    continue
                paused = self.split_failover.paused() if self.split_failover else set()
                plan = self.planner.plan(frozenset(paused))
                self.status.source_lag = self.planner.lag()
                self.status.source_lag_ms = now_ms()
                if plan is None:
                    startup = self.status.startup
                    if startup.first_epoch_ms is None and startup.caught_up_ms is None:
                        startup.caught_up_ms = now_ms()  # idle since start-up: not down
                    self.checkpoints.poll()
                    time.sleep(self.config.epoch.idle_wait_ms / 1000)
                    continue
                guard(f"epoch {self.next_epoch()}")
                result = self._run_epoch(plan)
                self.planner.budget.observe(result.records_in, result.duration_s)
                self.recovery.epoch_completed()
            except JobFailed:  # a split's failover gave up (split_failover.py)
                self.checkpoints.abort_all("the job failed")
                self.recovery.discard_staged()
                raise
            except Exception as exc:
                self.checkpoints.abort_all(f"the job fails over: {exc}"[:500])
                self.recovery.failover(exc)
                self.checkpoints.restarted()
        self.checkpoints.drain()

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
        outcomes = result.outcomes + self.checkpoints.drain()
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
        if self.placing is not None:
            spec, placement = self.placing.place(
                spec, self.recovery.position, self.coordinator.latest
            )
        where = f"{self.job} region {self.region}" if self.region else self.job
        group = f"{self.region}-epoch-{spec.epoch}" if self.region else f"epoch-{spec.epoch}"
        submitted_ms = now_ms()
        description = f"{where} epoch {spec.epoch}"
        if self.long_running is not None:
            reports = self.long_running.run_epoch(spec, group, description, placement)
        else:
            reports = run_epoch_job(self.spark, spec, group, description, placement)
        job_end_ms = now_ms()
        failpoints.reach("driver.epoch-ran")  # output staged, checkpoint not yet acknowledged
        result = self._advance(spec, reports, started)
        result = replace(
            result, phases=phases(spec.planned_ms, submitted_ms, reports, job_end_ms, now_ms())
        )
        if self.status.startup.first_epoch_ms is None:
            self.status.startup.first_epoch_ms = now_ms()
            if self.spark is not None:
                freeze_startup_heap()
        for listener in self.listeners.epoch:
            listener(result)
        return result

    def _spec(self, plan: Plan, savepoint: SavepointTask | None) -> EpochSpec:
        position = self.recovery.position
        last = self.planner.is_last(plan)
        checkpoint = self.checkpoints.trigger(position.epoch + 1, last, savepoint is not None)
        verify = self.recovery.take_verify_states()
        target = position.target
        latest = self.coordinator.latest
        return EpochSpec(
            job=self.job,
            epoch=position.epoch + 1,
            base_epoch=position.epoch,
            processing_time_ms=epoch_processing_time(position.epoch + 1),
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
            in_flight=self.checkpoints.in_flight.ids(),
            split_failover_attempts=self._task_attempts if self.split_failover else 0,
            commits=dict(position.commits),
            warm_key=self.warm_key,
            planned_ms=now_ms(),
        )

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
        for rep in reads:
            if rep.rejected:
                letters = self.status.dead_letters
                letters[rep.uid] = letters.get(rep.uid, 0) + rep.rejected
        records_out = self.output.add([r for r in reports if isinstance(r, SinkReport)])
        states = [r for r in reports if isinstance(r, StateReport)]
        self.status.records_in += records_in
        self.status.records_out += records_out
        self.recovery.advance(spec.epoch, {SubtaskId(r.uid, r.subtask): r.commit for r in states})
        self.status.epoch = spec.epoch
        placed = (
            self.placement.record(states, self.parallelism.operators)
            if self.placement is not None
            else None
        )
        self.status.keyed_tasks_done(spec.epoch, states, placed)
        # Before the checkpoint: a checkpoint completing now commits this epoch's output.
        ran = time.monotonic() - started
        self.status.metrics.epoch_done(self.region, spec.epoch, reports, ran, now_ms())
        outcomes = self.checkpoints.after_epoch(self.job, spec, states, started)
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
