"""Native-format savepoints: a keyed subtask's RocksDB files, uploaded as they are into the
savepoint's own directory (no reference to the checkpoints: disposing of either never breaks
the other). Restoring one is restoring a checkpoint (``tasks/local_state.py``): the same
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
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ..checkpoint.metadata import RemoteFile, SubtaskSnapshot
from ..checkpoint.transfer import new_upload_token, send_files
from ..keygroups import KeyGroupRange
from ..state.backend import KeyedBackend
from ..storage import ObjectStore

LINKS_PREFIX = "savepoint-"


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
        send_files(store, local, todo)
    finally:
        shutil.rmtree(local, ignore_errors=True)
    key_groups: KeyGroupRange = backend.key_groups
    keys = dict(todo)
    remote = tuple(
        RemoteFile(f.name, keys[f.name], f.size, False) for f in sorted(files, key=lambda f: f.name)
    )
    return SubtaskSnapshot(
        subtask,
        parallelism,
        (key_groups.start, key_groups.end),
        epoch,
        remote,
        sum(f.size for f in remote),
    )
