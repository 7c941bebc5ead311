"""Checkpoint metadata: the one object that makes a checkpoint exist. Written last, read
first; everything else under a checkpoint is reachable from it."""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import CheckpointNotFoundError, UnknownVersionError
from ..jsonfields import Fields
from ..state.operator_state import from_text
from .checksums import check_format

# The one version this Stator writes and reads; every field of it is required. Metadata of
# any other version is refused by name (``UnknownVersion``), never read by guesswork.
FORMAT_VERSION = 3
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
    key: str  # relative to the job's checkpoint root; "" for an inline file
    size: int
    shared: bool  # in shared/ and reference-counted, or private to one checkpoint
    # A small file's bytes, base64, in the metadata itself (``checkpoint.inline_max_bytes``):
    # no object of its own (``key`` is "").
    inline: str = ""
    # Of a stored file's bytes (``checksums.py``), checked on download and on a local copy;
    # "" for an inline file (its bytes are in the metadata).
    checksum: str = ""

    @property
    def stored(self) -> bool:
        """An object in the store (not inline in the metadata)."""
        return bool(self.key)


@dataclass(frozen=True)
class SubtaskSnapshot:
    index: int
    parallelism: int
    key_groups: tuple[int, int]
    epoch: int
    files: tuple[RemoteFile, ...]
    incremental_bytes: int = 0  # bytes this checkpoint uploaded for this subtask
    # The database commit these files hold (``KeyedBackend.commit_token``): local state may
    # stand in for them only if it is that commit.
    commit: str = ""
    # The subtask's non-keyed state (``state/operator_state.py``), base64; "" for none. Also
    # in the database: this copy lets a rescale read every old subtask's without their files.
    operator_state: str = ""

    @property
    def state_bytes(self) -> int:
        return sum(f.size for f in self.files)


@dataclass(frozen=True)
class OperatorSnapshot:
    uid: str
    parallelism: int
    subtasks: tuple[SubtaskSnapshot, ...]
    states: dict[str, Any] = field(default_factory=dict)

    @property
    def commits(self) -> dict[int, str]:
        """subtask -> the database commit its snapshot holds (as ``OperatorSavepoint``'s)."""
        return {s.index: s.commit for s in self.subtasks}


def check_version(raw: Fields, current: int, what: str, where: str) -> int:
    """The document's ``format_version``, which must be ``current`` (checkpoint or savepoint
    metadata: each format has one version)."""
    version = raw.integer("format_version")
    if version != current:
        raise UnknownVersionError(what, where, version, current)
    return version


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
    # The run of the job that wrote it, as its starter named it (``restore.lineage``: the
    # operator's flow id) or as inherited from the checkpoint the run restored; "" when no
    # one named one. A restart finds its own run's checkpoints by it.
    lineage: str = ""

    @property
    def state_bytes(self) -> int:
        return sum(s.state_bytes for op in self.operators.values() for s in op.subtasks)

    @property
    def incremental_bytes(self) -> int:
        return sum(s.incremental_bytes for op in self.operators.values() for s in op.subtasks)

    def files(self) -> list[RemoteFile]:
        """Every file that is an object in the store (inline ones are not)."""
        return [
            f for op in self.operators.values() for s in op.subtasks for f in s.files if f.stored
        ]

    def shared_keys(self) -> set[str]:
        return {f.key for f in self.files() if f.shared}

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, indent=1).encode()

    @staticmethod
    def from_json(data: bytes, where: str = "") -> CheckpointMetadata:
        try:
            raw = Fields(json.loads(data))
            version = check_version(raw, FORMAT_VERSION, "checkpoint metadata", where)
            return CheckpointMetadata(
                raw.integer("checkpoint_id"),
                raw.integer("epoch"),
                raw.text("job"),
                raw.timestamp_ms("created_ms"),
                raw.integer("max_parallelism", low=1),
                raw.flag("incremental"),
                {uid: _operator(op) for uid, op in raw.objects("operators").items()},
                raw.nested_objects("sources"),
                _sinks(raw.fields("sinks")),
                raw.integer("watermark"),
                raw.integer("duration_ms", low=0),
                version,
                raw.text("lineage"),
            )
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise CheckpointNotFoundError(f"checkpoint metadata {where} is corrupt: {exc}") from exc


def _operator(op: Fields) -> OperatorSnapshot:
    """One operator's entry, its fields checked (restore and the summaries use them all)."""
    return OperatorSnapshot(
        op.text("uid"),
        op.integer("parallelism", low=1),
        tuple(subtask_snapshot(s) for s in op.items("subtasks")),
        op.fields("states").raw,
    )


def subtask_snapshot(s: Fields) -> SubtaskSnapshot:
    """One subtask's snapshot: its key-group range and every file a restore downloads."""
    key_groups = s.array("key_groups")
    if len(key_groups) != 2 or not all(
        isinstance(k, int) and not isinstance(k, bool) for k in key_groups
    ):
        raise ValueError(f"{s.path}.key_groups must be [first, last], got {key_groups}")
    return SubtaskSnapshot(
        s.integer("index", low=0),
        s.integer("parallelism", low=1),
        (key_groups[0], key_groups[1]),
        s.integer("epoch"),
        tuple(_file(f) for f in s.items("files")),
        s.integer("incremental_bytes", low=0),
        s.text("commit"),
        _operator_state(s),
    )


def _operator_state(s: Fields) -> str:
    text = s.text("operator_state")
    from_text(text, f"{s.path}.operator_state")  # checked readable: a restore relies on it
    return text


def _sinks(sinks: Fields) -> dict[str, tuple[PendingCommit, ...]]:
    """Each sink's output staged for epochs this checkpoint covers, to commit on restore."""
    return {
        uid: tuple(
            PendingCommit(p.integer("epoch"), tuple(p.array("parts"))) for p in sinks.items(uid)
        )
        for uid in sinks.raw
    }


# A RocksDB file's name (000012.sst, MANIFEST-000005, CURRENT, OPTIONS-000007): a restore
# writes it into the database's directory, so it must be one plain path segment.
_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")


def _file(f: Fields) -> RemoteFile:
    name = f.text("name")
    if not _FILE_NAME.fullmatch(name):
        raise ValueError(f"{f.path}.name {name!r} is not a database file's name")
    key, size = f.text("key"), f.integer("size", low=0)
    inline, checksum = f.text("inline"), f.text("checksum")
    if not key:
        try:
            data = base64.b64decode(inline, validate=True)
        except binascii.Error as exc:
            raise ValueError(f"{f.path}.inline is not base64: {exc}") from exc
        if len(data) != size:
            raise ValueError(f"{f.path}.inline holds {len(data)} bytes, its size is {size}")
    elif inline:
        raise ValueError(f"{f.path} has both a key and inline bytes")
    shared = f.flag("shared")
    if shared and not key:
        raise ValueError(f"{f.path}: an inline file cannot be shared")
    if key:
        check_format(checksum, f"{f.path}.checksum")
    elif checksum:
        raise ValueError(f"{f.path} is inline and has a checksum")
    return RemoteFile(name, key, size, shared, inline, checksum)
