"""Savepoints and stop-with-savepoint: the requests (queued by the control API) and the flow
that takes one at an epoch boundary.

Taking savepoint S, step by step:

1. A request is queued (:meth:`SavepointRequests.request`); at most one stop-with-savepoint
   is pending at a time. The epoch loop takes it at the next epoch boundary.
2. An epoch with no new input runs: every keyed task commits (nothing new) and writes its
   part into S's directory: its key-groups in the canonical format, or its database's files
   in the native one (``savepoint/native.py``; the request's ``format_type``, else
   ``savepoint.format_type``). A checkpoint is taken in
   the same epoch (if checkpointing is on), so sinks commit everything up to it.
   Before it, S's target is checked (reachable, no savepoint there yet): failure -> the
   request fails with the reason and the job goes on (:class:`SavepointRefused`). Failure of
   the epoch -> the request fails with the reason, the job fails over as for any failed
   epoch; S's directory has no metadata and does not count as a savepoint. If the target
   held nothing before S, every file in it is S's and is deleted (:func:`discard_failed`;
   best effort: a task of the failed epoch still uploading may add one after); a target
   that held other files keeps what S wrote there.
3. ``_savepoint.json`` is written last: S exists from here on. It references only files in
   S's directory, and checkpoint retention never deletes it.
4. Stop (if asked): the loop ends after S, with every sink committed up to S's epoch.

A job of several failover regions (``regions.py``) takes S as one part per region: each
region runs steps 1-2 into S's directory (every operator writes under its own uid) and
hands its part's metadata back instead of writing step 3; the job writes the merged
``_savepoint.json`` once every part is there (:func:`merge_parts`). For a stop, each region
holds after its part until the job's verdict: stop if every part was taken, go on if one
failed (the savepoint failed and the job keeps running, as a single region's would).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol
from urllib.parse import urlparse

from ..api.time import MAX_TIMESTAMP
from ..checkpoint.coordinator import now_ms
from ..checkpoint.metadata import METADATA_NAME as CHECKPOINT_METADATA
from ..checkpoint.metadata import SubtaskSnapshot
from ..config import SavepointConfig
from ..epoch.reports import StateReport
from ..epoch.spec import SavepointTask
from ..errors import StatorError
from ..ha.fencing import guard
from ..lineage import savepoint_location
from ..savepoint.metadata import (
    FORMAT_TYPES,
    METADATA_NAME,
    NATIVE,
    NATIVE_COMPRESSION,
    OperatorSavepoint,
    SavepointMetadata,
)
from ..savepoint.native import remove_strays
from ..storage import ObjectStore, S3Options, open_store
from .parallelism import Parallelism

log = logging.getLogger("stator.savepoint")


class SavepointConflict(StatorError):
    """A stop-with-savepoint is already pending or running, or the job has ended."""


class SavepointBusy(StatorError):
    """Another savepoint is pending or running: one at a time (the caller may retry)."""


class SavepointTargetError(StatorError):
    """A trigger's target lies outside the job's savepoint directory, or its format type is
    not one Stator writes."""


class SavepointRefused(StatorError):
    """The savepoint could not start (its target is unusable): the request failed, and the
    job goes on as it was."""


def check_target(target: str, root: str, any_target: bool) -> None:
    """A requested target must name a directory strictly under ``root`` (unless
    ``any_target``) and never climb out of one: disposing a savepoint deletes its directory."""
    segments = urlparse(target).path.split("/")
    if ".." in segments or "." in segments:
        raise SavepointTargetError(
            f"target {target!r} has '.' or '..' in its path: name the directory itself"
        )
    if any_target:
        return
    if not target.startswith(root) or not target[len(root) :].strip("/"):
        raise SavepointTargetError(
            f"target {target!r} is not a directory under the savepoint directory {root}: "
            f"leave the target out, name a directory under it, or set "
            f"savepoint.any_target=true"
        )


class PartVerdict:
    """Where a region that took its part of a stop-with-savepoint waits for the job's
    verdict (module docstring)."""

    def __init__(self) -> None:
        self._given = threading.Event()
        self._stop = False

    def give(self, stop: bool) -> None:
        self._stop = stop
        self._given.set()

    def wait(self, stopping: Callable[[], bool] = lambda: False) -> bool:
        """True: stop now; False: the job's savepoint failed, go on (also when the region is
        told to stop meanwhile: it ends at once, and the job fails the savepoint)."""
        while not self._given.wait(0.2):
            if stopping():
                return False
        return self._stop


class SavepointStatus(StrEnum):
    """Where a savepoint request stands (its JSON ``status`` in the control API)."""

    PENDING = "PENDING"
    IN_PROGRESS = "IN_PROGRESS"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"

    @property
    def finished(self) -> bool:
        return self in (SavepointStatus.COMPLETED, SavepointStatus.FAILED)


@dataclass
class SavepointRequest:
    target: str | None
    stop: bool
    format_type: str | None = None  # None: the job's savepoint.format_type
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    status: SavepointStatus = SavepointStatus.PENDING
    location: str | None = None
    epoch: int | None = None
    state_bytes: int | None = None
    error: str | None = None
    created_ms: int = field(default_factory=now_ms)
    started_ms: int | None = None
    completed_ms: int | None = None
    fetched: bool = False  # a client read the final result (the driver may exit then)
    # One region's part of a job's savepoint: no metadata is written; ``meta`` holds it.
    part: PartVerdict | None = field(default=None, repr=False, compare=False)
    meta: SavepointMetadata | None = field(default=None, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {
            k: getattr(self, k)
            for k in (
                "id",
                "status",
                "stop",
                "target",
                "format_type",
                "location",
                "epoch",
                "state_bytes",
                "error",
                "created_ms",
                "started_ms",
                "completed_ms",
            )
        }


class SavepointRequests:
    """Savepoint requests: queued from any thread, taken by the epoch loop. One at a time,
    with targets under ``root`` unless ``any_target``; the last ``KEEP`` finished requests
    are remembered for their requesters."""

    KEEP = 100

    def __init__(self, root: str, any_target: bool = False) -> None:
        self.root, self.any_target = root.rstrip("/") + "/", any_target
        self._lock = threading.Lock()
        self._all: list[SavepointRequest] = []
        self._queue: list[SavepointRequest] = []
        self._closed: str | None = None

    def request(
        self, target: str | None = None, stop: bool = False, format_type: str | None = None
    ) -> SavepointRequest:
        if format_type is not None and format_type not in FORMAT_TYPES:
            raise SavepointTargetError(
                f"'format_type' must be one of {', '.join(FORMAT_TYPES)} (or left out), "
                f"not {format_type!r}"
            )
        with self._lock:
            if self._closed is not None:
                raise SavepointConflict(f"the job is {self._closed}")
            active = [r for r in self._all if not r.status.finished]
            if stop and any(r.stop for r in active):
                raise SavepointConflict("a stop-with-savepoint is already in progress")
            if active:
                raise SavepointBusy(
                    f"savepoint {active[0].id} is {active[0].status}; one at a time: "
                    f"retry when it has finished"
                )
            if target is not None:
                check_target(target, self.root, self.any_target)
            request = SavepointRequest(target, stop, format_type)
            finished = [r for r in self._all if r.status.finished]
            for old in finished[: max(0, len(finished) - self.KEEP + 1)]:
                self._all.remove(old)
            self._all.append(request)
            self._queue.append(request)
            return request

    def enqueue_part(self, request: SavepointRequest) -> None:
        """A region's part of a savepoint the job accepted (its checks were the job's)."""
        with self._lock:
            if self._closed is not None:
                request.status, request.completed_ms = SavepointStatus.FAILED, now_ms()
                request.error = f"region is {self._closed}"
                return
            self._all.append(request)
            self._queue.append(request)

    def find(self, request_id: str) -> SavepointRequest | None:
        with self._lock:
            return next((r for r in self._all if r.id == request_id), None)

    def all(self) -> list[SavepointRequest]:
        with self._lock:
            return list(self._all)

    def next(self) -> SavepointRequest | None:
        with self._lock:
            return self._queue.pop(0) if self._queue else None

    def close(self, state: str, reason: str) -> None:
        """The job ended (``state``): refuse new requests, fail the queued ones."""
        with self._lock:
            self._closed = state
            for r in self._queue:
                r.status, r.error, r.completed_ms = SavepointStatus.FAILED, reason, now_ms()
            self._queue.clear()

    def stop_results_fetched(self) -> bool:
        """Every stop-with-savepoint's final result was read by its requester."""
        with self._lock:
            return all(r.fetched for r in self._all if r.stop)


@dataclass(frozen=True)
class SavepointEpoch:
    """What the savepoint's epoch produced (see :class:`SavepointRunner`)."""

    epoch: int
    states: list[StateReport]
    sources: dict[str, dict[str, dict[str, Any]]]  # positions after the epoch
    checkpoint_failed: bool


class SavepointRunner(Protocol):
    """What the savepoint flow needs from the job: one epoch that reads nothing and writes
    every subtask's savepoint part (with a checkpoint, if checkpointing is on)."""

    job: str
    parallelism: Parallelism

    def next_epoch(self) -> int: ...

    def run_savepoint_epoch(self, task: SavepointTask) -> SavepointEpoch: ...


def take_savepoint(
    request: SavepointRequest, runner: SavepointRunner, config: SavepointConfig, s3: S3Options
) -> SavepointMetadata:
    """Steps 2-3 of the module docstring; the caller stops the job for step 4."""
    request.status, request.started_ms = SavepointStatus.IN_PROGRESS, now_ms()
    started = time.monotonic()
    location = request.target or savepoint_location(
        config.dir, runner.job, runner.next_epoch(), request.id
    )
    request.location = location
    format_type = request.format_type or config.format_type
    # A native part is the database's files, compressed by RocksDB's own options.
    compression = NATIVE_COMPRESSION if format_type == NATIVE else config.compression
    ours = None
    try:
        store = _open_target(location, s3)
        if request.part is None:  # a region's part: the job's call (``regions.py``)
            ours = empty_target(store)
        done = runner.run_savepoint_epoch(SavepointTask(store, "", compression, format_type))
        if done.checkpoint_failed:
            raise StatorError(
                "the checkpoint taken with the savepoint failed, so sink output "
                "up to it is not committed; see the checkpoint's error"
            )
        meta = _metadata(runner, done, compression, format_type, started)
        request.meta = meta
        if request.part is None:
            guard(f"savepoint {location}")
            store.put(METADATA_NAME, meta.to_json())
            remove_strays(store, meta)
    except Exception as exc:
        request.status, request.error = (
            SavepointStatus.FAILED,
            f"{type(exc).__name__}: {exc}"[:2000],
        )
        request.completed_ms = now_ms()
        log.warning("savepoint %s failed: %s", request.id, request.error)
        discard_failed(ours, runner.parallelism.operators)
        raise
    request.status, request.epoch, request.state_bytes = (
        SavepointStatus.COMPLETED,
        meta.epoch,
        meta.state_bytes,
    )
    request.completed_ms = now_ms()
    log.info(
        "savepoint %s complete at %s: epoch %d, %d bytes in %d ms",
        request.id,
        location,
        meta.epoch,
        meta.state_bytes,
        meta.duration_ms,
    )
    return meta


def _open_target(location: str, s3: S3Options) -> ObjectStore:
    """Step 2's check of S's target; an unusable one refuses the savepoint, not the job."""
    try:
        store = open_store(location, s3)
        taken = store.exists(METADATA_NAME)
    except (StatorError, OSError) as exc:  # unreachable, not a directory, no bucket, ...
        raise SavepointRefused(f"savepoint target {location}: {exc}") from exc
    if taken:
        raise SavepointRefused(f"{location} already holds a savepoint; choose another target")
    return store


def empty_target(store: ObjectStore) -> ObjectStore | None:
    """S's target if it holds nothing yet (so that, if S fails, everything there is S's);
    None if it holds something or cannot be read."""
    try:
        return None if store.listing() else store
    except (StatorError, OSError):
        return None


def discard_failed(store: ObjectStore | None, uids: Iterable[str]) -> None:
    """Delete what a failed savepoint wrote into its target (step 2 of the module
    docstring): ``store`` is the target if it held nothing before S (:func:`empty_target`),
    else None and nothing is deleted. S writes only under its keyed operators' ``<uid>/``;
    anything else that appeared meanwhile (a checkpoint or another savepoint someone put
    under the target) is left alone, and so is everything if a metadata file is among
    those keys, or if S's own metadata is there: a write of it that reported failure may
    have landed (a lost response), and a savepoint whose metadata names deleted files is
    worse than one whose files were left behind."""
    if store is None:
        return
    prefixes = tuple(f"{uid}/" for uid in uids)
    try:
        listing = [key for key, _ in store.listing()]
        if METADATA_NAME in listing:
            log.warning("failed savepoint %s: its metadata is there; nothing deleted", store.uri)
            return
        keys = [key for key in listing if key.startswith(prefixes)]
        if any(key.rsplit("/", 1)[-1] in (METADATA_NAME, CHECKPOINT_METADATA) for key in keys):
            return
        store.delete(keys)
    except (StatorError, OSError) as exc:
        log.warning("failed savepoint %s: its files are left behind: %s", store.uri, exc)
        return
    if keys:
        log.info("failed savepoint %s: deleted the %d files it wrote", store.uri, len(keys))


def _metadata(
    runner: SavepointRunner,
    done: SavepointEpoch,
    compression: str,
    format_type: str,
    started: float,
) -> SavepointMetadata:
    parallelism = runner.parallelism.operators
    states: dict[str, dict[str, dict[str, Any]]] = {}
    key_groups: dict[str, dict[int, dict[str, Any]]] = {}
    databases: dict[str, list[SubtaskSnapshot]] = {}
    watermarks: dict[str, int] = {}
    commits: dict[str, dict[int, str]] = {}
    operator_states: dict[str, dict[int, str]] = {}
    seen: dict[str, set[int]] = {}
    for r in done.states:
        if r.savepoint is None:
            continue
        states.setdefault(r.uid, {}).update(r.savepoint.states)
        key_groups.setdefault(r.uid, {}).update(r.savepoint.key_groups)
        if r.savepoint.snapshot is not None:
            databases.setdefault(r.uid, []).append(r.savepoint.snapshot)
        watermarks[r.uid] = min(watermarks.get(r.uid, MAX_TIMESTAMP), r.watermark)
        commits.setdefault(r.uid, {})[r.subtask] = r.commit
        if r.savepoint.operator_state:
            operator_states.setdefault(r.uid, {})[r.subtask] = r.savepoint.operator_state
        seen.setdefault(r.uid, set()).add(r.subtask)
    for uid, p in parallelism.items():
        if len(seen.get(uid, ())) != p:
            raise StatorError(
                f"operator '{uid}': {len(seen.get(uid, ()))} of {p} subtasks "
                f"wrote their savepoint part"
            )
    operators = {
        uid: OperatorSavepoint(
            uid,
            parallelism[uid],
            states[uid],
            key_groups[uid],
            watermarks[uid],
            tuple(sorted(databases.get(uid, ()), key=lambda s: s.index)),
            commits[uid],
            operator_states.get(uid, {}),
        )
        for uid in seen
    }
    return SavepointMetadata(
        job=runner.job,
        epoch=done.epoch,
        created_ms=now_ms(),
        max_parallelism=runner.parallelism.max_parallelism,
        operators=operators,
        sources=done.sources,
        watermark=min((op.watermark for op in operators.values()), default=MAX_TIMESTAMP),
        compression=compression,
        duration_ms=int((time.monotonic() - started) * 1000),
        format_type=format_type,
    )


def merge_parts(job: str, parts: dict[str, SavepointMetadata], started: float) -> SavepointMetadata:
    """One savepoint out of the parts of a job's regions (region id -> part): every operator
    and source as its region wrote it, each region's epoch, the highest as the savepoint's."""
    metas = list(parts.values())
    return SavepointMetadata(
        job=job,
        epoch=max(m.epoch for m in metas),
        created_ms=now_ms(),
        max_parallelism=metas[0].max_parallelism,
        operators={uid: op for m in metas for uid, op in m.operators.items()},
        sources={uid: s for m in metas for uid, s in m.sources.items()},
        watermark=min(m.watermark for m in metas),
        compression=metas[0].compression,
        format_version=metas[0].format_version,
        format_type=metas[0].format_type,
        duration_ms=int((time.monotonic() - started) * 1000),
        region_epochs={region: m.epoch for region, m in sorted(parts.items())},
        region_uids={
            region: sorted({*m.operators, *m.sources}) for region, m in sorted(parts.items())
        },
    )
