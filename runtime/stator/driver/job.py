"""The job: every job is a set of failover regions, each run by its own epoch loop
(``epoch_loop.py``); a job of one region, or with ``failover.strategy=full``, is the case of
one region, whose checkpoints are at the job's root (as Flink models a full restart as one
failover strategy among others). What several regions need besides is in ``regions.py``.

The job owns what is not one region's: the keyed parallelism (resolved once here and handed
to each region), the preflight checks and the restore plan, Spark's start, the hand-over of
a pre-started driver, the savepoint queue, the listeners, the control API's views
(``control/view.py``), stop and close. Thread-safe entry points for other threads (the
control API): :meth:`Job.stop`, :meth:`Job.request_savepoint`, reading :attr:`Job.status`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from ..api.graph import PipelineGraph
from ..api.nodes import SinkNode
from ..checkpoint.coordinator import now_ms
from ..checkpoint.metadata import CheckpointMetadata
from ..cluster.jvm import live_executors
from ..config import LONG_RUNNING, JobConfig
from ..lineage import Target
from ..locality.placement import PlacementTracker
from ..longrun.driver import session_config
from ..storage import ObjectStore, open_store
from .epoch_loop import RegionLoop
from .handover import Handover, HandoverRequest
from .job_metrics import JobMetrics
from .listeners import CheckpointListener, EpochListener, Listeners
from .parallelism import Parallelism, resolve_parallelism
from .preflight import check_storage, restore_target
from .regions import (
    POLL_S,
    MergedHistory,
    lost_state,
    merged_status,
    plan_restores,
    take_savepoint,
)
from .savepoints import SavepointRequest, SavepointRequests
from .spark_session import share_python_path, starts_executor_pods, warm_python_workers
from .status import CheckpointHistory, JobState, JobStatus, StartupTimes

log = logging.getLogger("stator.driver")

# A pre-started driver waiting for its hand-over warms its Python workers again this often
# (Spark ends a worker that idled for a minute).
WARM_AGAIN_S = 30.0

RestorePlan = dict[str | None, Target | None]  # region id (None: the whole job) -> its source


def checkpoint_root(config: JobConfig, job: str, region: str | None = None) -> str:
    """Where a job's checkpoints are: ``<checkpoint.storage>/<job>``, and each failover
    region's under ``regions/<region>/`` in a job of several regions (``regions.py``)."""
    root = f"{config.checkpoint.storage.rstrip('/')}/{job}"
    return f"{root}/regions/{region}" if region else root


class Job:
    """Runs a pipeline (module docstring)."""

    def __init__(
        self,
        pipeline: PipelineGraph,
        config: JobConfig,
        spark: Any = None,
        python_path: Sequence[str] = (),
        await_handover: bool = False,
    ) -> None:
        """``python_path``: where the pipeline's module was imported from; Spark's Python
        workers get it too (``loader.py`` says why). ``await_handover``: a pre-started driver,
        see :meth:`await_handover`."""
        pipeline.validate()
        self.pipeline, self.config, self.spark = pipeline, config, spark
        self.python_path = tuple(python_path)
        self.job = config.name or pipeline.name
        self.parallelism: Parallelism = resolve_parallelism(pipeline, config)
        self.store: ObjectStore = open_store(checkpoint_root(config, self.job), config.s3)
        self.savepoints = SavepointRequests(config.savepoint.dir, config.savepoint.any_target)
        self.handover = Handover() if await_handover else None
        self.startup = StartupTimes()
        self.started_ms = now_ms()
        self.listeners = Listeners()
        # Every region's metrics, in one object (driver/job_metrics.py); state bytes come
        # from each completed checkpoint.
        self.metrics = JobMetrics()
        self.listeners.checkpoint.append(self.metrics.checkpointed)
        self._owns_spark = spark is None
        parts = pipeline.split()
        self.regional = len(parts) > 1 and config.failover.strategy != "full"
        if self.regional:
            self.loops = [
                RegionLoop(
                    r.pipeline,
                    config,
                    self.parallelism.restricted(r.uids()),
                    open_store(checkpoint_root(config, self.job, r.id), config.s3),
                    JobStatus(self.job, metrics=self.metrics),
                    SavepointRequests(config.savepoint.dir, config.savepoint.any_target),
                    self.listeners,
                    r.id,
                )
                for r in parts
            ]
        else:  # one region: the whole job, at the job's root, sharing the job's queue
            status = JobStatus(self.job, startup=self.startup, metrics=self.metrics)
            self.loops = [
                RegionLoop(
                    pipeline,
                    config,
                    self.parallelism,
                    self.store,
                    status,
                    self.savepoints,
                    self.listeners,
                )
            ]
        for loop in self.loops:
            loop.may_end = self._all_finished
        # A job of several regions: region id -> its loop (empty for a job of one).
        self.regions = {loop.region: loop for loop in self.loops if loop.region is not None}
        self._failure: tuple[str, BaseException] | None = None  # the region that ended the job
        self._stopped_with: str | None = None
        self._standby = False  # waiting for the hand-over
        # Where the keyed subtasks of a job of one region run (several executors; known
        # once Spark is).
        self.placement: PlacementTracker | None = None
        self._lock = threading.Lock()
        self._plan: RestorePlan = {}  # what check_restore_source found
        self._lost: dict[str, list[str]] = {}  # executor lost -> regions that held state there
        self._next_look = 0.0  # monotonic: when to look for lost executors again

    # ------------------------------------------------------------------ requests, listeners

    def on_epoch(self, listener: EpochListener) -> None:
        """Call ``listener`` after every epoch of every region (``EpochResult.region``), in
        that region's thread; it may call :meth:`stop` or :meth:`request_savepoint`."""
        self.listeners.epoch.append(listener)

    def on_checkpoint(self, listener: CheckpointListener) -> None:
        """Call ``listener`` with every checkpoint that completes (in its region's thread)."""
        self.listeners.checkpoint.append(listener)

    def stop(self) -> None:
        """Stop after the current epoch."""
        for loop in self.loops:
            loop.stop()

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

    # ------------------------------------------------------------------ the JobView

    @property
    def status(self) -> JobStatus:
        """A job of one region: its status; else one out of the regions' (a new object on
        every read)."""
        if not self.regional:
            return self.loops[0].status
        with self._lock:
            failure = self._failure
        return merged_status(
            self.job,
            self.regions,
            self.started_ms,
            self.startup,
            failure,
            self._stopped_with,
            self._standby,
        )

    @property
    def history(self) -> CheckpointHistory | MergedHistory:
        return MergedHistory(self.regions) if self.regional else self.loops[0].checkpoints.history

    def retained_checkpoints(self) -> list[CheckpointMetadata]:
        metas = [m for loop in self.loops for m in loop.coordinator.completed]
        return sorted(metas, key=lambda m: m.created_ms) if self.regional else metas

    def region_views(self) -> list[dict[str, Any]]:
        """One entry per failover region, as the control API and the operator show it. The
        one region of a job with ``failover.strategy=full`` is shown as the regions of its
        graph, sharing its state (they restart together)."""
        if not self.regional:
            view = region_view(self.loops[0])
            return [
                {**view, "id": region.id, "nodes": region.pipeline.regions()[0]}
                for region in self.pipeline.split()
            ]
        views = [region_view(loop) for loop in self.loops]
        with self._lock:
            lost = dict(self._lost)
        for view in views:
            view["lost_executors"] = sorted(e for e, rs in lost.items() if view["id"] in rs)
        return views

    # ------------------------------------------------------------------ preflight

    def check_storage(self) -> None:
        check_storage(self.job, self.config, self.store)

    def preflight(self) -> RestorePlan:
        """``preflight.py``: everything that can be checked before Spark starts."""
        plan = self.check_restore_source()
        self.check_storage()
        return plan

    def check_restore_source(self) -> RestorePlan:
        """Preflight step 2: what each region restores from; :meth:`run` restores from it."""
        if self.regional:
            by_id = plan_restores(self.job, self.config, self.parallelism, self.store, self.regions)
            self._plan = {rid: target for rid, target in by_id.items()}
        else:
            sources = set(self.loops[0].planner.sources)
            target = restore_target(
                self.job, self.config, self.parallelism, self.store, sources, whole_job=True
            )
            self._plan = {None: target}
        return self._plan

    # ------------------------------------------------------------------ running

    def await_handover(self, start_executors: bool = False) -> HandoverRequest:
        """A pre-started driver: start what does not touch the job's state while the old
        driver still runs, then wait for the hand-over and restore from what it names
        (``handover.py``). Spark, with warm Python workers that hold clients of the job's
        stores, starts now unless its executors are pods that the old driver's executors
        hold (their StatefulSet and claims, until the old driver is gone); with
        ``start_executors`` they are a set of its own, and start now too."""
        assert self.handover is not None, "built without await_handover"
        self.startup.driver_started_ms = now_ms()
        warm = start_executors or not starts_executor_pods(self.config.spark)
        connect = self._connections()
        if warm:
            self._start_spark()
            warm_python_workers(self.spark, connect)
            self.startup.spark_ready_ms = now_ms()
        self._standby = True
        if not self.regional:
            self.loops[0].status.state = JobState.STANDBY
        log.info("pre-started: waiting for the hand-over (POST /v1/handover)")
        while (request := self.handover.wait(WARM_AGAIN_S)) is None:
            if warm:  # Spark ends Python workers that idled for a minute
                warm_python_workers(self.spark, connect)
        self.startup.handover_ms = now_ms()
        restore = replace(
            self.config.restore,
            source=request.restore,
            allow_non_restored_state=request.allow_non_restored_state,
            force_empty=False,
        )
        self.config = replace(self.config, restore=restore)
        for loop in self.loops:
            loop.config = loop.recovery.config = self.config
            loop.status.state = JobState.CREATED
        self._standby = False
        log.info("handed over: restoring from %s", request.restore)
        return request

    def _connections(self) -> list[Callable[[], None]]:
        """What tasks connect to: the checkpoint and savepoint stores, and the sinks."""
        cfg = self.config
        out: list[Callable[[], None]] = []
        for loop in self.loops:
            stores = [loop.store, open_store(cfg.savepoint.dir, cfg.s3)]
            sinks = [n.sink for n in loop.pipeline.nodes if isinstance(n, SinkNode)]
            out += [s.connect for s in stores] + [s.connect for s in sinks]
        return out

    def _start_spark(self) -> None:
        if self.spark is None:
            from .spark_session import create_session  # noqa: PLC0415 - starts a JVM

            spark_cfg = self.config.spark
            if self.config.epoch.tasks == LONG_RUNNING:
                spark_cfg = session_config(spark_cfg)
            if self.regional:  # each region's jobs in a pool of its own
                spark_cfg = replace(
                    spark_cfg, conf={"spark.scheduler.mode": "FAIR", **spark_cfg.conf}
                )
            self.spark = create_session(spark_cfg, f"stator-{self.job}")
        share_python_path(self.spark, self.python_path)

    def run(self, plan: RestorePlan | None = None) -> JobStatus:
        """Run until the job stops, ends or fails. ``plan``: what preflight found for
        ``restore.source`` (it is not read again; default: what :meth:`check_restore_source`
        found). A job of one region runs in this thread; several, one thread each."""
        plan = plan or self._plan
        if self.startup.driver_started_ms is None:
            self.startup.driver_started_ms = now_ms()
        self._start_spark()
        for loop in self.loops:
            loop.attach(self.spark)
        self.placement = None if self.regional else self.loops[0].placement
        if self.startup.spark_ready_ms is None:
            self.startup.spark_ready_ms = now_ms()
        if not self.regional:
            return self.loops[0].run(plan.get(None))
        threads = [
            threading.Thread(
                target=self._run_region, args=(loop, plan.get(loop.region)), name=f"region-{rid}"
            )
            for rid, loop in self.regions.items()
        ]
        for t in threads:
            t.start()
        try:
            while any(t.is_alive() for t in threads):
                request = self.savepoints.next()
                if request is not None:
                    if take_savepoint(
                        request,
                        self.job,
                        self.config,
                        self.parallelism,
                        self.regions,
                        lambda: self._failure[0] if self._failure else None,
                    ):
                        self._stopped_with = request.location
                elif self._failure is not None:
                    self.stop()
                self._notice_lost_executors()
                time.sleep(POLL_S)
            self._next_look = 0.0  # one last look: a loss in the last second still counts
            self._notice_lost_executors()
        finally:
            self.stop()
            for t in threads:
                t.join()
        if self._failure is not None:
            self.savepoints.close("failed", "the job failed")
            raise self._failure[1]
        st = self.status
        self.savepoints.close(
            st.state.value.lower(), "the job ended before the savepoint was taken"
        )
        return st

    def _run_region(self, loop: RegionLoop, target: Target | None) -> None:
        rid = loop.region or self.job
        try:
            loop.run(target)
        except BaseException as exc:  # handed to the job's thread, raised there
            loop.savepoints.close("failed", f"region '{rid}' failed")
            with self._lock:
                if self._failure is None:
                    self._failure = (rid, exc)
                    log.error("region '%s' failed for good; stopping the job's other regions", rid)
            self.stop()

    def _notice_lost_executors(self) -> None:
        """Step 4 of ``regions.py`` (at most once a second; several executors only)."""
        trackers = {r: loop.placement for r, loop in self.regions.items() if loop.placement}
        if not trackers or self.spark is None or time.monotonic() < self._next_look:
            return
        self._next_look = time.monotonic() + 1.0
        left = {r: t.take_left() for r, t in trackers.items()}  # before listing the live ones
        try:
            live = set(live_executors(self.spark.sparkContext))
        except Exception as exc:  # Spark is stopping, or busy: look again later
            log.debug("could not list the live executors: %s", exc)
            for r, moved in left.items():  # keep them for the next look
                for executor, subtasks in moved.items():
                    trackers[r].give_back(executor, subtasks)
            return
        for executor, regions in lost_state(trackers, live, left).items():
            if executor in self._lost:
                continue
            with self._lock:
                self._lost[executor] = sorted(regions)
            held = "; ".join(f"region '{r}': {', '.join(s)}" for r, s in sorted(regions.items()))
            log.warning(
                "executor %s was lost holding local state of %s: those regions restart from "
                "their latest checkpoints, the others are not affected",
                executor,
                held,
            )

    def _all_finished(self) -> bool:
        return all(loop.finished_work for loop in self.loops)


def region_view(loop: RegionLoop) -> dict[str, Any]:
    """One region (or the whole job) as the control API and the operator show it."""
    st, latest = loop.status, loop.status.last_checkpoint
    return {
        "id": loop.region or loop.job,
        "nodes": [name for part in loop.pipeline.regions() for name in part],
        # Waiting out a restart delay or rewinding: the region does not process.
        "state": JobState.RECOVERING if loop.recovery.restarting else st.state,
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
        "storage": loop.store.uri,
        # Per source split that failed over on its own (a job without keyed operators).
        "splits": loop.split_failover.to_json() if loop.split_failover else [],
    }
