"""Task-local copies of checkpoints: the secondary copy a keyed subtask keeps on its executor's
disk, so that a restore on the same executor reads local files instead of the object store.

The object store copy stays the primary and the truth: a checkpoint completes or fails on its
upload alone, and a local copy is used only when it provably holds the same files.

Keeping copies (one subtask, one executor):

1. ``take_snapshot`` writes ``chk-<id>`` under the subtask's state directory (hard links to
   the live SST files, copied manifest and options) before it uploads. A failure here fails
   the checkpoint part, as before; a half-written copy is pruned at step 3.
2. The driver completes checkpoint ``<id>`` (its metadata written) and names it in the next
   epoch's spec (``EpochSpec.completed_checkpoint``). A declined or failed checkpoint is never
   named, so its copy is never restored from.
3. Each task of the subtask, once its state is open, prunes every copy except the completed
   one named by the driver, the one the task restored from and the one it is taking now.
   Until the driver confirms a newer checkpoint, the copy of the latest completed one stays.

Beside each copy, ``keys-<id>.json`` names the object-store key of each of its stored files
(:func:`write_keys`). Keys are unique per upload, so a copy of another checkpoint of the
subtask that needs the object with that key hard-links the file instead of downloading it
(:func:`reusable`): a standby copy made on an executor whose volume holds the subtask's own
older copy (the replacement of the executor that ran it) reads only the files added since;
so does a restore from the object store on an executor that kept only an older copy (SSTs
only: ``locality/restore.py``).

Restoring from a copy (``restore_local``):

1. Verify: the copy's files have the names and sizes of the checkpoint's metadata. A missing,
   truncated or stale copy returns a reason and the caller downloads from the object store.
2. Materialize into a staging directory next to the database: SST files are hard-linked
   (immutable), the others are copied (RocksDB appends to its manifest when it opens).
3. Replace the database with the staging directory (a rename; the old database is deleted in
   the background, ``state/discard.py``). A failure before the rename leaves the old database
   and a staging directory that the next restore replaces; the caller then falls back to the
   object store.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

from ..atomic_file import write_atomically
from ..checkpoint.metadata import RemoteFile
from ..state.discard import discard, replace_dir

COPY_PREFIX = "chk-"
KEYS_PREFIX = "keys-"


def copy_dir(state_dir: Path, checkpoint_id: int) -> Path:
    """Where subtask state dir ``state_dir`` keeps its copy of checkpoint ``checkpoint_id``."""
    return state_dir / f"{COPY_PREFIX}{checkpoint_id}"


def copy_ids(state_dir: Path) -> list[int]:
    """Checkpoint ids of the local copies present, oldest first."""
    found = []
    for entry in state_dir.glob(f"{COPY_PREFIX}*"):
        tail = entry.name[len(COPY_PREFIX) :]
        if tail.isdigit():
            found.append(int(tail))
    return sorted(found)


def keys_path(state_dir: Path, checkpoint_id: int) -> Path:
    return state_dir / f"{KEYS_PREFIX}{checkpoint_id}.json"


def write_keys(state_dir: Path, checkpoint_id: int, files: tuple[RemoteFile, ...]) -> None:
    """Name the store key of each stored file of the copy of ``checkpoint_id``."""
    keys = {f.name: f.key for f in files if f.stored}
    write_atomically(keys_path(state_dir, checkpoint_id), json.dumps(keys).encode())


def reusable(state_dir: Path) -> dict[str, Path]:
    """Store key -> local file, over every copy in ``state_dir`` with its keys named. A file
    is used only if its size is the checkpoint's (``transfer.download_snapshot``)."""
    out: dict[str, Path] = {}
    for checkpoint_id in copy_ids(state_dir):
        try:
            keys = json.loads(keys_path(state_dir, checkpoint_id).read_text())
        except (OSError, ValueError):
            continue
        copy = copy_dir(state_dir, checkpoint_id)
        out.update({key: copy / name for name, key in keys.items()})
    return out


def drop(state_dir: Path, checkpoint_id: int) -> None:
    """Delete a copy (in the background: the last links of old SSTs) and its keys."""
    keys_path(state_dir, checkpoint_id).unlink(missing_ok=True)
    discard(copy_dir(state_dir, checkpoint_id))


def mismatch(copy: Path, files: tuple[RemoteFile, ...]) -> str | None:
    """Why ``copy`` does not hold exactly ``files`` (names and sizes), or None if it does."""
    if not copy.is_dir():
        return "no local copy"
    present = {p.name: p.stat().st_size for p in copy.iterdir() if p.is_file()}
    expected = {f.name: f.size for f in files}
    missing = sorted(set(expected) - set(present))
    if missing:
        return f"local copy lacks {missing[:3]}"
    extra = sorted(set(present) - set(expected))
    if extra:
        return f"local copy has files the checkpoint does not: {extra[:3]}"
    resized = sorted(n for n, size in expected.items() if present[n] != size)
    if resized:
        n = resized[0]
        return f"local {n} has {present[n]} bytes, the checkpoint says {expected[n]}"
    return None


def restore_local(copy: Path, files: tuple[RemoteFile, ...], target: Path) -> int:
    """Steps 2-3 of restoring (module docstring): ``target`` becomes a database made of the
    copy's files. The caller has verified them (step 1). Returns the bytes it holds."""
    staging = target.parent / f".{target.name}.local-{uuid.uuid4().hex[:8]}"
    staging.mkdir(parents=True)
    try:
        for f in files:
            if f.name.endswith(".sst"):
                os.link(copy / f.name, staging / f.name)
            else:
                shutil.copyfile(copy / f.name, staging / f.name)
        replace_dir(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return sum(f.size for f in files)


def prune(state_dir: Path, keep: set[int]) -> list[int]:
    """Step 3 of keeping copies: delete every copy whose id is not in ``keep``."""
    removed = []
    for checkpoint_id in copy_ids(state_dir):
        if checkpoint_id not in keep:
            drop(state_dir, checkpoint_id)
            removed.append(checkpoint_id)
    return removed
