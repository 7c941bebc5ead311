"""Native-format savepoints: a keyed subtask's RocksDB files, uploaded as they are into the
savepoint's own directory (no reference to the checkpoints: disposing of either never breaks
the other). Restoring one is restoring a checkpoint (``locality/restore.py``): the same
download at the same parallelism, the same copy of overlapping databases' key-groups at
another.

Writing subtask S's part:

1. Flush and hard-link the committed database into a directory beside it
   (``KeyedBackend.snapshot_to``). Failure: the task fails, and with it the savepoint epoch
   (the savepoint fails; its directory has no metadata).
2. Upload every file under ``<uid>/<S>/<attempt token>/`` (a retried attempt never
   overwrites the files an earlier attempt's report names). Failure: as step 1.
3. The links are removed whatever happened (a killed attempt's, by the next attempt); the
   part (file names, keys and sizes) goes to the driver in the task's report, and the
   driver writes ``_savepoint.json`` once every part is in (``driver/savepoints.py``).
4. After that, the files of attempts whose report the driver did not keep (a retried task's
   first upload, a whole database each) are deleted (``remove_strays``; best effort: a
   failure leaves them to ``stator savepoint dispose``, which deletes the whole directory).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from ..checkpoint.checksums import file_checksum
from ..checkpoint.metadata import RemoteFile, SubtaskSnapshot
from ..checkpoint.transfer import new_upload_token, send_files
from ..keygroups import KeyGroupRange
from ..state.backend import KeyedBackend
from ..state.operator_state import to_text
from ..storage import ObjectStore
from .metadata import SavepointMetadata

LINKS_PREFIX = "savepoint-"
log = logging.getLogger("stator.savepoint")


def export_database(
    backend: KeyedBackend,
    store: ObjectStore,
    subtask: int,
    parallelism: int,
    epoch: int,
    work: Path,
) -> SubtaskSnapshot:
    """Steps 1-3 of the module docstring; ``work`` is a scratch directory beside the
    database (hard links need the same file system)."""
    for stale in work.glob(f"{LINKS_PREFIX}*"):  # left by an attempt that was killed
        shutil.rmtree(stale, ignore_errors=True)
    token = new_upload_token()
    local = work / f"{LINKS_PREFIX}{token}"
    try:
        files = backend.snapshot_to(local)
        prefix = f"{backend.operator_uid}/{subtask}/{token}"
        todo = tuple((f.name, f"{prefix}/{f.name}") for f in files)
        checksums = {f.name: file_checksum(local / f.name) for f in files}
        send_files(store, local, todo)
    finally:
        shutil.rmtree(local, ignore_errors=True)
    key_groups: KeyGroupRange = backend.key_groups
    keys = dict(todo)
    remote = tuple(
        RemoteFile(f.name, keys[f.name], f.size, False, checksum=checksums[f.name])
        for f in sorted(files, key=lambda f: f.name)
    )
    return SubtaskSnapshot(
        subtask,
        parallelism,
        (key_groups.start, key_groups.end),
        epoch,
        remote,
        sum(f.size for f in remote),
        operator_state=to_text(backend.operator_blob),
    )


def stray_files(meta: SavepointMetadata, listing: list[tuple[str, int]]) -> list[str]:
    """Keys under a native savepoint's operator directories that its metadata does not name
    (step 4 of the module docstring)."""
    kept = {f.key for op in meta.operators.values() for s in op.subtasks for f in s.files}
    prefixes = tuple(f"{uid}/" for uid, op in meta.operators.items() if op.subtasks)
    return [key for key, _ in listing if key.startswith(prefixes) and key not in kept]


def remove_strays(store: ObjectStore, meta: SavepointMetadata) -> None:
    """Step 4 of the module docstring, once ``meta`` is written."""
    if not meta.native:
        return
    try:
        strays = stray_files(meta, store.listing())
        store.delete(strays)
    except Exception as exc:
        log.warning("savepoint %s: files of retried attempts left behind: %s", store.uri, exc)
        return
    if strays:
        log.info("savepoint %s: deleted %d files of retried attempts", store.uri, len(strays))
