"""Executor side of checkpoints: upload a local RocksDB snapshot incrementally, and
materialize a checkpointed snapshot into a fresh local directory."""

from __future__ import annotations

import shutil
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..state.backend import LocalFile
from ..storage import ObjectStore
from .metadata import RemoteFile, checkpoint_dir

UPLOAD_THREADS = 4


def shared_key(uid: str, name: str) -> str:
    # A fresh uuid per upload: after a restore, RocksDB may reuse a file number for new
    # content, so the local name alone never identifies a shared file.
    return f"shared/{uid}/{uuid.uuid4().hex[:16]}-{name}"


def private_key(checkpoint_id: int, uid: str, subtask: int, name: str) -> str:
    return f"{checkpoint_dir(checkpoint_id)}/{uid}/{subtask}/{name}"


def upload_snapshot(
    store: ObjectStore,
    checkpoint_id: int,
    uid: str,
    subtask: int,
    local_dir: Path,
    files: list[LocalFile],
    previous: dict[str, RemoteFile],
    incremental: bool,
) -> tuple[list[RemoteFile], int]:
    """Upload what the last confirmed checkpoint does not already hold; re-reference the rest.

    Returns the snapshot's files and the bytes uploaded. ``previous`` maps local file names of
    the previous *completed* checkpoint's snapshot of this subtask to their remote files.
    """
    result: list[RemoteFile] = []
    todo: list[tuple[LocalFile, str]] = []
    for f in files:
        prev = previous.get(f.name) if incremental and f.shared else None
        if prev is not None and prev.size == f.size:
            result.append(prev)
            continue
        key = (
            shared_key(uid, f.name)
            if incremental and f.shared
            else private_key(checkpoint_id, uid, subtask, f.name)
        )
        todo.append((f, key))

    def send(item: tuple[LocalFile, str]) -> RemoteFile:
        f, key = item
        store.put_file(key, local_dir / f.name)
        return RemoteFile(f.name, key, f.size, incremental and f.shared)

    if todo:
        with ThreadPoolExecutor(min(UPLOAD_THREADS, len(todo))) as pool:
            result.extend(pool.map(send, todo))
    return sorted(result, key=lambda r: r.name), sum(f.size for f, _ in todo)


def download_snapshot(store: ObjectStore, files: tuple[RemoteFile, ...], target: Path) -> int:
    """Materialize a snapshot into ``target`` (replaced atomically). Returns bytes read.

    Sizes are checked against the metadata, so a truncated or swapped file fails the restore
    (and the coordinator falls back to an older checkpoint) instead of corrupting state.
    """
    staging = target.parent / f".{target.name}.restoring-{uuid.uuid4().hex[:8]}"
    staging.mkdir(parents=True)
    try:

        def fetch(f: RemoteFile) -> int:
            dest = staging / f.name
            store.get_file(f.key, dest)
            got = dest.stat().st_size
            if got != f.size:
                raise OSError(f"{store.url(f.key)} has {got} bytes, the checkpoint says {f.size}")
            return got

        with ThreadPoolExecutor(max(1, min(UPLOAD_THREADS, len(files)))) as pool:
            total = sum(pool.map(fetch, files))
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
        return total
    finally:
        shutil.rmtree(staging, ignore_errors=True)
