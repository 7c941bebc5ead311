"""The job driver: plans epochs, runs each as one Spark job, coordinates checkpoints and sink
commits, and recovers from failures under the restart strategy.

One epoch:

1. Plan: every unfinished split of every source gets a range (possibly empty: it still
   carries the split's watermark). Nothing to read and nothing finishing -> wait and re-plan.
2. Run: source tasks -> shuffle by key-group to keyed tasks -> ... -> sinks, as one Spark job.
   Keyed tasks commit their state for the epoch atomically; if a checkpoint is due they also
   snapshot and upload. Reports come back through an accumulator.
3. Advance: source positions move to the ranges' ends; staged sink output joins the pending
   commits.
4. Checkpoint (if due): the coordinator completes it (metadata last), then sinks commit every
   epoch it covers. A declined checkpoint is aborted; processing goes on.

A failed epoch fails over: the job restores from the latest completed checkpoint (tasks whose
local state is not at that checkpoint's epoch restore it), sources rewind to its positions,
and staged output of later epochs is discarded. A checkpoint that cannot be restored is
dropped in favour of the previous retained one.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ..api.pipeline import KeyedNode, Pipeline, SinkNode, SourceNode
from ..api.time import MAX_TIMESTAMP, MIN_TIMESTAMP
from ..checkpoint.coordinator import CheckpointCoordinator, now_ms
from ..checkpoint.metadata import (
    CheckpointMetadata,
    OperatorSnapshot,
    PendingCommit,
    RemoteFile,
    SubtaskSnapshot,
)
from ..config import JobConfig
from ..errors import ConfigError, PipelineError, StatorError
from ..sources.base import SplitRange, SplitState
from ..storage import ObjectStore, open_store
from .restart import RestartStrategy
from .restore import Target, check_compatible, load_target, restore_task
from .savepoints import SavepointRequest, Savepoints
from .spec import CheckpointTask, EpochSpec, SavepointTask
from .tasks import RESTORE_ERROR_MARKER, drain, keyed_task, source_task

log = logging.getLogger("stator.driver")


class JobFailed(StatorError):
    """The restart strategy gave up."""


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
    finished: bool = False
    state: str = "CREATED"  # CREATED, RUNNING, FINISHED, STOPPED, FAILED
    stopped_with_savepoint: str | None = None


class JobDriver:
    def __init__(self, pipeline: Pipeline, config: JobConfig, spark: Any = None) -> None:
        pipeline.validate()
        self.pipeline, self.config = pipeline, config
        self.job = config.name or pipeline.name
        self.parallelism = {
            n.uid: n.parallelism or pipeline.parallelism or config.parallelism
            for n in pipeline.nodes
            if isinstance(n, KeyedNode)
        }
        self.sources = {n.uid: n for n in pipeline.nodes if isinstance(n, SourceNode)}
        self.sinks = {n.uid: n for n in pipeline.nodes if isinstance(n, SinkNode)}
        self.store: ObjectStore = open_store(
            f"{config.checkpoint.storage.rstrip('/')}/{self.job}", config.s3
        )
        self.coordinator = CheckpointCoordinator(self.store, config.checkpoint.retained)
        self.restart = RestartStrategy(config.restart)
        self.status = JobStatus(self.job)
        self.spark = spark
        self.positions: dict[str, dict[str, SplitState]] = {}
        self.epoch = 0
        self.pending: dict[str, dict[int, list[tuple[dict[str, Any], Any]]]] = {}
        # What the current state descends from: the restore source for tasks whose local
        # state is not at the expected epoch, and (if it is one of this job's checkpoints at
        # the same parallelism) the base of incremental uploads. None: started empty.
        self.target: Target | None = None
        self._initial_target: Target | None = None
        self._last_checkpoint_ms = 0
        self._epochs_since_checkpoint = 0
        self._verify_states = False
        self._stop = False
        self.savepoints = Savepoints(self)
        self.history: deque[dict[str, Any]] = deque(maxlen=50)  # recent checkpoint outcomes
        self.control: Any = None
        self.control_port: int | None = None

    # ------------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        """Ask the loop to stop after the current epoch."""
        self._stop = True

    def request_savepoint(self, target: str | None = None, stop: bool = False) -> SavepointRequest:
        """Queue a savepoint (optionally stopping the job after it); thread-safe."""
        return self.savepoints.request(target, stop)

    def run(self) -> JobStatus:
        if self.spark is None:
            from .spark import create_session  # noqa: PLC0415

            self.spark = create_session(self.config.spark, f"stator-{self.job}")
        if self.config.control.port >= 0:
            from ..control.server import ControlServer  # noqa: PLC0415 - aiohttp only if used

            self.control = ControlServer(self, self.config.control.host, self.config.control.port)
            self.control_port = self.control.start()
        try:
            return self._run()
        finally:
            if self.control is not None:
                self._linger()
                self.control.stop()

    def _linger(self) -> None:
        """Stopped with a savepoint: wait until its requester has read the result."""
        if self.status.state != "STOPPED":
            return
        deadline = time.monotonic() + self.config.control.linger_ms / 1000
        while time.monotonic() < deadline:
            if all(r.fetched for r in self.savepoints.all() if r.stop):
                return
            time.sleep(0.1)

    def _run(self) -> JobStatus:
        self.status.state = "RECOVERING"
        self._recover_initial()
        self.status.state = "RUNNING"
        while not self._stop:
            try:
                request = self.savepoints.next()
                if request is not None:
                    self.savepoints.take(request)
                    continue
                if self._finished():
                    self.status.finished = True
                    self.status.state = "FINISHED"
                    break
                ranges = self._plan()
                if ranges is None:
                    time.sleep(self.config.epoch.idle_wait_ms / 1000)
                    continue
                spec = self._spec(ranges)
                started = time.monotonic()
                reports = self._run_epoch(spec)
                self._advance(spec, reports, started)
            except Exception as exc:
                try:
                    self._failover(exc)
                except BaseException:
                    self.status.state = "FAILED"
                    self.savepoints.fail_pending("the job failed")
                    raise
        self.savepoints.fail_pending("the job ended before the savepoint was taken")
        for node in self.sources.values():
            node.source.close()
        return self.status

    # ------------------------------------------------------------------ recovery

    def _initial_positions(self) -> dict[str, dict[str, SplitState]]:
        return {
            uid: {
                s: SplitState(node.source.initial_position(s), MIN_TIMESTAMP)
                for s in node.source.discover_splits()
            }
            for uid, node in self.sources.items()
        }

    def _recover_initial(self) -> None:
        source = self.config.restore.source
        explicit = None
        if source not in ("latest", "none"):
            explicit = load_target(source, self.config.s3)
        same_store = explicit is not None and explicit.store.uri == self.store.uri
        own = explicit.meta if explicit and same_store else None
        report = self.coordinator.recover(own if isinstance(own, CheckpointMetadata) else None)
        if report.deleted_files:
            log.info("removed %d unreferenced checkpoint files", report.deleted_files)
        target = Target(report.restored, self.store) if report.restored else None
        if source == "none":
            if self.coordinator.completed and not self.config.restore.force_empty:
                raise ConfigError(
                    f"restore.source=none but job '{self.job}' has checkpoints at "
                    f"{self.store.uri}; restore from them (restore.source=latest) or set "
                    f"restore.force_empty=true to start a new lineage beside them"
                )
            target = None
        elif explicit is not None:
            target = explicit
        self._initial_target = target
        self._reset_to(target)
        if target is not None:
            log.info("restoring job '%s' from %s", self.job, target.describe())

    def _reset_to(self, target: Target | None) -> None:
        """Rewind sources, sinks and the epoch counter to ``target`` (None: the beginning)."""
        positions = self._initial_positions()
        if target is not None:
            check_compatible(
                target,
                self.pipeline.max_parallelism,
                set(self.parallelism),
                self.config.restore.allow_non_restored_state,
            )
            for uid, splits in target.meta.sources.items():
                if uid in positions:
                    for split, state in splits.items():
                        restored = SplitState.from_json(state)
                        # The source decides again whether a split is at its end: a bounded
                        # source may have been given more input since (costs at most one
                        # empty epoch).
                        restored.finished = False
                        positions[uid][split] = restored
        self.positions = positions
        self.epoch = self.status.epoch = target.epoch if target else 0
        self.target = target
        self._verify_states = target is not None
        self.pending = {}
        pending = (
            target.meta.sinks if target and isinstance(target.meta, CheckpointMetadata) else {}
        )
        for uid, node in self.sinks.items():
            node.sink.discard_after(uid, self.epoch)
            for commit in pending.get(uid, ()):
                node.sink.commit(uid, commit.epoch, list(commit.parts), [])

    def _failover(self, exc: Exception) -> None:
        """1. classify, 2. ask the restart strategy, 3. wait, 4. rewind to the latest
        completed checkpoint (or an older one if that one cannot be restored)."""
        text = f"{type(exc).__name__}: {exc}"
        self.status.last_error = _short(text)
        if isinstance(exc, ConfigError | PipelineError) or "StateCompatibilityError" in text:
            raise JobFailed(f"job '{self.job}' cannot run: {_short(text)}") from exc
        target = self.target
        if RESTORE_ERROR_MARKER in text and target and isinstance(target.meta, CheckpointMetadata):
            fallback = self.coordinator.fall_back(target.meta, _short(text))
            log.warning(
                "%s cannot be restored; next: %s",
                target.describe(),
                fallback.checkpoint_id if fallback else "the initial state",
            )
        else:
            log.warning("epoch %d failed: %s", self.epoch + 1, _short(text))
        while True:
            delay = self.restart.next_delay_ms()
            if delay is None:
                raise JobFailed(
                    f"job '{self.job}' failed and the restart strategy "
                    f"'{self.config.restart.strategy}' gave up: {_short(text)}"
                ) from exc
            self.status.restarts += 1
            time.sleep(delay / 1000)
            try:
                latest = self.coordinator.latest
                self._reset_to(Target(latest, self.store) if latest else self._initial_target)
                return
            except Exception as again:
                text = f"{type(again).__name__}: {again}"
                self.status.last_error = _short(text)
                log.warning("restoring after a failure failed: %s", _short(text))

    # ------------------------------------------------------------------ planning

    def _finished(self) -> bool:
        if not self.config.epoch.stop_when_finished:
            return False
        return all(s.finished for splits in self.positions.values() for s in splits.values())

    def _plan(self) -> dict[str, list[SplitRange]] | None:
        now = now_ms()
        budget = max(1, self.config.epoch.max_records // max(1, len(self.sources)))
        plan: dict[str, list[SplitRange]] = {}
        work = False
        for uid, node in self.sources.items():
            open_splits = {
                s: st.position for s, st in self.positions[uid].items() if not st.finished
            }
            if not open_splits:
                continue
            order = {s: i for i, s in enumerate(self.positions[uid])}
            ranges = node.source.plan(open_splits, budget, now)
            planned = {r.split for r in ranges}
            for split, pos in open_splits.items():  # idle splits still carry a watermark
                if split not in planned:
                    ranges.append(SplitRange(split, pos, pos, order[split]))
            plan[uid] = sorted(ranges, key=lambda r: r.order)
            work = work or any(r.final or r.end != r.start for r in plan[uid])
        return plan if work else None

    def _checkpoint_due(self, ranges: dict[str, list[SplitRange]]) -> bool:
        cfg = self.config.checkpoint
        if not cfg.enabled:
            return False
        finishing = {(uid, r.split) for uid, rs in ranges.items() for r in rs if r.final}
        if all(
            st.finished or (uid, split) in finishing
            for uid, splits in self.positions.items()
            for split, st in splits.items()
        ):
            return True  # the last epoch: checkpoint so every sink commits before the end
        if cfg.interval_ms > 0:
            since = now_ms() - self._last_checkpoint_ms
            return since >= max(cfg.interval_ms, cfg.min_pause_ms)
        return self._epochs_since_checkpoint + 1 >= cfg.every_epochs

    def _incremental_base(self) -> dict[tuple[str, int], dict[str, RemoteFile]]:
        """Files the current state shares with this job's latest completed checkpoint."""
        t = self.target
        if (
            t is None
            or not self.config.checkpoint.incremental
            or not isinstance(t.meta, CheckpointMetadata)
            or t.store.uri != self.store.uri
        ):
            return {}  # a savepoint, another job's checkpoint, or nothing: upload everything
        previous = {}
        for uid, op in t.meta.operators.items():
            if op.parallelism == self.parallelism.get(uid):
                for snap in op.subtasks:
                    previous[(uid, snap.index)] = {f.name: f for f in snap.files}
        return previous

    def _spec(
        self,
        ranges: dict[str, list[SplitRange]],
        force_checkpoint: bool = False,
        savepoint: SavepointTask | None = None,
    ) -> EpochSpec:
        ck = None
        if self._checkpoint_due(ranges) or (force_checkpoint and self.config.checkpoint.enabled):
            previous = self._incremental_base()
            ck = CheckpointTask(
                self.coordinator.new_checkpoint_id(),
                self.store,
                self.config.checkpoint.incremental,
                previous,
            )
        restore = restore_task(self.target, self.parallelism) if self.target else None
        verify, self._verify_states = self._verify_states, False
        return EpochSpec(
            job=self.job,
            epoch=self.epoch + 1,
            base_epoch=self.epoch,
            processing_time_ms=now_ms(),
            pipeline=self.pipeline,
            parallelism=self.parallelism,
            local_dir=self.config.state.local_dir,
            rocksdb=self.config.state.rocksdb,
            warm_entries=self.config.state.warm_cache_entries,
            ranges=ranges,
            split_max_ts={
                uid: {s: st.max_timestamp for s, st in splits.items()}
                for uid, splits in self.positions.items()
            },
            checkpoint=ck,
            restore=restore,
            savepoint=savepoint,
            verify_states=verify,
            allow_non_restored_state=self.config.restore.allow_non_restored_state,
        )

    # ------------------------------------------------------------------ running

    def _run_epoch(self, spec: EpochSpec) -> list[dict[str, Any]]:
        from pyspark.accumulators import AccumulatorParam  # noqa: PLC0415

        class Reports(AccumulatorParam):  # type: ignore[type-arg]
            def zero(self, value: Any) -> list[Any]:
                return []

            def addInPlace(self, a: list[Any], b: list[Any]) -> list[Any]:
                a.extend(b)
                return a

        sc = self.spark.sparkContext
        sc.setJobGroup(f"epoch-{spec.epoch}", f"{self.job} epoch {spec.epoch}")
        acc = sc.accumulator([], Reports())
        inputs: dict[int, list[Any]] = {}
        terminals: list[Any] = []
        for uid, ranges in spec.ranges.items():
            source = self.sources[uid]
            rdd = sc.parallelize(range(len(ranges)), len(ranges)).mapPartitionsWithIndex(
                functools.partial(source_task, spec, source.id, acc)
            )
            self._connect(source.id, rdd, inputs, terminals)
        for node in self.pipeline.nodes:  # node ids are in topological order
            if not isinstance(node, KeyedNode) or node.id not in inputs:
                continue
            parts = inputs[node.id]
            shuffled = (sc.union(parts) if len(parts) > 1 else parts[0]).partitionBy(
                self.parallelism[node.uid], _identity
            )
            out = shuffled.mapPartitionsWithIndex(functools.partial(keyed_task, spec, node.id, acc))
            self._connect(node.id, out, inputs, terminals)
        if terminals:
            (sc.union(terminals) if len(terminals) > 1 else terminals[0]).foreachPartition(drain)
        return list(acc.value)

    def _connect(
        self, node_id: int, rdd: Any, inputs: dict[int, list[Any]], terminals: list[Any]
    ) -> None:
        targets = _keyed_targets(self.pipeline, node_id)
        if not targets:
            terminals.append(rdd)
            return
        if len(targets) > 1:
            rdd = rdd.cache()  # one computation feeds several shuffles
        for target in targets:
            tid = target.id
            inputs.setdefault(tid, []).append(
                rdd.filter(functools.partial(_is_for, tid)).map(_strip_target)
            )

    # ------------------------------------------------------------------ after an epoch

    def _advance(self, spec: EpochSpec, reports: list[dict[str, Any]], started: float) -> None:
        epoch = spec.epoch
        for uid, ranges in spec.ranges.items():
            for r in ranges:
                st = self.positions[uid][r.split]
                st.position, st.finished = r.end, r.final
        for rep in reports:
            if rep["kind"] == "split":
                st = self.positions[rep["uid"]][rep["split"]]
                st.max_timestamp = max(st.max_timestamp, int(rep["max_ts"]))
                self.status.records_in += int(rep["records"])
            elif rep["kind"] == "sink":
                self.pending.setdefault(rep["uid"], {}).setdefault(epoch, []).append(
                    (rep["descriptor"], rep["payload"])
                )
                self.status.records_out += int(rep["descriptor"].get("records", 0))
        self.epoch = self.status.epoch = epoch
        self._epochs_since_checkpoint += 1
        if spec.checkpoint is not None:
            self._complete_checkpoint(spec, reports, started)
        elif not self.config.checkpoint.enabled:
            self._commit_sinks(epoch)  # no checkpoints: output is at-least-once

    def _complete_checkpoint(
        self, spec: EpochSpec, reports: list[dict[str, Any]], started: float
    ) -> None:
        ck = spec.checkpoint
        assert ck is not None
        states = [r for r in reports if r["kind"] == "state"]
        uploaded = [f for r in states if r["snapshot"] for f in r["snapshot"].files]
        expected = sum(self.parallelism.values())
        errors = [r["checkpoint_error"] for r in states if r["checkpoint_error"]]
        by_op: dict[str, dict[int, SubtaskSnapshot]] = {}
        for r in states:
            if r["snapshot"] is not None:
                by_op.setdefault(r["uid"], {})[r["subtask"]] = r["snapshot"]
        got = sum(len(v) for v in by_op.values())
        if errors or got != expected:
            reason = errors[0] if errors else f"{got} of {expected} subtasks reported a snapshot"
            self.coordinator.abort(ck.checkpoint_id, uploaded, reason)
            self.status.failed_checkpoints += 1
            self.history.append(
                {
                    "id": ck.checkpoint_id,
                    "epoch": spec.epoch,
                    "status": "FAILED",
                    "error": reason[:500],
                    "at_ms": now_ms(),
                }
            )
            return
        watermark = min((int(r["watermark"]) for r in states), default=MAX_TIMESTAMP)
        meta = CheckpointMetadata(
            checkpoint_id=ck.checkpoint_id,
            epoch=spec.epoch,
            job=self.job,
            created_ms=now_ms(),
            max_parallelism=self.pipeline.max_parallelism,
            incremental=ck.incremental,
            operators={
                uid: OperatorSnapshot(
                    uid, self.parallelism[uid], tuple(subs[i] for i in sorted(subs))
                )
                for uid, subs in by_op.items()
            },
            sources={
                uid: {s: st.to_json() for s, st in splits.items()}
                for uid, splits in self.positions.items()
            },
            sinks={
                uid: tuple(
                    PendingCommit(e, tuple(d for d, _ in sorted(parts, key=lambda x: x[0]["part"])))
                    for e, parts in sorted(epochs.items())
                )
                for uid, epochs in self.pending.items()
            },
            watermark=watermark,
            duration_ms=int((time.monotonic() - started) * 1000),
        )
        try:
            self.coordinator.complete(meta, lambda m: self._commit_sinks(m.epoch))
        except StatorError as exc:
            self.coordinator.abort(ck.checkpoint_id, uploaded, str(exc))
            self.status.failed_checkpoints += 1
            self.history.append(
                {
                    "id": ck.checkpoint_id,
                    "epoch": spec.epoch,
                    "status": "FAILED",
                    "error": str(exc)[:500],
                    "at_ms": now_ms(),
                }
            )
            return
        self.history.append(
            {
                "id": meta.checkpoint_id,
                "epoch": meta.epoch,
                "status": "COMPLETED",
                "bytes": meta.size,
                "uploaded_bytes": meta.uploaded_bytes,
                "duration_ms": meta.duration_ms,
                "at_ms": meta.created_ms,
            }
        )
        self.target = Target(meta, self.store)
        self.status.checkpoints += 1
        self.status.last_checkpoint = meta
        self._last_checkpoint_ms = now_ms()
        self._epochs_since_checkpoint = 0

    def _commit_sinks(self, upto_epoch: int) -> None:
        for uid, epochs in self.pending.items():
            sink = self.sinks[uid].sink
            for epoch in sorted(e for e in epochs if e <= upto_epoch):
                parts = sorted(epochs.pop(epoch), key=lambda x: x[0]["part"])
                sink.commit(uid, epoch, [d for d, _ in parts], [p for _, p in parts])


def _keyed_targets(pipeline: Pipeline, node_id: int) -> list[KeyedNode]:
    found: list[KeyedNode] = []
    for consumer in pipeline.consumers(node_id):
        if isinstance(consumer, KeyedNode):
            found.append(consumer)
        elif not isinstance(consumer, SinkNode):
            found.extend(_keyed_targets(pipeline, consumer.id))
    return found


def _identity(subtask: int) -> int:
    return subtask


def _is_for(target: int, item: tuple[int, int, Any]) -> bool:
    return item[0] == target


def _strip_target(item: tuple[int, int, Any]) -> tuple[int, Any]:
    return item[1], item[2]


def _short(text: str, limit: int = 600) -> str:
    """First meaningful lines of a (possibly Py4J-wrapped) error."""
    for marker in (
        "StatorRestoreError",
        "StateMismatchError",
        "StateCompatibilityError",
        "StorageError",
    ):
        idx = text.find(marker)
        if idx >= 0:
            return text[idx : idx + limit].split("\n\tat ", maxsplit=1)[0]
    return text[:limit]
