"""A keyed subtask's local state on the executor: open it at the epoch the driver expects,
or restore it when it is not there (its snapshot for a checkpoint: ``snapshot.py``).

Opening subtask S for epoch E (its state must be at ``base_epoch`` = E-1):

1. Local state at ``base_epoch`` and of the commit the driver expects (``EpochSpec.commits``):
   use it as it is. At that epoch but of another commit, it is another lineage's state (the
   job was restored from a savepoint or checkpoint other than the run that left it; another
   run of the job used these disks) and is restored over as if it were missing.
2. The driver's restore source is at another epoch than ``base_epoch`` (epochs ran after it
   without a checkpoint, and this task landed where their state is not): nothing here can
   produce the expected state, so fail with :class:`~stator.errors.StateMismatchError`. The
   driver rewinds the job to that checkpoint; the checkpoint itself is good and is kept.
3. A restore source at ``base_epoch`` covering the operator: a checkpoint at the same
   parallelism is restored from the executor's local copy when that copy holds the
   checkpoint's files (``local_copy.py``); otherwise, transparently, from the object store,
   linking the SSTs a local copy of the subtask already holds under the same object key
   (copies are pruned only after the restore). A standby copy of an older checkpoint
   (``standby_copy.py``) is first brought up to it with the files added since. Remote
   restores materialize the source (a checkpoint or native savepoint at the same
   parallelism, the owned key-groups of a rescaled one, or a canonical savepoint's
   key-group files). Files that are missing, truncated or unreadable
   as RocksDB fail with :class:`RestoreError` (the driver then drops that checkpoint and
   falls back to an older one); an object store that cannot be reached fails with its
   :class:`~stator.errors.StorageError` (the driver retries the same checkpoint).
   Except in a Spark retry of a task the driver sent to the executor that holds its state
   (``EpochSpec.pinned``): once that executor is lost, Spark retries the task on any free
   executor at once, which would read the state from the object store before the
   executor's replacement (same node, same volume) could register. That retry fails with
   :class:`~stator.errors.StateMismatchError` instead; the driver rewinds to the
   checkpoint and waits for the replacement (``locality/placement.py``). A retry is a later
   attempt of the task or any task of a resubmitted stage (a lost executor's shuffle
   output resubmits the stage), or a first attempt that runs elsewhere because that
   executor was lost after the driver planned the epoch. A first attempt that Spark placed
   elsewhere after the locality wait (the executor lives, but was busy) restores from the
   object store.
4. No source covering the operator: a new job, or an operator added by the restored job,
   starts empty; anything else is a :class:`~stator.errors.StateMismatchError`.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from ..api.time import MIN_TIMESTAMP
from ..checkpoint.metadata import SubtaskSnapshot
from ..checkpoint.transfer import download_snapshot
from ..cluster.jvm import executor_location, task_is_retry, task_location, task_sent_to_gone
from ..epoch.reports import NO_RESTORE, RestoreReport, RestoreSource
from ..epoch.spec import EpochSpec, RestoreTask
from ..errors import StateMismatchError, StatorError, StorageError
from ..keygroups import KeyGroupRange, SubtaskId
from ..savepoint.transfer import import_rows, savepoint_rows
from ..state.backend import KeptOpen, KeyedBackend
from ..state.discard import discard, sweep
from . import local_copy, standby_copy
from .rescale import install_operator_share, rescale_into

log = logging.getLogger("stator.tasks")

RESTORE_ERROR_MARKER = "StatorRestoreError"


class RestoreError(StatorError):
    """A checkpoint could not be materialized (missing, truncated or corrupt files)."""

    def __init__(self, checkpoint_id: int, detail: str) -> None:
        super().__init__(f"{RESTORE_ERROR_MARKER}[{checkpoint_id}]: {detail}")
        self.checkpoint_id = checkpoint_id


def open_state(
    spec: EpochSpec,
    uid: str,
    subtask: int,
    key_groups: KeyGroupRange,
    kept: KeptOpen | None = None,
) -> tuple[KeyedBackend, RestoreReport]:
    """Open the subtask's local state if it is at the expected epoch; otherwise restore it
    (from a checkpoint, a rescaled checkpoint or a savepoint, as the driver says), start a new
    operator empty, or fail so that the driver fails over. Also says where the state came
    from, for the driver's status and metrics. ``kept``: databases this process keeps open
    between epochs (a long-running task's)."""
    state_dir = spec.state_dir(uid, subtask)
    sweep(state_dir)
    try:
        opened = _open_state(spec, uid, subtask, key_groups, state_dir, kept)
        opened[0].clock.now_ms = spec.processing_time_ms  # TTL's time: the epoch's
    finally:
        # Pruned only now (a remote restore links the SSTs an older copy holds: ``_held_here``),
        # and also when the open fails: a retry on a full disk must not find them again.
        local_copy.prune(state_dir, _kept(spec, state_dir))
    # The subtask runs here now: what was a standby copy is a local copy, pruned as any.
    standby_copy.release(state_dir)
    return opened


def _kept(spec: EpochSpec, state_dir: Path) -> set[int]:
    """The local copies a subtask keeps when it opens its state (``local_copy.py``, step 3)."""
    keep = {spec.completed_checkpoint, *spec.in_flight}
    keep |= {spec.checkpoint.checkpoint_id} if spec.checkpoint is not None else set()
    keep |= {spec.restore.checkpoint_id} if spec.restore is not None else set()
    return keep | set(standby_copy.standby_ids(state_dir)[-1:])  # a restore may catch it up


def _open_state(
    spec: EpochSpec,
    uid: str,
    subtask: int,
    key_groups: KeyGroupRange,
    state_dir: Path,
    kept: KeptOpen | None,
) -> tuple[KeyedBackend, RestoreReport]:
    path = state_dir / "db"
    restore = spec.restore
    backend = KeyedBackend(
        path,
        spec.rocksdb,
        key_groups,
        spec.max_parallelism,
        uid,
        spec.warm_entries,
        spec.warm_key,
        kept,
    )
    local = _open_local(spec, uid, subtask, backend)
    if local is None:
        return backend, NO_RESTORE
    if restore is not None and restore.epoch != spec.base_epoch:
        raise StateMismatchError(
            f"operator '{uid}' subtask {subtask}: {local}, the "
            f"job expects epoch {spec.base_epoch}, and the restore source "
            f"({_describe(restore)}) is at epoch {restore.epoch}: the job must rewind to it"
        )
    if restore is None or not restore.covers(uid):
        if spec.base_epoch == 0 or restore is not None:  # a new job, or an operator added
            discard(path)
            backend.open()
            if spec.base_epoch:
                backend.commit(spec.base_epoch, MIN_TIMESTAMP)
            return backend, NO_RESTORE
        raise StateMismatchError(
            f"operator '{uid}' subtask {subtask}: {local}, the "
            f"job expects epoch {spec.base_epoch} and no checkpoint of that epoch was given"
        )
    started = time.monotonic()
    snapshot = restore.snapshots.get(SubtaskId(uid, subtask))
    fallback, fetched = None, 0
    if snapshot is not None and restore.savepoint is None:  # savepoints have no local copies
        fallback, fetched = _restore_from_copy(
            restore, spec, snapshot, key_groups, state_dir, backend
        )
        if fallback is None:
            return backend, RestoreReport(
                RestoreSource.LOCAL,
                restore.checkpoint_id,
                local_bytes=snapshot.state_bytes - fetched,
                remote_bytes=fetched,
                duration_ms=_ms_since(started),
            )
        log.info(
            "operator '%s' subtask %d: restoring checkpoint %d from the object store: %s",
            uid,
            subtask,
            restore.checkpoint_id,
            fallback,
        )
    _refuse_retry_elsewhere(spec, uid, subtask, restore.checkpoint_id)
    held = _held_here(restore, path)
    try:
        read = _restore_remote(restore, spec, uid, subtask, key_groups, backend, held)
    except RestoreError as exc:
        if not held:
            raise
        # A local file was not what its key says: the object store is the truth.
        log.warning(
            "operator '%s' subtask %d: checkpoint %d with local SST files failed (%s): "
            "reading all of it from the object store",
            uid,
            subtask,
            restore.checkpoint_id,
            exc,
        )
        read = _restore_remote(restore, spec, uid, subtask, key_groups, backend, {})
    # The checkpoint's files that were not read now were linked from a local copy
    # (``_held_here``); a standby copy's catching up may have read some of them just before.
    linked = snapshot.state_bytes - read if snapshot and not restore.savepoint else 0
    return backend, RestoreReport(
        RestoreSource.REMOTE,
        restore.checkpoint_id,
        savepoint=restore.savepoint is not None,
        local_bytes=max(0, linked - fetched),
        remote_bytes=read + fetched,
        duration_ms=_ms_since(started),
        fallback=fallback,
    )


def _restore_remote(
    restore: RestoreTask,
    spec: EpochSpec,
    uid: str,
    subtask: int,
    key_groups: KeyGroupRange,
    backend: KeyedBackend,
    held: dict[str, Path],
) -> int:
    """Step 3 from the object store, linking ``held`` (``_held_here``), with ``backend`` open
    on the result. Returns the bytes read from the store. Files that are missing, truncated,
    unreadable or at another epoch (or, with local files linked, another commit) fail with
    :class:`RestoreError`; a store that cannot be reached, or the executor's disk, with
    their own errors (retried)."""
    try:
        read = restore_into(restore, spec, uid, subtask, key_groups, backend.path, held)
        backend.open()
    except StorageError as exc:
        backend.close()
        if _all_present(restore, uid, subtask):  # the store failed us, not the checkpoint
            raise
        raise RestoreError(
            restore.checkpoint_id, f"operator '{uid}' subtask {subtask}: {exc}"
        ) from exc
    except OSError:  # the executor's disk (full, gone), not the checkpoint: retried
        backend.close()
        raise
    except Exception as exc:
        backend.close()
        raise RestoreError(
            restore.checkpoint_id, f"operator '{uid}' subtask {subtask}: {exc}"
        ) from exc
    # The files contradict their own metadata; with local files linked, so may their commit.
    snapshot = restore.snapshots.get(SubtaskId(uid, subtask))
    commit = snapshot.commit if held and snapshot is not None else ""
    if (why := _differs(backend, spec.base_epoch, commit)) is not None:
        backend.close()
        raise RestoreError(restore.checkpoint_id, f"restored state is {why}")
    return read


def _differs(backend: KeyedBackend, epoch: int, commit: str) -> str | None:
    """Why the open ``backend`` is not the checkpoint's state: at ``epoch`` and, when
    ``commit`` is given, that commit. None if it is."""
    if (backend.epoch, backend.commit_token if commit else "") == (epoch, commit):
        return None
    return (
        f"epoch {backend.epoch} commit {backend.commit_token[:8]}, the checkpoint epoch "
        f"{epoch} commit {commit[:8] or '(unknown)'}"
    )


def _refuse_retry_elsewhere(spec: EpochSpec, uid: str, subtask: int, checkpoint_id: int) -> None:
    """Step 3's exception: a retry, away from the executor that holds the state, does not
    read it from the object store."""
    pinned = spec.pinned.get(SubtaskId(uid, subtask))
    if pinned is None:
        return
    executor, host = task_location()
    if not executor or executor_location(host, executor) == pinned:
        return
    if task_is_retry():
        what = "this retry of its task"
    elif task_sent_to_gone():  # lost after the epoch was planned: a retry in all but name
        what = "that executor is gone, and its task"
    else:  # the executor lives, but was busy past the locality wait
        return
    raise StateMismatchError(
        f"operator '{uid}' subtask {subtask}: its state is on {pinned}, and {what} "
        f"runs on executor {executor} ({host}): it does not read the state from the "
        f"object store here. The job rewinds to checkpoint {checkpoint_id} and waits up to "
        f"local_recovery.executor_wait_ms for that executor or its replacement"
    )


def _restore_from_copy(
    restore: RestoreTask,
    spec: EpochSpec,
    snapshot: SubtaskSnapshot,
    key_groups: KeyGroupRange,
    state_dir: Path,
    backend: KeyedBackend,
) -> tuple[str | None, int]:
    """Open ``backend`` on the executor's copy of the checkpoint (``local_copy.py``, steps
    1-3 of restoring), first bringing a standby copy of an older checkpoint up to it
    (``standby_copy.py``). Returns None on success, else why the object store must be read;
    and the bytes the standby copy's catching up read from the object store (also when the
    copy then fails)."""
    if not restore.local_copies:
        return "no local copy (local recovery is off, or the checkpoint is not this job's)", 0
    if tuple(snapshot.key_groups) != (key_groups.start, key_groups.end):
        return "key-groups differ", 0  # the remote path reports it
    copy = local_copy.copy_dir(state_dir, restore.checkpoint_id)
    reason, fetched = _catch_up(restore, snapshot, state_dir)
    if reason is not None:
        return reason, fetched
    try:
        local_copy.restore_local(copy, snapshot.files, backend.path)
        backend.open()
    except Exception as exc:
        backend.close()
        return f"local copy unusable: {type(exc).__name__}: {exc}", fetched
    if (why := _differs(backend, spec.base_epoch, snapshot.commit)) is not None:
        backend.close()
        return f"local copy is {why}", fetched
    return None, fetched


def _catch_up(
    restore: RestoreTask, snapshot: SubtaskSnapshot, state_dir: Path
) -> tuple[str | None, int]:
    """Why the executor's copy of the checkpoint does not hold its files (None if it does),
    after bringing a standby copy of an older checkpoint up to it; and the bytes read."""
    copy = local_copy.copy_dir(state_dir, restore.checkpoint_id)
    reason = local_copy.mismatch(copy, snapshot.files)
    if reason is None or not standby_copy.standby_ids(state_dir):
        return reason, 0
    try:
        fetched = standby_copy.keep(restore.store, state_dir, restore.checkpoint_id, snapshot.files)
    except Exception as exc:
        return f"{reason}; catching a standby copy up failed: {exc}", 0
    return local_copy.mismatch(copy, snapshot.files), fetched


def _open_local(spec: EpochSpec, uid: str, subtask: int, backend: KeyedBackend) -> str | None:
    """Step 1: leave ``backend`` open on the local state if it is at ``base_epoch`` and the
    commit the job's state descends from (None); otherwise say what is there, for the error
    that rewinds the job. At epoch 0 nothing was committed, so whatever lies there (the rows
    of a restore that was killed halfway, which builds in place) is not state: it is
    started over. Without an expected commit (an operator the restore source does not have,
    or was taken at another parallelism) nothing local is trusted."""
    if not backend.path.exists():
        return "there is no local state"
    if spec.base_epoch == 0:
        return "nothing was committed at epoch 0"
    backend.open()
    if backend.epoch != spec.base_epoch:
        backend.close()
        return f"local state is at epoch {backend.epoch}"
    expected = spec.commits.get(SubtaskId(uid, subtask), "")
    if expected and backend.commit_token == expected:
        return None
    backend.close()
    log.info(
        "operator '%s' subtask %d: local state at epoch %d is commit %s, the job's is %s: "
        "another lineage's, restoring over it",
        uid,
        subtask,
        spec.base_epoch,
        backend.commit_token[:8] or "(none)",
        expected[:8] or "(unknown)",
    )
    return f"local state at epoch {backend.epoch} is another lineage's"


def _ms_since(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


def _describe(restore: RestoreTask) -> str:
    return "a savepoint" if restore.savepoint is not None else f"checkpoint {restore.checkpoint_id}"


def _all_present(restore: RestoreTask, uid: str, subtask: int) -> bool:
    """After a storage error: are the snapshot's files all there with their sizes? Raises
    :class:`StorageError` itself if the store cannot be asked (unreachable: not the
    checkpoint's fault). Only a checkpoint with missing or resized files is corrupt."""
    snapshot = restore.snapshots.get(SubtaskId(uid, subtask))
    files = snapshot.files if snapshot is not None else ()
    if snapshot is None:
        files = tuple(f for s in restore.rescale.get(uid, ()) for f in s.files)
    return all(restore.store.size(f.key) == f.size for f in files if f.stored)


def restore_into(
    restore: RestoreTask,
    spec: EpochSpec,
    uid: str,
    subtask: int,
    key_groups: KeyGroupRange,
    path: Path,
    held: dict[str, Path] | None = None,
) -> int:
    """Materialize the subtask's restored state in ``path`` (replacing what is there),
    linking the files of ``held`` (store key -> local file) instead of reading them.
    Returns the bytes of checkpoint files read from the object store."""
    snapshot = restore.snapshots.get(SubtaskId(uid, subtask))
    if snapshot is not None:
        if tuple(snapshot.key_groups) != (key_groups.start, key_groups.end):
            raise StateMismatchError(
                f"the checkpoint holds key-groups {snapshot.key_groups}, "
                f"subtask {subtask} owns {key_groups}"
            )
        read = download_snapshot(restore.store, snapshot.files, path, held)
        if restore.savepoint is not None:  # native: the job resumes at the savepoint's epoch
            _resume_at(spec, uid, key_groups, path)
        return read
    discard(path)
    target = KeyedBackend(path, spec.rocksdb, key_groups, spec.max_parallelism, uid).open()
    try:
        if restore.savepoint is not None and not restore.savepoint.native:
            op = restore.savepoint.operators[uid]
            import_rows(target, op.states, savepoint_rows(restore.store, op.key_groups, key_groups))
            # Every file read was checked against these sizes (savepoint_rows).
            read = sum(
                int(f.get("bytes", 0)) for kg, f in op.key_groups.items() if kg in key_groups
            )
            watermark = op.watermark
            blobs = [op.operator_states.get(i, "") for i in range(op.parallelism)]
        else:
            watermark, read = rescale_into(restore, spec, uid, key_groups, path, target)
            blobs = [s.operator_state for s in sorted(restore.rescale[uid], key=lambda s: s.index)]
        install_operator_share(target, blobs, spec.parallelism[uid], subtask)
        target.commit(spec.base_epoch, watermark)
    finally:
        target.close()
    return read


def _held_here(restore: RestoreTask, path: Path) -> dict[str, Path]:
    """Store key -> SST file of a local copy in the subtask's state directory, which a remote
    restore hard-links instead of downloading (keys are unique per upload: the same key is the
    same bytes): an older copy of the subtask's own, or the checkpoint's copy that failed its
    check for another file. Only SSTs are immutable (RocksDB appends to the others when it
    opens a database), and only this job's checkpoints with local recovery on have copies."""
    if not restore.local_copies or restore.savepoint is not None:
        return {}
    held = local_copy.reusable(path.parent)
    return {key: file for key, file in held.items() if file.suffix == ".sst"}


def _resume_at(spec: EpochSpec, uid: str, key_groups: KeyGroupRange, path: Path) -> None:
    """A native savepoint's database is at the epoch its failover region took its part; the
    job resumes after the highest epoch of the regions it shares uids with (``Target.part_for``),
    as a canonical restore's database is written at ``base_epoch``."""
    with KeyedBackend(path, spec.rocksdb, key_groups, spec.max_parallelism, uid) as db:
        if db.epoch != spec.base_epoch:
            db.commit(spec.base_epoch, db.watermark)
