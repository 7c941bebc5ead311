"""Savepoints and stop-with-savepoint, as part of the driver's epoch loop.

Taking savepoint S, step by step:

1. A request is queued (control API or ``JobDriver.request_savepoint``); at most one
   stop-with-savepoint is pending at a time. The loop takes it at the next epoch boundary.
2. An epoch with no new input runs: every keyed task commits (nothing new) and writes its
   key-groups in the canonical savepoint format into S's directory. A checkpoint is taken in
   the same epoch (if checkpointing is on), so sinks commit everything up to it.
   Failure -> the request fails with the reason, the job fails over as for any failed epoch;
   S's directory has no metadata and does not count as a savepoint.
3. ``_savepoint.json`` is written last: S exists from here on. It references only files in
   S's directory, and checkpoint retention never deletes it.
4. Stop: the loop ends after S, with every sink committed up to S's epoch.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..api.time import MAX_TIMESTAMP
from ..checkpoint.coordinator import now_ms
from ..errors import StatorError
from ..savepoint.metadata import METADATA_NAME, OperatorSavepoint, SavepointMetadata
from ..sources.base import SplitRange
from ..storage import open_store
from .spec import SavepointTask

if TYPE_CHECKING:
    from .driver import JobDriver

log = logging.getLogger("stator.savepoint")


class SavepointConflict(StatorError):
    """A stop-with-savepoint is already pending or running."""


@dataclass
class SavepointRequest:
    target: str | None
    stop: bool
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    status: str = "PENDING"  # PENDING, IN_PROGRESS, COMPLETED, FAILED
    location: str | None = None
    epoch: int | None = None
    size: int | None = None
    error: str | None = None
    created_ms: int = field(default_factory=now_ms)
    completed_ms: int | None = None
    fetched: bool = False  # a client read the final result (the driver may exit then)

    def to_json(self) -> dict[str, Any]:
        return {
            k: getattr(self, k)
            for k in (
                "id",
                "status",
                "stop",
                "target",
                "location",
                "epoch",
                "size",
                "error",
                "created_ms",
                "completed_ms",
            )
        }


class Savepoints:
    """The driver's savepoint requests and the flow that takes them."""

    def __init__(self, driver: JobDriver) -> None:
        self.d = driver
        self._lock = threading.Lock()
        self.requests: list[SavepointRequest] = []
        self._queue: list[SavepointRequest] = []

    def request(self, target: str | None = None, stop: bool = False) -> SavepointRequest:
        """Queue a savepoint; thread-safe (the control API calls it)."""
        with self._lock:
            if stop and any(
                r.stop and r.status in ("PENDING", "IN_PROGRESS") for r in self.requests
            ):
                raise SavepointConflict("a stop-with-savepoint is already in progress")
            if self.d.status.state in ("FINISHED", "STOPPED", "FAILED"):
                raise SavepointConflict(f"the job is {self.d.status.state.lower()}")
            request = SavepointRequest(target, stop)
            self.requests.append(request)
            self._queue.append(request)
            return request

    def find(self, request_id: str) -> SavepointRequest | None:
        with self._lock:
            return next((r for r in self.requests if r.id == request_id), None)

    def all(self) -> list[SavepointRequest]:
        with self._lock:
            return list(self.requests)

    def next(self) -> SavepointRequest | None:
        with self._lock:
            return self._queue.pop(0) if self._queue else None

    def fail_pending(self, reason: str) -> None:
        with self._lock:
            for r in self._queue:
                r.status, r.error, r.completed_ms = "FAILED", reason, now_ms()
            self._queue.clear()

    def _empty_plan(self) -> dict[str, list[SplitRange]]:
        plan = {}
        for uid, splits in self.d.positions.items():
            order = {s: i for i, s in enumerate(splits)}
            ranges = [
                SplitRange(s, st.position, st.position, order[s])
                for s, st in splits.items()
                if not st.finished
            ]
            if ranges:
                plan[uid] = ranges
        return plan

    def take(self, request: SavepointRequest) -> None:
        d = self.d
        request.status = "IN_PROGRESS"
        started = time.monotonic()
        epoch = d.epoch + 1
        location = request.target or (
            f"{d.config.savepoint.dir.rstrip('/')}/{d.job}/savepoint-{epoch:010d}-{request.id}"
        )
        request.location = location
        try:
            store = open_store(location, d.config.s3)
            if store.exists(METADATA_NAME):
                raise StatorError(f"{location} already holds a savepoint; choose another target")
            plan = self._empty_plan()
            if not plan:
                raise StatorError("every source is finished: nothing is left to savepoint")
            task = SavepointTask(store, "", d.config.savepoint.compression)
            spec = d._spec(plan, force_checkpoint=True, savepoint=task)
            reports = d._run_epoch(spec)
            checkpoints_before = d.status.checkpoints
            d._advance(spec, reports, started)
            if spec.checkpoint is not None and d.status.checkpoints == checkpoints_before:
                raise StatorError(
                    "the checkpoint taken with the savepoint failed, so sink output "
                    "up to it is not committed; see the checkpoint's error"
                )
            meta = self._savepoint_metadata(spec.epoch, reports, started)
            store.put(METADATA_NAME, meta.to_json())
        except Exception as exc:
            request.status, request.error = "FAILED", f"{type(exc).__name__}: {exc}"[:2000]
            request.completed_ms = now_ms()
            log.warning("savepoint %s failed: %s", request.id, request.error)
            raise
        request.status, request.epoch, request.size = "COMPLETED", meta.epoch, meta.size
        request.completed_ms = now_ms()
        log.info(
            "savepoint %s complete at %s: epoch %d, %d bytes in %d ms",
            request.id,
            location,
            meta.epoch,
            meta.size,
            meta.duration_ms,
        )
        if request.stop:
            d.stop()
            d.status.state = "STOPPED"
            d.status.stopped_with_savepoint = location

    def _savepoint_metadata(
        self, epoch: int, reports: list[dict[str, Any]], started: float
    ) -> SavepointMetadata:
        d = self.d
        operators: dict[str, OperatorSavepoint] = {}
        seen: dict[str, set[int]] = {}
        for r in reports:
            if r["kind"] != "state" or r.get("savepoint") is None:
                continue
            uid, part = r["uid"], r["savepoint"]
            op = operators.get(uid)
            if op is None:
                op = operators[uid] = OperatorSavepoint(
                    uid, d.parallelism[uid], {}, {}, MAX_TIMESTAMP
                )
            op.states.update(part["states"])
            op.key_groups.update(part["key_groups"])
            operators[uid] = OperatorSavepoint(
                uid,
                op.parallelism,
                op.states,
                op.key_groups,
                min(op.watermark, int(r["watermark"])),
            )
            seen.setdefault(uid, set()).add(int(r["subtask"]))
        for uid, p in d.parallelism.items():
            if len(seen.get(uid, ())) != p:
                raise StatorError(
                    f"operator '{uid}': {len(seen.get(uid, ()))} of {p} subtasks "
                    f"wrote their savepoint part"
                )
        return SavepointMetadata(
            job=d.job,
            epoch=epoch,
            created_ms=now_ms(),
            max_parallelism=d.pipeline.max_parallelism,
            operators=operators,
            sources={
                uid: {s: st.to_json() for s, st in splits.items()}
                for uid, splits in d.positions.items()
            },
            watermark=min((op.watermark for op in operators.values()), default=MAX_TIMESTAMP),
            compression=d.config.savepoint.compression,
            duration_ms=int((time.monotonic() - started) * 1000),
        )
