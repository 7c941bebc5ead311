"""Savepoint metadata: ``_savepoint.json``, written last (a savepoint without it does not
exist). Self-contained: it references only files inside the savepoint's own directory.

Two format types, as in Flink: ``canonical`` (each key-group's entries in Stator's own
format: readable by any backend and by ``state_reader``, restored at any parallelism by
reading only the owned key-groups) and ``native`` (each subtask's RocksDB files as they are,
like a checkpoint but self-contained: written and restored at the object store's bandwidth,
but a restore at another parallelism reads every overlapping subtask's whole database)."""

from __future__ import annotations

import itertools
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from ..checkpoint.metadata import SubtaskSnapshot, check_version, subtask_snapshot
from ..errors import CheckpointNotFoundError
from ..jsonfields import Fields
from ..state.operator_state import from_text

FORMAT = "stator-savepoint"
# The one version this Stator writes and reads (both format types); every field of it is
# required, and a savepoint of any other version is refused by name.
FORMAT_VERSION = 3
METADATA_NAME = "_savepoint.json"
CANONICAL, NATIVE = "canonical", "native"
FORMAT_TYPES = (CANONICAL, NATIVE)
NATIVE_COMPRESSION = "rocksdb"  # a native savepoint's files: as the database's options say


@dataclass(frozen=True)
class OperatorSavepoint:
    uid: str
    parallelism: int  # when taken (restore may use another)
    # name -> {"kind", "serializer", "version"[, "key_serializer"][, "ttl"]}
    states: dict[str, dict[str, Any]]
    # canonical: key-group -> {"file", "bytes", "entries"}; empty key-groups have no file
    key_groups: dict[int, dict[str, Any]]
    watermark: int
    # native: each subtask's database files (keys relative to the savepoint's directory)
    subtasks: tuple[SubtaskSnapshot, ...] = ()
    # subtask -> the database commit its part was taken from (``KeyedBackend.commit_token``):
    # a restore at ``parallelism`` keeps local state of that commit.
    commits: dict[int, str] = field(default_factory=dict)
    # canonical: subtask -> its non-keyed state (``state/operator_state.py``), base64, for the
    # subtasks that hold any (native: in ``subtasks``, as in a checkpoint).
    operator_states: dict[int, str] = field(default_factory=dict)

    @property
    def state_bytes(self) -> int:
        files = sum(s.state_bytes for s in self.subtasks)
        return files + sum(int(k["bytes"]) for k in self.key_groups.values())


@dataclass(frozen=True)
class SavepointMetadata:
    job: str
    epoch: int
    created_ms: int
    max_parallelism: int
    operators: dict[str, OperatorSavepoint]
    sources: dict[str, dict[str, dict[str, Any]]]
    watermark: int
    compression: str
    duration_ms: int = 0
    format: str = FORMAT
    format_version: int = FORMAT_VERSION
    # A job of several failover regions: each region's epoch when it took its part
    # (``epoch`` is the highest); a region resumes from its own (``driver/regions.py``).
    region_epochs: dict[str, int] = field(default_factory=dict)
    # ... and the operator and source uids of each region's part.
    region_uids: dict[str, list[str]] = field(default_factory=dict)
    format_type: str = CANONICAL

    @property
    def native(self) -> bool:
        return self.format_type == NATIVE

    @property
    def state_bytes(self) -> int:
        return sum(op.state_bytes for op in self.operators.values())

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, indent=1).encode()

    @staticmethod
    def from_json(data: bytes, where: str = "") -> SavepointMetadata:
        try:
            raw = Fields(json.loads(data))
            if raw.raw.get("format") != FORMAT:
                raise ValueError("not a Stator savepoint")
            version = check_version(raw, FORMAT_VERSION, "savepoint metadata", where)
            epochs, uids = raw.fields("region_epochs"), raw.fields("region_uids")
            format_type = raw.text("format_type")
            if format_type not in FORMAT_TYPES:
                raise ValueError(f"format_type {format_type!r} is not one of {FORMAT_TYPES}")
            max_parallelism = raw.integer("max_parallelism", low=1)
            operators = {
                uid: _operator(op, format_type == NATIVE, max_parallelism)
                for uid, op in raw.objects("operators").items()
            }
            return SavepointMetadata(
                raw.text("job"),
                raw.integer("epoch"),
                raw.timestamp_ms("created_ms"),
                max_parallelism,
                operators,
                raw.nested_objects("sources"),
                raw.integer("watermark"),
                raw.text("compression"),
                raw.integer("duration_ms", low=0),
                FORMAT,
                version,
                {region: epochs.integer(region) for region in epochs.raw},
                {region: uids.texts(region) for region in uids.raw},
                format_type,
            )
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise CheckpointNotFoundError(f"savepoint metadata {where} is unusable: {exc}") from exc


def _operator(op: Fields, native: bool, max_parallelism: int) -> OperatorSavepoint:
    """One operator's entry, its fields checked (restore and the summaries use them all)."""
    parallelism = op.integer("parallelism", low=1)
    subtasks = tuple(subtask_snapshot(s) for s in op.items("subtasks")) if native else ()
    if native:
        _check_databases(op.path, subtasks, parallelism, max_parallelism)
    return OperatorSavepoint(
        op.text("uid"),
        parallelism,
        {name: _state(state) for name, state in op.objects("states").items()},
        {_key_group(n, kg): _key_group_file(kg) for n, kg in op.objects("key_groups").items()},
        op.integer("watermark"),
        subtasks,
        _commits(op.fields("commits"), parallelism),
        _operator_states(op.fields("operator_states"), parallelism, native),
    )


def _operator_states(states: Fields, parallelism: int, native: bool) -> dict[int, str]:
    if native and states.raw:
        raise ValueError(f"{states.path}: a native savepoint keeps them in its subtasks")
    found = {}
    for number in states.raw:
        if not (number.isascii() and number.isdigit() and int(number) < parallelism):
            raise ValueError(f"{states.path}: {number!r} is not a subtask below {parallelism}")
        found[int(number)] = states.text(number)
        from_text(found[int(number)], f"{states.path}.{number}")
    return found


def _commits(commits: Fields, parallelism: int) -> dict[int, str]:
    found = {}
    for number in commits.raw:
        if not (number.isascii() and number.isdigit() and int(number) < parallelism):
            raise ValueError(f"{commits.path}: {number!r} is not a subtask below {parallelism}")
        found[int(number)] = commits.text(number)
    return found


def _check_databases(
    path: str, subtasks: tuple[SubtaskSnapshot, ...], parallelism: int, max_parallelism: int
) -> None:
    """A native savepoint's databases: one per subtask, their key-group ranges covering every
    key-group once (a gap would restore as empty state)."""
    ordered = sorted(subtasks, key=lambda s: s.index)
    if [s.index for s in ordered] != list(range(parallelism)):
        raise ValueError(f"{path}.subtasks must hold subtasks 0..{parallelism - 1}")
    if any(s.parallelism != parallelism for s in ordered):
        raise ValueError(f"{path}.subtasks must all have parallelism {parallelism}")
    edges = [s.key_groups for s in ordered]
    if (
        edges[0][0] != 0
        or edges[-1][1] != max_parallelism
        or any(a[1] != b[0] for a, b in itertools.pairwise(edges))
    ):
        raise ValueError(
            f"{path}.subtasks' key-groups {edges} do not cover [0, {max_parallelism}) once"
        )


def _state(state: Fields) -> dict[str, Any]:
    """A state's descriptor, as restore checks it against the code's."""
    state.text("kind")
    state.text("serializer")
    state.integer("version")
    if "key_serializer" in state.raw:
        state.text("key_serializer")
    if "ttl" in state.raw:  # a TTL-enabled state (``state/ttl.py``): its values carry stamps
        ttl = state.fields("ttl")
        ttl.integer("ttl_ms", low=1)
        ttl.text("update_type")
        ttl.text("visibility")
    return state.raw


def _key_group(number: str, kg: Fields) -> int:
    if not (number.isascii() and number.isdigit()):
        raise ValueError(f"{kg.path}: {number!r} is not a key-group number")
    return int(number)


def _key_group_file(kg: Fields) -> dict[str, Any]:
    """Where a key-group's data is, and the size a restore checks it has."""
    kg.text("file")
    kg.integer("bytes", low=0)
    kg.integer("entries", low=0)  # informational: nothing reads it
    return kg.raw
