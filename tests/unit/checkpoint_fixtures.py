"""Checkpoint metadata and a subtask's snapshot directory, shared by the checkpoint tests
(registry, transfer, checksums, ownership): one shape of each, so they test the same thing."""

from __future__ import annotations

from pathlib import Path

from stator.checkpoint.metadata import (
    CheckpointMetadata,
    OperatorSnapshot,
    RemoteFile,
    SubtaskSnapshot,
)
from stator.state.backend import LocalFile

SUM = "xxh3:0123456789abcdef"  # a stored file's checksum (its bytes are never read here)

FILES = {
    "CURRENT": b"MANIFEST-000005\n",
    "MANIFEST-000005": b"m" * 900,
    "000007.sst": b"s" * 50_000,
    "000008.sst": b"t" * 300,  # a tiny SST: shared (incremental), so an object all the same
}


def make_meta(cid: int, files: list[RemoteFile]) -> CheckpointMetadata:
    """Checkpoint ``cid`` of job "job": one operator "op" with one subtask holding ``files``."""
    snap = SubtaskSnapshot(0, 1, (0, 128), cid, tuple(files))
    return CheckpointMetadata(
        cid, cid, "job", 0, 128, True, {"op": OperatorSnapshot("op", 1, (snap,))}, {}, {}, 0
    )


def snapshot_dir(tmp_path: Path) -> tuple[Path, list[LocalFile]]:
    """A subtask's checkpoint directory holding ``FILES``, and its files as the backend
    lists them."""
    local = tmp_path / "chk-1"
    local.mkdir()
    for name, data in FILES.items():
        (local / name).write_bytes(data)
    return local, [LocalFile(n, len(d), n.endswith(".sst")) for n, d in FILES.items()]
