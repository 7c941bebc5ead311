"""Checkpoint metadata: the one object that makes a checkpoint exist. Written last, read
first; everything else under a checkpoint is reachable from it."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import CheckpointNotFoundError

FORMAT_VERSION = 1
METADATA_NAME = "_metadata"


def checkpoint_dir(checkpoint_id: int) -> str:
    return f"chk-{checkpoint_id:010d}"


def metadata_key(checkpoint_id: int) -> str:
    return f"{checkpoint_dir(checkpoint_id)}/{METADATA_NAME}"


def parse_checkpoint_dir(name: str) -> int | None:
    if name.startswith("chk-") and name[4:].isdigit():
        return int(name[4:])
    return None


@dataclass(frozen=True)
class RemoteFile:
    """A file of a subtask's RocksDB snapshot: its local name and where it is stored."""

    name: str
    key: str  # relative to the job's checkpoint root
    size: int
    shared: bool  # in shared/ and reference-counted, or private to one checkpoint


@dataclass(frozen=True)
class SubtaskSnapshot:
    index: int
    parallelism: int
    key_groups: tuple[int, int]
    epoch: int
    files: tuple[RemoteFile, ...]
    incremental_bytes: int = 0  # bytes this checkpoint uploaded for this subtask

    @property
    def state_bytes(self) -> int:
        return sum(f.size for f in self.files)


@dataclass(frozen=True)
class OperatorSnapshot:
    uid: str
    parallelism: int
    subtasks: tuple[SubtaskSnapshot, ...]
    states: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PendingCommit:
    """Sink output staged for ``epoch`` and covered by this checkpoint, to be committed."""

    epoch: int
    parts: tuple[Any, ...]


@dataclass(frozen=True)
class CheckpointMetadata:
    checkpoint_id: int
    epoch: int
    job: str
    created_ms: int
    max_parallelism: int
    incremental: bool
    operators: dict[str, OperatorSnapshot]
    sources: dict[str, dict[str, dict[str, Any]]]  # uid -> split -> SplitState json
    sinks: dict[str, tuple[PendingCommit, ...]]
    watermark: int
    duration_ms: int = 0
    format_version: int = FORMAT_VERSION

    @property
    def state_bytes(self) -> int:
        return sum(s.state_bytes for op in self.operators.values() for s in op.subtasks)

    @property
    def incremental_bytes(self) -> int:
        return sum(s.incremental_bytes for op in self.operators.values() for s in op.subtasks)

    def files(self) -> list[RemoteFile]:
        return [f for op in self.operators.values() for s in op.subtasks for f in s.files]

    def shared_keys(self) -> set[str]:
        return {f.key for f in self.files() if f.shared}

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, indent=1).encode()

    @staticmethod
    def from_json(data: bytes, where: str = "") -> CheckpointMetadata:
        try:
            raw = json.loads(data)
            if raw.get("format_version") != FORMAT_VERSION:
                raise ValueError(f"format version {raw.get('format_version')} is not supported")
            operators = {
                uid: OperatorSnapshot(
                    op["uid"],
                    op["parallelism"],
                    tuple(
                        SubtaskSnapshot(
                            s["index"],
                            s["parallelism"],
                            (int(s["key_groups"][0]), int(s["key_groups"][1])),
                            s["epoch"],
                            tuple(RemoteFile(**f) for f in s["files"]),
                            # "uploaded_bytes": written by Stator before 0.2
                            s.get("incremental_bytes", s.get("uploaded_bytes", 0)),
                        )
                        for s in op["subtasks"]
                    ),
                    op.get("states", {}),
                )
                for uid, op in raw["operators"].items()
            }
            sinks = {
                uid: tuple(PendingCommit(p["epoch"], tuple(p["parts"])) for p in pending)
                for uid, pending in raw["sinks"].items()
            }
            return CheckpointMetadata(
                raw["checkpoint_id"],
                raw["epoch"],
                raw["job"],
                raw["created_ms"],
                raw["max_parallelism"],
                raw["incremental"],
                operators,
                raw["sources"],
                sinks,
                raw["watermark"],
                raw.get("duration_ms", 0),
                raw["format_version"],
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointNotFoundError(f"checkpoint metadata {where} is corrupt: {exc}") from exc
