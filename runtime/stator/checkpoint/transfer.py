"""Executor side of checkpoints: plan and send the upload of a local RocksDB snapshot
(incrementally), and materialize a checkpointed snapshot into a fresh local directory."""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from ..state.backend import LocalFile
from ..state.discard import replace_dir
from ..storage import TRANSFER_CALLERS, ObjectStore
from .checksums import file_checksum, matches
from .metadata import RemoteFile, checkpoint_dir

log = logging.getLogger("stator.checkpoint")


class TruncatedFile(ValueError):
    """A downloaded checkpoint file is not the size its metadata says: the checkpoint's
    fault (restoring it drops it), unlike an error of the executor's own disk."""


def shared_key(uid: str, name: str) -> str:
    # A fresh uuid per upload: after a restore, RocksDB may reuse a file number for new
    # content, so the local name alone never identifies a shared file.
    return f"shared/{uid}/{uuid.uuid4().hex[:16]}-{name}"


def upload_dir(checkpoint_id: int, uid: str, subtask: int, token: str) -> str:
    """Where one task attempt puts a subtask's private files (and, asynchronously, its
    confirmation): a token per attempt, so that a retried or speculative attempt of the same
    subtask never overwrites the files of the attempt whose report the driver keeps."""
    return f"{checkpoint_dir(checkpoint_id)}/{uid}/{subtask}/{token}"


def new_upload_token() -> str:
    return uuid.uuid4().hex[:12]


@dataclass(frozen=True)
class UploadPlan:
    """What a subtask's snapshot consists of in the store, and which of its files must still
    be sent there (``todo``: local name -> key). The keys are chosen before anything is sent,
    so the driver knows every key a checkpoint may leave behind, even one that never ends."""

    token: str
    files: tuple[RemoteFile, ...]
    todo: tuple[tuple[str, str], ...]
    bytes: int


def plan_upload(
    checkpoint_id: int,
    uid: str,
    subtask: int,
    local_dir: Path,
    files: list[LocalFile],
    previous: dict[str, RemoteFile],
    incremental: bool,
    inline_max: int = 0,
) -> UploadPlan:
    """Re-reference what the last confirmed checkpoint already holds; put private files of
    at most ``inline_max`` bytes into the metadata (read here, from ``local_dir``); send the
    rest. Shared SSTs (incremental) stay objects whatever their size: the next checkpoints
    re-reference them instead of carrying their bytes again.

    ``previous`` maps local file names of the previous *completed* checkpoint's snapshot of
    this subtask to their remote files.
    """
    token = new_upload_token()
    private = upload_dir(checkpoint_id, uid, subtask, token)
    result: list[RemoteFile] = []
    todo: list[tuple[str, str]] = []
    sent = 0
    for f in files:
        prev = previous.get(f.name) if incremental and f.shared else None
        # Only a shared file is re-referenced: the registry counts its references. A private
        # one (a full checkpoint's, before the job switched to incremental) goes with its
        # checkpoint's directory, which would take it from every later checkpoint.
        if prev is not None and prev.size == f.size and prev.shared:
            result.append(prev)
            continue
        shared = incremental and f.shared
        if not shared and inline_max and f.size <= inline_max:
            data = (local_dir / f.name).read_bytes()
            if len(data) != f.size:
                raise OSError(f"{local_dir / f.name} has {len(data)} bytes, not {f.size}")
            result.append(RemoteFile(f.name, "", f.size, False, base64.b64encode(data).decode()))
            sent += f.size
            continue
        key = shared_key(uid, f.name) if shared else f"{private}/{f.name}"
        checksum = file_checksum(local_dir / f.name)  # read once, when it is first sent
        result.append(RemoteFile(f.name, key, f.size, shared, checksum=checksum))
        todo.append((f.name, key))
        sent += f.size
    return UploadPlan(token, tuple(sorted(result, key=lambda r: r.name)), tuple(todo), sent)


def send_files(
    store: ObjectStore,
    local_dir: Path,
    todo: tuple[tuple[str, str], ...],
    deadline_ms: int = 0,
) -> None:
    """Put every (local name, key) of ``todo``, in parallel threads. Past ``deadline_ms``
    (epoch milliseconds, 0: none) no further file is started: the checkpoint has timed out."""

    def send(item: tuple[str, str]) -> None:
        if deadline_ms and time.time() * 1000 > deadline_ms:
            raise TimeoutError(f"the checkpoint timed out before {item[1]} was sent")
        store.put_file(item[1], local_dir / item[0])

    if todo:
        with ThreadPoolExecutor(min(TRANSFER_CALLERS, len(todo))) as pool:
            list(pool.map(send, todo))


def download_snapshot(
    store: ObjectStore,
    files: tuple[RemoteFile, ...],
    target: Path,
    reuse: dict[str, Path] | None = None,
    salvage: Path | None = None,
    on_read: Callable[[int], None] | None = None,
) -> int:
    """Materialize a snapshot into ``target`` (replaced atomically). Returns the bytes
    read from the store (inline files' included: the metadata brought them).

    ``reuse``: store key -> a local file that holds that object (a local copy of another
    checkpoint of the subtask: ``locality/standby_copy.py``, ``locality/restore.py``),
    hard-linked instead of downloaded. Keys are
    unique per upload (``shared_key``), so the same key is the same bytes.

    ``salvage``: when a file fails, the others are still fetched, and every file fetched
    whole is hard-linked there (:func:`salvaged`), so that the next attempt reuses them. A
    copy made in the background of a checkpoint that was already retired loses one file to
    retention, not all it read.

    ``on_read``: called with the size of each object read from the store, also when the
    download then fails (a standby copy's tally counts what a failed attempt read).

    Sizes and checksums are checked against the metadata, so a truncated, swapped or changed
    file fails the restore (and the coordinator falls back to an older checkpoint) instead of
    corrupting state; a local copy that fails them is downloaded instead.
    """
    reuse = reuse or {}
    staging = target.parent / f".{target.name}.restoring-{uuid.uuid4().hex[:8]}"
    staging.mkdir(parents=True)
    fetched: list[RemoteFile] = []  # list.append is atomic: the pool's threads share it
    try:

        def fetch(f: RemoteFile) -> int:
            dest = staging / f.name
            if not f.stored:  # bytes the metadata carried (checked when it was read)
                return dest.write_bytes(base64.b64decode(f.inline))
            have = reuse.get(f.key)
            if have is not None and _link(have, dest, f.size, f.checksum):
                return 0
            store.get_file(f.key, dest)
            got = dest.stat().st_size
            if on_read is not None:
                on_read(got)
            if got != f.size:
                raise TruncatedFile(
                    f"{store.url(f.key)} has {got} bytes, the checkpoint says {f.size}"
                )
            if not matches(dest, f.checksum):
                raise TruncatedFile(
                    f"{store.url(f.key)} does not have the checksum the checkpoint recorded "
                    f"({f.checksum}): it was changed after it was written"
                )
            fetched.append(f)
            return got

        with ThreadPoolExecutor(max(1, min(TRANSFER_CALLERS, len(files)))) as pool:
            if salvage is None:  # a failed restore falls back at once
                total = sum(pool.map(fetch, files))
            else:  # every file that can be fetched is, for the next attempt
                futures = [pool.submit(fetch, f) for f in files]
                wait(futures)
                total = sum(future.result() for future in futures)
        replace_dir(staging, target)
        return total
    except BaseException:
        if salvage is not None:
            salvage.mkdir(parents=True, exist_ok=True)
            for f in fetched:
                _link(staging / f.name, salvaged(salvage, f.key), f.size)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def salvaged(salvage: Path, key: str) -> Path:
    """Where :func:`download_snapshot` keeps the object ``key`` fetched by a failed attempt."""
    return salvage / hashlib.sha256(key.encode()).hexdigest()[:32]


def _link(source: Path, dest: Path, size: int, checksum: str = "") -> bool:
    """Hard-link ``source`` as ``dest`` if it is there with ``size`` bytes (and ``checksum``:
    a local copy that was changed is not used; the file is downloaded instead)."""
    try:
        if source.stat().st_size != size:
            return False
        if not matches(source, checksum):
            log.warning("local copy %s does not match its checksum; downloading it", source)
            return False
        os.link(source, dest)
    except OSError:
        return False
    return True
