"""Standby copies (``local_recovery.standby``): each keyed subtask's part of the latest
completed checkpoint, kept on a second executor, so that when the executor that runs the
subtask is lost a running executor resumes it from local files. Without them the subtask
waits for the lost executor's replacement pod (its start is most of a recovery) or reads its
whole state from the object store. Kafka Streams calls these standby replicas; here they are
fed from the object store, which stays the primary copy and the truth.

Keeping a copy (one subtask, on its standby executor):

1. The driver names each subtask's standby executor and the files of the subtask's snapshot
   in the latest completed checkpoint, in every epoch's spec (``locality/standby.py``).
2. A keyed task on that executor hands the orders for its executor to the executor's
   uploader process (:func:`hand_over`) and goes on: the epoch never waits for a standby
   copy. An executor that runs no keyed subtask gets its orders from a small task the driver
   sends it beside the epoch, once per checkpoint. An uploader that cannot be reached loses
   the order; the next checkpoint's order catches up.
3. The uploader materializes ``chk-<id>`` in the subtask's state directory on that executor
   (:func:`keep`), unless a copy with the checkpoint's files is there already (a disk the
   executors share, or the subtask ran here): a file whose store key an older standby copy
   there has is hard-linked
   (incremental checkpoints share their SSTs under unique keys), the rest is downloaded.
   Files go to a staging directory renamed into place, then ``keys-<id>.json`` names each
   file's key (``local_copy.write_keys``; the executor's own copies have one too, so a new
   standby on the volume of the executor that ran the subtask reads only the files added
   since its own copy) and ``standby-<id>.json`` marks the copy a standby copy. Older copies
   of the subtask there are deleted last. A failure leaves the older copy, and the next
   order retries, reusing the files the failed one fetched (``.standby-salvage``). A copy
   of a large state takes longer to read than retention keeps a checkpoint's files (three
   checkpoints of a second each: compaction retires some file of it meanwhile), so without
   them every attempt read the whole state again and failed again, and no copy was ever
   made.

Counting: the uploader keeps a tally of the copies it made and the bytes they read
(:class:`~stator.epoch.reports.StandbyTally`) in ``<job>/.standby-tally.json`` under the
executor's state directory; keyed tasks and the driver's hand-over tasks there report it
(:func:`read_tally`), so the driver's status and metrics show what standby copies cost.

Restoring: ``chk-<id>`` is an ordinary local copy (``local_copy.py``); the placement finds
it by the executors' survey (``locality/inventory.py``). A standby copy of an older
checkpoint than the one restored is brought up to it first (:func:`keep` again, in the
task): only the files added since are read from the object store.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..atomic_file import write_atomically
from ..checkpoint import uploads
from ..checkpoint.metadata import RemoteFile
from ..checkpoint.transfer import download_snapshot, salvaged
from ..cluster.jvm import executor_location, task_location
from ..epoch.reports import StandbyTally
from ..epoch.spec import (
    EpochSpec,
    StandbyOrder,
    StandbyTask,
    node_name,
    state_root,
    subtask_dir,
)
from ..state.discard import discard
from ..storage import ObjectStore
from . import local_copy

log = logging.getLogger("stator.tasks")

RECORD_PREFIX = "standby-"
LOCK_NAME = ".standby.lock"
SALVAGE_NAME = ".standby-salvage"  # files a failed copy fetched, for the next one
TALLY_NAME = ".standby-tally.json"


@dataclass(frozen=True)
class StandbyJob:
    """Step 3 for every order of one executor, run by its uploader process."""

    store: ObjectStore
    orders: tuple[tuple[Path, StandbyOrder], ...]  # (the subtask's state directory, order)
    tally: Path  # where the uploader writes its tally (:func:`tally_path`)

    # The uploader runs any job but an upload beside the uploads, never in their way, by
    # these two (``uploads.serve``): it knows no more of standby copies.
    @staticmethod
    def coalesce(jobs: list[StandbyJob]) -> list[StandbyJob]:
        return newest_orders(jobs)

    def run(self) -> None:
        run_job(self)


def tally_path(local_dir: str, job: str) -> Path:
    return state_root(local_dir) / job / TALLY_NAME


def read_tally(local_dir: str, job: str) -> StandbyTally | None:
    """This executor's uploader's tally, if it made a copy (best effort: a tally that cannot
    be read is reported by a later task)."""
    try:
        return StandbyTally(**json.loads(tally_path(local_dir, job).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def record_path(state_dir: Path, checkpoint_id: int) -> Path:
    return state_dir / f"{RECORD_PREFIX}{checkpoint_id}.json"


def standby_ids(state_dir: Path) -> list[int]:
    """Checkpoint ids of the standby copies present (copy and record), oldest first."""
    found = []
    for entry in state_dir.glob(f"{RECORD_PREFIX}*.json"):
        tail = entry.name[len(RECORD_PREFIX) : -len(".json")]
        if tail.isdigit() and local_copy.copy_dir(state_dir, int(tail)).is_dir():
            found.append(int(tail))
    return sorted(found)


def keep(
    store: ObjectStore,
    state_dir: Path,
    checkpoint_id: int,
    files: tuple[RemoteFile, ...],
    on_read: Callable[[int], None] | None = None,
) -> int:
    """Step 3 of the module docstring. Returns the bytes read from the object store (0 if the
    copy was already there); ``on_read`` as ``download_snapshot``'s."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with _locked(state_dir):
        copy = local_copy.copy_dir(state_dir, checkpoint_id)
        record = record_path(state_dir, checkpoint_id)
        if local_copy.mismatch(copy, files) is None:  # made already, or the executor's own
            if not record.is_file():
                local_copy.write_keys(state_dir, checkpoint_id, files)
                record.touch()
            return 0
        salvage = state_dir / SALVAGE_NAME
        reuse = {**_salvaged(salvage, files), **local_copy.reusable(state_dir)}
        read = download_snapshot(store, files, copy, reuse, salvage, on_read)
        local_copy.write_keys(state_dir, checkpoint_id, files)
        record.touch()
        discard(salvage)
        for older in local_copy.copy_ids(state_dir):
            if older < checkpoint_id:
                local_copy.drop(state_dir, older)
                record_path(state_dir, older).unlink(missing_ok=True)
        return read


def _salvaged(salvage: Path, files: tuple[RemoteFile, ...]) -> dict[str, Path]:
    """Store key -> file, of the files a failed copy fetched that this one needs. The rest
    are deleted: compaction retired them, so no later checkpoint names them."""
    if not salvage.is_dir():
        return {}
    wanted = {salvaged(salvage, f.key).name: f.key for f in files if f.stored}
    out: dict[str, Path] = {}
    for entry in salvage.iterdir():
        key = wanted.get(entry.name)
        if key is None:
            entry.unlink(missing_ok=True)
        else:
            out[key] = entry
    return out


@contextlib.contextmanager
def _locked(state_dir: Path) -> Iterator[None]:
    """One :func:`keep` at a time per subtask directory (the uploader's and a restoring
    task's), across processes."""
    with open(state_dir / LOCK_NAME, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def hand_over(spec: EpochSpec) -> StandbyTally | None:
    """Step 2 of the module docstring, from a keyed task (every keyed task of the executor
    sends it: :func:`keep` of a copy that is there costs a look at its files). Returns the
    executor's tally, for the task's report (None without standby copies)."""
    if spec.standby is None:
        return None
    return next(hand_over_orders(spec.standby, spec.job, spec.local_dir, ()))[3]


def hand_over_orders(
    task: StandbyTask, job: str, local_dir: str, _: Iterable[Any]
) -> Iterator[tuple[str, str, str, StandbyTally | None]]:
    """Step 2 on the executor this runs on: from a keyed task, or from the driver's task for
    an executor that runs no keyed subtask (``locality/standby.py``). Yields this executor's
    location if its orders were handed over (else ""), its id, its node and its uploader's
    tally. Best effort: a standby copy is never worth failing an epoch for."""
    executor, host = task_location()
    where = executor_location(host, executor) if executor else ""
    orders = task.orders.get(where, ())
    tally = read_tally(local_dir, job)
    if not orders:
        yield "", executor, node_name(), tally
        return
    job_ = StandbyJob(
        task.store,
        tuple((subtask_dir(local_dir, job, o.uid, o.subtask, o.parallelism), o) for o in orders),
        tally_path(local_dir, job),
    )
    yield (where if uploads.submit(job_) else ""), executor, node_name(), tally


def newest_orders(jobs: list[StandbyJob]) -> list[StandbyJob]:
    """Jobs queued in the uploader, each subtask's order kept only where it names the newest
    checkpoint (in the last job that does): a copy of an older checkpoint would only be
    replaced by the next order, and its files may be retired already (a large copy takes
    several checkpoints to read, and the orders of each queue up behind it meanwhile)."""
    newest: dict[Path, tuple[int, int]] = {}  # state directory -> (checkpoint id, job index)
    for i, job in enumerate(jobs):
        for state_dir, order in job.orders:
            if order.checkpoint_id >= newest.get(state_dir, (-1, -1))[0]:
                newest[state_dir] = (order.checkpoint_id, i)
    out = []
    for i, job in enumerate(jobs):
        kept = tuple((d, o) for d, o in job.orders if newest[d] == (o.checkpoint_id, i))
        if kept:
            out.append(replace(job, orders=kept))
    return out


_tally = StandbyTally(uuid.uuid4().hex[:16])  # this uploader process's
_tally_lock = threading.Lock()


def run_job(job: StandbyJob) -> None:
    """Step 3 for each order of ``job`` (in the uploader)."""
    for state_dir, order in job.orders:
        if any(i > order.checkpoint_id for i in standby_ids(state_dir)):
            continue  # a late order: a newer copy is here already
        fetched: list[int] = []  # sizes of the objects read, a failed attempt's too
        try:
            read = keep(job.store, state_dir, order.checkpoint_id, order.files, fetched.append)
        except Exception as exc:
            _count(job.tally, sum(fetched), failed=1)
            log.warning(
                "standby copy of operator '%s' subtask %d, checkpoint %d failed: %s",
                order.uid,
                order.subtask,
                order.checkpoint_id,
                exc,
            )
            continue
        if read:
            _count(job.tally, sum(fetched), copies=1)
            log.info(
                "standby copy of operator '%s' subtask %d at checkpoint %d: %d bytes read",
                order.uid,
                order.subtask,
                order.checkpoint_id,
                read,
            )


def _count(path: Path, read: int, copies: int = 0, failed: int = 0) -> None:
    """Add a copy's outcome to this uploader's tally and write it to ``path``."""
    global _tally  # noqa: PLW0603 - one tally per uploader process
    with _tally_lock:
        _tally = replace(
            _tally,
            copies=_tally.copies + copies,
            bytes=_tally.bytes + read,
            failed=_tally.failed + failed,
        )
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(path, json.dumps(_tally.__dict__).encode())
        except OSError as exc:
            log.warning("standby tally %s not written: %s", path, exc)


def release(state_dir: Path) -> None:
    """The subtask runs on this executor now: its standby copies become plain local copies
    (kept or pruned as the subtask's own, ``local_copy.py``; their keys stay named)."""
    for entry in state_dir.glob(f"{RECORD_PREFIX}*.json"):
        entry.unlink(missing_ok=True)
    discard(state_dir / SALVAGE_NAME)
