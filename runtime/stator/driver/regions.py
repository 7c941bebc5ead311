"""What a job of several failover regions (FLIP-1) needs beyond one region's loop: each region
runs on its own, so a failure in one restarts that region alone while the others keep
processing and committing.

A region is a weakly connected part of the graph (``PipelineGraph.split``): no record crosses
from one to another, so each can advance its own epochs, source positions, pending sink
output and checkpoints. Each is run by a :class:`~stator.driver.epoch_loop.RegionLoop` on the
region's pipeline, with its checkpoints under ``<job>/regions/<region>/`` and its own restart
strategy; a job of one region, or with ``failover.strategy=full``, is the case of one loop at
the job's root (``job.py``).

Running, step by step:

1. Before Spark: the restore source is planned per region (:func:`plan_restores`;
   ``layout.py`` for ``latest``; an explicit savepoint or checkpoint is checked against the
   whole job, then each region takes its part of it: ``Target.part_for``); storage is
   checked once.
2. One SparkSession with FAIR scheduling; each region's thread submits its epochs in a pool
   of its own, so a region that recovers does not queue the others' tasks behind its own.
3. A failed epoch fails over its own region only (``recovery.py``: task retries first, then
   the region's restart strategy, then it rewinds to its latest checkpoint).
4. An executor that is lost held local state of some regions: the job says which (a log
   line, and ``lost_executors`` in each such region's view; :func:`lost_state`). Exactly
   those restart: each one's epoch with a task on it fails, or its next epoch finds the state
   gone and rewinds that region to its latest checkpoint; the other regions are not touched.
5. A region that fails for good (its strategy gave up, or a failure no restart can fix) ends
   the job: the others stop after their current epoch, with their checkpoints in flight
   settled, and the job fails with that region's error (as a Flink job does when a region's
   restart strategy gives up).
6. A region whose bounded sources are exhausted waits, serving savepoints and stops, until
   every region is done: the job finishes when all have.
7. A savepoint is one directory with one part per region (``savepoints.py``), its metadata
   written by :func:`take_savepoint` once every part is there. A stop-with-savepoint holds
   each region after its part until every part is taken, then stops all; if one part fails,
   the savepoint fails and every region goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace

from ..checkpoint.coordinator import now_ms
from ..config import JobConfig
from ..errors import ConfigError, StatorError
from ..ha.fencing import guard
from ..lineage import Target, has_run, load_target, savepoint_location
from ..locality.placement import PlacementTracker
from ..savepoint.metadata import METADATA_NAME
from ..savepoint.native import remove_strays
from ..storage import ObjectStore, open_store
from .checkpoint_health import merge_reports
from .epoch_loop import RegionLoop
from .layout import check_covers, check_regions, newest_checkpoint
from .parallelism import Parallelism
from .preflight import check_files
from .restore import check_compatible
from .savepoints import (
    PartVerdict,
    SavepointRequest,
    SavepointStatus,
    discard_failed,
    empty_target,
    merge_parts,
)
from .status import CheckpointOutcome, JobState, JobStatus, RestoreCounts, StartupTimes

log = logging.getLogger("stator.driver")

POLL_S = 0.05  # how often the job looks at its regions and its savepoint queue
RestorePlan = dict[str, Target | None]  # region id -> what it restores from


def plan_restores(
    job: str,
    config: JobConfig,
    parallelism: Parallelism,
    store: ObjectStore,
    loops: dict[str, RegionLoop],
) -> RestorePlan:
    """Step 1 of the module docstring (``preflight.py`` says why before Spark)."""
    cfg = config
    source = cfg.restore.source
    root = store.uri

    def compatible(target: Target, p: Parallelism) -> None:
        allow = cfg.restore.allow_non_restored_state
        check_compatible(target, p.max_parallelism, set(p.operators), allow)

    if source not in ("latest", "none"):
        try:
            whole = load_target(source, cfg.s3)
            check_files(whole)
        except StatorError:
            stores = [root, *(loop.store.uri for loop in loops.values())]
            lineage = cfg.restore.lineage
            if not lineage or not any(has_run(uri, lineage, cfg.s3) for uri in stores):
                raise
            log.warning("restore.source %s cannot be read; run %s resumes", source, lineage)
            return dict.fromkeys(loops)
        compatible(whole, parallelism)
        check_covers(whole, {uid for loop in loops.values() for uid in loop.planner.sources})
        return {rid: whole.part_for(rid, set(loop.pipeline.uids())) for rid, loop in loops.items()}
    sources = {rid: set(loop.planner.sources) for rid, loop in loops.items()}
    own = check_regions(job, root, sources, cfg.restore.allow_non_restored_state, cfg.s3)
    root_latest = newest_checkpoint(root, cfg.s3)
    if source == "none":
        if (own or root_latest) and not cfg.restore.force_empty:
            raise ConfigError(
                f"restore.source=none but job '{job}' has checkpoints at {root}; "
                f"restore from them (restore.source=latest) or set "
                f"restore.force_empty=true to start a new lineage beside them"
            )
        return dict.fromkeys(loops)
    plan: RestorePlan = {}
    for rid, loop in loops.items():
        mine = own.get(rid)
        older = mine is None or (root_latest and root_latest.created_ms > mine.created_ms)
        if root_latest is not None and older:
            whole = Target(root_latest, store)
            compatible(whole, parallelism)
            plan[rid] = whole.part_for(rid, set(loop.pipeline.uids()))
            log.info(
                "region '%s' resumes from the job's %s (before it ran as regions)",
                rid,
                whole.describe(),
            )
        elif mine is not None:
            plan[rid] = own_target = Target(mine, loop.store)
            compatible(own_target, loop.parallelism)
        else:
            plan[rid] = None
    return plan


def merged_status(
    job: str,
    loops: dict[str, RegionLoop],
    started_ms: int,
    startup: StartupTimes,
    failure: tuple[str, BaseException] | None,
    stopped_with: str | None,
    standby: bool,
) -> JobStatus:
    """The job's status out of its regions' (a new object on every read)."""
    parts = [loop.status for loop in loops.values()]
    st = JobStatus(job, started_ms=started_ms, startup=_startup(startup, parts))
    st.state = _state(parts, failure is not None, standby)
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
        st.source_lag.update(p.source_lag)  # each source belongs to one region
        st.dead_letters.update(p.dead_letters)
    measured = [p.source_lag_ms for p in parts if p.source_lag_ms is not None]
    st.source_lag_ms = min(measured, default=None)  # the oldest region's planning
    st.in_flight_checkpoints = tuple(c for p in parts for c in p.in_flight_checkpoints)
    st.metrics = parts[0].metrics  # one object serves every region (job.py)
    st.restores = RestoreCounts(
        sum(p.restores.local for p in parts),
        sum(p.restores.remote for p in parts),
        sum(p.restores.local_bytes for p in parts),
        sum(p.restores.remote_bytes for p in parts),
    )
    latest = [p.last_checkpoint for p in parts if p.last_checkpoint is not None]
    st.last_checkpoint = max(latest, key=lambda m: m.created_ms) if latest else None
    errors = [(rid, loop.status.last_error) for rid, loop in loops.items()]
    if failure is not None:  # the error that ended the job, first
        rid, exc = failure
        errors.insert(0, (rid, loops[rid].status.last_error or str(exc)[:600]))
    st.last_error = next((f"region '{r}': {e}" for r, e in errors if e), None)
    st.stopped_with_savepoint = stopped_with
    st.restarting = any(p.restarting for p in parts)
    health = {rid: loop.status.checkpoint_health for rid, loop in loops.items()}
    st.checkpoint_health = lambda: merge_reports({rid: h() for rid, h in health.items()})
    return st


def _state(parts: list[JobStatus], failed: bool, standby: bool) -> JobState:
    states = {p.state for p in parts}
    if failed:
        return JobState.FAILED
    if standby:
        return JobState.STANDBY
    if all(s.ended for s in states) and JobState.STOPPED in states:
        return JobState.STOPPED
    if states == {JobState.FINISHED}:
        return JobState.FINISHED
    for s in (JobState.FAILED, JobState.CREATED, JobState.RECOVERING):
        if s in states:
            return s
    return JobState.RUNNING


def _startup(job: StartupTimes, parts: list[JobStatus]) -> StartupTimes:
    """The job's marks; a region-made mark counts once every region reached it."""

    def last(name: str) -> int | None:
        marks = [getattr(p.startup, name) for p in parts]
        return None if None in marks else max(m for m in marks if m is not None)

    first = last("first_epoch_ms")
    # Every region ran its first epoch or found nothing to read before one; not all ran one.
    began = [p.startup.first_epoch_ms or p.startup.caught_up_ms for p in parts]
    caught_up = None if first is not None or None in began else max(filter(None, began))
    return replace(
        job, recovered_ms=last("recovered_ms"), first_epoch_ms=first, caught_up_ms=caught_up
    )


def take_savepoint(
    request: SavepointRequest,
    job: str,
    config: JobConfig,
    parallelism: Parallelism,
    loops: dict[str, RegionLoop],
    failed_region: Callable[[], str | None],
) -> bool:
    """Step 7 of the module docstring; True if the job stops with the savepoint."""
    started = time.monotonic()
    request.status, request.started_ms = SavepointStatus.IN_PROGRESS, now_ms()
    epoch = max(loop.next_epoch() for loop in loops.values())
    location = request.target or savepoint_location(config.savepoint.dir, job, epoch, request.id)
    request.location = location
    parts = {
        rid: SavepointRequest(location, request.stop, request.format_type, part=PartVerdict())
        for rid in loops
    }
    ours = None
    try:
        target = open_store(location, config.s3)  # before any part writes: is it empty?
        ours = empty_target(target)
        for rid, part in parts.items():
            loops[rid].savepoints.enqueue_part(part)
        while any(not p.status.finished for p in parts.values()):
            time.sleep(POLL_S)
        failed = [(rid, p) for rid, p in parts.items() if p.status is SavepointStatus.FAILED]
        region = failed_region()
        if region is not None:
            raise RuntimeError(f"region '{region}' failed meanwhile")
        if failed:
            raise RuntimeError(f"region '{failed[0][0]}': {failed[0][1].error}")
        merged = merge_parts(job, {rid: p.meta for rid, p in parts.items() if p.meta}, started)
        guard(f"savepoint {location}")
        target.put(METADATA_NAME, merged.to_json())
        remove_strays(target, merged)
    except BaseException as exc:
        for p in parts.values():
            if p.part is not None:
                p.part.give(False)
        if not isinstance(exc, Exception):
            raise
        request.status, request.error = SavepointStatus.FAILED, str(exc)[:2000]
        request.completed_ms = now_ms()
        log.warning("savepoint %s failed: %s", request.id, request.error)
        discard_failed(ours, parallelism.operators)
        return False
    request.status, request.epoch = SavepointStatus.COMPLETED, merged.epoch
    request.state_bytes, request.completed_ms = merged.state_bytes, now_ms()
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
    return request.stop


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

    def __init__(self, loops: dict[str, RegionLoop]) -> None:
        self.loops = loops

    def items(self) -> list[CheckpointOutcome]:
        items = [
            replace(o, region=rid)
            for rid, loop in self.loops.items()
            for o in loop.checkpoints.history.items()
        ]
        return sorted(items, key=lambda o: o.at_ms)
