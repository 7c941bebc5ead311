"""A job of several failover regions (FLIP-1): each region runs on its own, so a failure in
one restarts that region alone while the others keep processing and committing.

A region is a weakly connected part of the graph (``Pipeline.split``): no record crosses
from one to another, so each can advance its own epochs, source positions, pending sink
output and checkpoints. Each is run by a :class:`~stator.driver.epoch_loop.JobDriver` on the
region's pipeline, with its checkpoints under ``<job>/regions/<region>/`` and its own restart
strategy; a job of one region, or with ``failover.strategy=full``, is one driver as before
(:func:`build_job`).

Running, step by step:

1. Before Spark: the restore source is planned per region (``layout.py`` for ``latest``; an
   explicit savepoint or checkpoint is checked against the whole job, then each region takes
   its part of it: ``Target.part_for``); storage is checked once.
2. One SparkSession with FAIR scheduling; each region's thread submits its epochs in a pool
   of its own, so a region that recovers does not queue the others' tasks behind its own.
3. A failed epoch fails over its own region only (``recovery.py``: task retries first, then
   the region's restart strategy, then it rewinds to its latest checkpoint).
4. An executor that is lost held local state of some regions: the job says which (a log
   line, and ``lost_executors`` in each such region's view). Exactly those restart: each
   one's epoch with a task on it fails, or its next epoch finds the state gone and rewinds
   that region to its latest checkpoint; the other regions are not touched.
5. A region that fails for good (its strategy gave up, or a failure no restart can fix) ends
   the job: the others stop after their current epoch, with their checkpoints in flight
   settled, and the job fails with that region's error (as a Flink job does when a region's
   restart strategy gives up).
6. A region whose bounded sources are exhausted waits, serving savepoints and stops, until
   every region is done: the job finishes when all have.
7. A savepoint is one directory with one part per region (``savepoints.py``), its metadata
   written by this class once every part is there. A stop-with-savepoint holds each region
   after its part until every part is taken, then stops all; if one part fails, the
   savepoint fails and every region goes on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from ..api.pipeline import Pipeline, Region
from ..checkpoint.coordinator import now_ms
from ..checkpoint.metadata import CheckpointMetadata
from ..cluster.fencing import guard
from ..cluster.jvm import live_executors
from ..cluster.placement import PlacementTracker
from ..cluster.session import share_python_path, starts_executor_pods, warm_python_workers
from ..config import JobConfig
from ..errors import ConfigError, StatorError
from ..lineage import Target, has_run, load_target, savepoint_location
from ..savepoint.metadata import METADATA_NAME
from ..savepoint.native import remove_strays
from ..storage import ObjectStore, open_store
from .epoch_loop import WARM_AGAIN_S, CheckpointListener, EpochListener, JobDriver, checkpoint_root
from .handover import Handover, HandoverRequest
from .layout import check_covers, check_regions
from .parallelism import Parallelism, resolve_parallelism
from .preflight import check_files, check_storage
from .restore import check_compatible
from .savepoints import (
    PartVerdict,
    SavepointRequest,
    SavepointRequests,
    discard_failed,
    empty_target,
    merge_parts,
)
from .status import CheckpointOutcome, JobState, JobStatus, RestoreCounts, StartupTimes

log = logging.getLogger("stator.driver")

POLL_S = 0.05  # how often the job looks at its regions and its savepoint queue
Plan = dict[str, Target | None]  # region id -> what it restores from


def build_job(
    pipeline: Pipeline,
    config: JobConfig,
    spark: Any = None,
    python_path: Sequence[str] = (),
    await_handover: bool = False,
) -> JobDriver | RegionalJob:
    """One driver for a job of one region or with ``failover.strategy=full``; else one per
    region (module docstring)."""
    regions = pipeline.split()
    if len(regions) == 1 or config.failover.strategy == "full":
        return JobDriver(pipeline, config, spark, python_path, await_handover)
    return RegionalJob(pipeline, regions, config, spark, python_path, await_handover)


class RegionalJob:
    """Runs every region of a job in a thread of its own, and is the job to the control API
    (the same view a :class:`JobDriver` gives: ``control/view.py``)."""

    def __init__(
        self,
        pipeline: Pipeline,
        regions: list[Region],
        config: JobConfig,
        spark: Any = None,
        python_path: Sequence[str] = (),
        await_handover: bool = False,
    ) -> None:
        pipeline.validate()
        self.pipeline, self.config, self.spark = pipeline, config, spark
        self.python_path = tuple(python_path)
        self.job = config.name or pipeline.name
        self.parallelism: Parallelism = resolve_parallelism(pipeline, config)
        self.store: ObjectStore = open_store(checkpoint_root(config, self.job), config.s3)
        self.regions = {r.id: r for r in regions}
        self.drivers = {
            r.id: JobDriver(r.pipeline, config, spark, python_path, region=r.id) for r in regions
        }
        for d in self.drivers.values():
            d.may_end = self._all_finished
        self.savepoints = SavepointRequests(config.savepoint.dir, config.savepoint.any_target)
        self.handover = Handover() if await_handover else None
        self.placement: PlacementTracker | None = None
        self.startup = StartupTimes()
        self.started_ms = now_ms()
        self._owns_spark = spark is None
        self._standby = False
        self._failure: tuple[str, BaseException] | None = None  # the region that ended the job
        self._stopped_with: str | None = None
        self._lock = threading.Lock()
        self._plan: Plan = {}  # what check_restore_source found
        self._lost: dict[str, list[str]] = {}  # executor lost -> regions that held state there
        self._next_look = 0.0  # monotonic: when to look for lost executors again

    # ------------------------------------------------------------------ what the CLI calls

    def check_storage(self) -> None:
        check_storage(self.job, self.config, self.store)

    def preflight(self) -> Plan:
        plan = self.check_restore_source()
        self.check_storage()
        return plan

    def check_restore_source(self) -> Plan:
        """Step 1 of the module docstring (``preflight.py`` says why before Spark)."""
        cfg = self.config
        source = cfg.restore.source
        root = self.store.uri
        if source not in ("latest", "none"):
            try:
                whole = load_target(source, cfg.s3)
                check_files(whole)
            except StatorError:
                stores = [root, *(d.store.uri for d in self.drivers.values())]
                lineage = cfg.restore.lineage
                if not lineage or not any(has_run(uri, lineage, cfg.s3) for uri in stores):
                    raise
                log.warning("restore.source %s cannot be read; run %s resumes", source, lineage)
                self._plan = dict.fromkeys(self.regions)
                return self._plan
            self._check_compatible(whole)
            check_covers(whole, {uid for d in self.drivers.values() for uid in d.planner.sources})
            self._plan = {rid: whole.part_for(rid, r.uids()) for rid, r in self.regions.items()}
            return self._plan
        sources = {rid: set(d.planner.sources) for rid, d in self.drivers.items()}
        own = check_regions(self.job, root, sources, cfg.restore.allow_non_restored_state, cfg.s3)
        from .layout import newest_checkpoint  # noqa: PLC0415 - one helper, no cycle

        root_latest = newest_checkpoint(root, cfg.s3)
        if source == "none":
            if (own or root_latest) and not cfg.restore.force_empty:
                raise ConfigError(
                    f"restore.source=none but job '{self.job}' has checkpoints at {root}; "
                    f"restore from them (restore.source=latest) or set "
                    f"restore.force_empty=true to start a new lineage beside them"
                )
            self._plan = dict.fromkeys(self.regions)
            return self._plan
        plan: Plan = {}
        for rid, region in self.regions.items():
            mine = own.get(rid)
            driver = self.drivers[rid]
            older = mine is None or (root_latest and root_latest.created_ms > mine.created_ms)
            if root_latest is not None and older:
                whole = Target(root_latest, self.store)
                self._check_compatible(whole)
                plan[rid] = whole.part_for(rid, region.uids())
                log.info(
                    "region '%s' resumes from the job's %s (before it ran as regions)",
                    rid,
                    whole.describe(),
                )
            elif mine is not None:
                plan[rid] = own_target = Target(mine, driver.store)
                check_compatible(
                    own_target,
                    driver.parallelism.max_parallelism,
                    set(driver.parallelism.operators),
                    cfg.restore.allow_non_restored_state,
                )
            else:
                plan[rid] = None
        self._plan = plan
        return plan

    def _check_compatible(self, target: Target) -> None:
        check_compatible(
            target,
            self.parallelism.max_parallelism,
            set(self.parallelism.operators),
            self.config.restore.allow_non_restored_state,
        )

    # ------------------------------------------------------------------ the JobView

    def retained_checkpoints(self) -> list[CheckpointMetadata]:
        metas = [m for d in self.drivers.values() for m in d.retained_checkpoints()]
        return sorted(metas, key=lambda m: m.created_ms)

    def request_savepoint(
        self, target: str | None = None, stop: bool = False, format_type: str | None = None
    ) -> SavepointRequest:
        return self.savepoints.request(target, stop, format_type)

    def stop(self) -> None:
        for d in self.drivers.values():
            d.stop()

    def on_epoch(self, listener: EpochListener) -> None:
        """``listener`` sees every region's epochs (``EpochResult.region``), from the
        regions' threads."""
        for d in self.drivers.values():
            d.on_epoch(listener)

    def on_checkpoint(self, listener: CheckpointListener) -> None:
        for d in self.drivers.values():
            d.on_checkpoint(listener)

    @property
    def history(self) -> MergedHistory:
        return MergedHistory(self.drivers)

    def region_views(self) -> list[dict[str, Any]]:
        views = [d.region_view() for d in self.drivers.values()]
        with self._lock:
            lost = dict(self._lost)
        for view in views:
            view["lost_executors"] = sorted(e for e, rs in lost.items() if view["id"] in rs)
        return views

    @property
    def status(self) -> JobStatus:
        """The job's status out of its regions' (a new object on every read)."""
        parts = [d.status for d in self.drivers.values()]
        st = JobStatus(self.job, started_ms=self.started_ms, startup=self._startup(parts))
        st.state = self._state(parts)
        st.epoch = max(p.epoch for p in parts)
        for p in parts:
            st.records_in += p.records_in
            st.records_out += p.records_out
            st.checkpoints += p.checkpoints
            st.failed_checkpoints += p.failed_checkpoints
            st.restarts += p.restarts
            st.keyed_tasks_local += p.keyed_tasks_local
            st.keyed_tasks_total += p.keyed_tasks_total
            st.last_restores.update(p.last_restores)
            st.standby_copies.merge(p.standby_copies)  # one uploader serves every region
        st.in_flight_checkpoints = tuple(c for p in parts for c in p.in_flight_checkpoints)
        st.restores = RestoreCounts(
            sum(p.restores.local for p in parts),
            sum(p.restores.remote for p in parts),
            sum(p.restores.local_bytes for p in parts),
            sum(p.restores.remote_bytes for p in parts),
        )
        latest = [p.last_checkpoint for p in parts if p.last_checkpoint is not None]
        st.last_checkpoint = max(latest, key=lambda m: m.created_ms) if latest else None
        errors = [(rid, d.status.last_error) for rid, d in self.drivers.items()]
        if self._failure is not None:  # the error that ended the job, first
            rid, exc = self._failure
            errors.insert(0, (rid, self.drivers[rid].status.last_error or str(exc)[:600]))
        st.last_error = next((f"region '{r}': {e}" for r, e in errors if e), None)
        st.stopped_with_savepoint = self._stopped_with
        return st

    def _state(self, parts: list[JobStatus]) -> JobState:
        states = {p.state for p in parts}
        if self._failure is not None:
            return JobState.FAILED
        if self._standby:
            return JobState.STANDBY
        if all(s.ended for s in states) and JobState.STOPPED in states:
            return JobState.STOPPED
        if states == {JobState.FINISHED}:
            return JobState.FINISHED
        for s in (JobState.FAILED, JobState.CREATED, JobState.RECOVERING):
            if s in states:
                return s
        return JobState.RUNNING

    def _startup(self, parts: list[JobStatus]) -> StartupTimes:
        """The job's marks; a region-made mark counts once every region reached it."""

        def last(name: str) -> int | None:
            marks = [getattr(p.startup, name) for p in parts]
            return None if None in marks else max(m for m in marks if m is not None)

        return replace(
            self.startup, recovered_ms=last("recovered_ms"), first_epoch_ms=last("first_epoch_ms")
        )

    # ------------------------------------------------------------------ running

    def await_handover(self, start_executors: bool = False) -> HandoverRequest:
        """As :meth:`JobDriver.await_handover`, for every region at once."""
        assert self.handover is not None, "built without await_handover"
        self.startup.driver_started_ms = now_ms()
        warm = start_executors or not starts_executor_pods(self.config.spark)
        connect: list[Callable[[], None]] = [
            c for d in self.drivers.values() for c in d.connections()
        ]
        if warm:
            self._start_spark()
            warm_python_workers(self.spark, connect)
            self.startup.spark_ready_ms = now_ms()
        self._standby = True
        log.info("pre-started: waiting for the hand-over (POST /v1/handover)")
        while (request := self.handover.wait(WARM_AGAIN_S)) is None:
            if warm:
                warm_python_workers(self.spark, connect)
        self.startup.handover_ms = now_ms()
        for d in self.drivers.values():
            d.handed_over(request)
        self.config = self.drivers[next(iter(self.drivers))].config
        self._standby = False
        return request

    def _start_spark(self) -> None:
        if self.spark is None:
            from ..cluster.session import create_session  # noqa: PLC0415 - starts a JVM

            spark_cfg = self.config.spark
            conf = {"spark.scheduler.mode": "FAIR", **spark_cfg.conf}
            self.spark = create_session(replace(spark_cfg, conf=conf), f"stator-{self.job}")
        share_python_path(self.spark, self.python_path)
        for d in self.drivers.values():
            d.spark = self.spark

    def close(self) -> None:
        if self._owns_spark and self.spark is not None:
            self.spark.stop()
            self.spark = None

    def run(self, plan: Plan | None = None) -> JobStatus:
        """Steps 2-7 of the module docstring."""
        if self.startup.driver_started_ms is None:
            self.startup.driver_started_ms = now_ms()
        self._start_spark()
        if self.startup.spark_ready_ms is None:
            self.startup.spark_ready_ms = now_ms()
        plan = plan or self._plan
        threads = [
            threading.Thread(
                target=self._run_region, args=(rid, plan.get(rid)), name=f"region-{rid}"
            )
            for rid in self.drivers
        ]
        for t in threads:
            t.start()
        try:
            while any(t.is_alive() for t in threads):
                request = self.savepoints.next()
                if request is not None:
                    self._take_savepoint(request)
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
        ended = "the job ended before the savepoint was taken"
        self.savepoints.close(st.state.value.lower(), ended)
        return st

    def _run_region(self, rid: str, target: Target | None) -> None:
        driver = self.drivers[rid]
        try:
            driver.run(target)
        except BaseException as exc:  # handed to the job's thread, raised there
            driver.savepoints.close("failed", f"region '{rid}' failed")
            with self._lock:
                if self._failure is None:
                    self._failure = (rid, exc)
                    log.error("region '%s' failed for good; stopping the job's other regions", rid)
            self.stop()

    def _notice_lost_executors(self) -> None:
        """Step 4 of the module docstring (at most once a second; several executors only)."""
        trackers = {r: d.placement for r, d in self.drivers.items() if d.placement is not None}
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
        return all(d.finished_work for d in self.drivers.values())

    def _take_savepoint(self, request: SavepointRequest) -> None:
        """Step 7 of the module docstring."""
        started = time.monotonic()
        request.status, request.started_ms = "IN_PROGRESS", now_ms()
        cfg = self.config
        epoch = max(d.next_epoch() for d in self.drivers.values())
        location = request.target or savepoint_location(
            cfg.savepoint.dir, self.job, epoch, request.id
        )
        request.location = location
        parts = {
            rid: SavepointRequest(location, request.stop, request.format_type, part=PartVerdict())
            for rid in self.drivers
        }
        ours = None
        try:
            target = open_store(location, cfg.s3)  # before any part writes: is it empty?
            ours = empty_target(target)
            for rid, part in parts.items():
                self.drivers[rid].savepoints.enqueue_part(part)
            while any(p.status not in ("COMPLETED", "FAILED") for p in parts.values()):
                time.sleep(POLL_S)
            failed = [(rid, p) for rid, p in parts.items() if p.status == "FAILED"]
            if self._failure is not None:
                raise RuntimeError(f"region '{self._failure[0]}' failed meanwhile")
            if failed:
                raise RuntimeError(f"region '{failed[0][0]}': {failed[0][1].error}")
            merged = merge_parts(
                self.job, {rid: p.meta for rid, p in parts.items() if p.meta}, started
            )
            guard(f"savepoint {location}")
            target.put(METADATA_NAME, merged.to_json())
            remove_strays(target, merged)
        except BaseException as exc:
            for p in parts.values():
                if p.part is not None:
                    p.part.give(False)
            if not isinstance(exc, Exception):
                raise
            request.status, request.error = "FAILED", str(exc)[:2000]
            request.completed_ms = now_ms()
            log.warning("savepoint %s failed: %s", request.id, request.error)
            discard_failed(ours, self.parallelism.operators)
            return
        request.status, request.epoch = "COMPLETED", merged.epoch
        request.state_bytes, request.completed_ms = merged.state_bytes, now_ms()
        if request.stop:
            self._stopped_with = location
        for p in parts.values():
            if p.part is not None:
                p.part.give(request.stop)
        log.info(
            "savepoint %s complete at %s: %d regions, %d bytes in %d ms",
            request.id,
            location,
            len(parts),
            merged.state_bytes,
            merged.duration_ms,
        )


def lost_state(
    trackers: dict[str, PlacementTracker],
    live: set[str],
    left: dict[str, dict[str, list[str]]] | None = None,
) -> dict[str, dict[str, list[str]]]:
    """Executor id -> region -> its subtasks whose local state that executor held, for every
    executor not in ``live``: what it holds now, and what moved off it since the last look
    (``left``: region -> ``PlacementTracker.take_left()``), since a region may already have
    run its next epoch elsewhere when the loss is looked for."""
    out: dict[str, dict[str, list[str]]] = {}
    for region, tracker in trackers.items():
        held = {e: list(s) for e, s in tracker.held_on().items()}
        for executor, subtasks in (left or {}).get(region, {}).items():
            held.setdefault(executor, []).extend(subtasks)
        for executor, subtasks in held.items():
            if executor not in live:
                out.setdefault(executor, {})[region] = sorted(set(subtasks))
    return out


class MergedHistory:
    """Every region's recent checkpoint outcomes, newest last, each naming its region."""

    def __init__(self, drivers: dict[str, JobDriver]) -> None:
        self.drivers = drivers

    def items(self) -> list[CheckpointOutcome]:
        items = [
            replace(o, region=rid) for rid, d in self.drivers.items() for o in d.history.items()
        ]
        return sorted(items, key=lambda o: o.at_ms)
