"""A keyed subtask's snapshot for a checkpoint: the synchronous part on the task's path
(flush, hard links, the upload planned), then the upload of what is new, here or by the
worker's uploader. Kept apart from opening and restoring state (``restore.py``): the two
run at opposite ends of a task and share only the local copies (``local_copy.py``)."""

from __future__ import annotations

import shutil

from ..checkpoint import uploads
from ..checkpoint.metadata import SubtaskSnapshot
from ..checkpoint.transfer import plan_upload, send_files
from ..epoch.spec import EpochSpec
from ..keygroups import KeyGroupRange, SubtaskId
from ..state.backend import KeyedBackend
from ..state.operator_state import to_text
from . import local_copy


def take_snapshot(
    spec: EpochSpec, uid: str, subtask: int, key_groups: KeyGroupRange, backend: KeyedBackend
) -> tuple[SubtaskSnapshot, str]:
    """Synchronous part (flush + hard links, plan the upload), then the upload of what is
    new: here, or handed to the worker's uploader (``checkpoint/uploads.py``). Returns the
    snapshot and the token of an asynchronous upload ("" if done)."""
    ck = spec.checkpoint
    assert ck is not None
    base = spec.state_dir(uid, subtask)
    local = local_copy.copy_dir(base, ck.checkpoint_id)
    # An earlier attempt's keys would name this attempt's files until it writes its own.
    local_copy.keys_path(base, ck.checkpoint_id).unlink(missing_ok=True)
    files = backend.snapshot_to(local)
    plan = plan_upload(
        ck.checkpoint_id,
        uid,
        subtask,
        local,
        files,
        ck.previous.get(SubtaskId(uid, subtask), {}),
        ck.incremental,
        ck.inline_max_bytes,
    )
    snapshot = SubtaskSnapshot(
        subtask,
        spec.parallelism[uid],
        (key_groups.start, key_groups.end),
        spec.epoch,
        plan.files,
        plan.bytes,
        backend.commit_token,
        to_text(backend.operator_blob),
    )
    # Keep this copy, those of checkpoints still uploading and the latest completed
    # checkpoint's until the driver confirms a newer one (none with local recovery off,
    # once uploaded).
    keep = {ck.checkpoint_id, spec.completed_checkpoint, *spec.in_flight}
    local_copy.prune(base, keep if ck.keep_local else {ck.checkpoint_id, *spec.in_flight})
    if ck.keep_local:
        local_copy.write_keys(base, ck.checkpoint_id, plan.files)
    job = uploads.UploadJob(
        ck.store, ck.checkpoint_id, uid, subtask, local, plan, ck.deadline_ms, not ck.keep_local
    )
    if ck.async_upload and uploads.submit(job):
        return snapshot, plan.token
    try:
        send_files(ck.store, local, plan.todo, ck.deadline_ms)
    finally:
        if job.drop_copy:
            shutil.rmtree(local, ignore_errors=True)
    return snapshot, ""
