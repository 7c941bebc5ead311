"""Savepoints and checkpoints as they lie in storage: where savepoints go by default, how to list,
find and dispose them, and one read by its URI as a restore target (``Target``). The driver, the
``stator`` command line and the operator (which reads storage when the driver is gone) all go
through here, so the layout is defined once.

Layout::

    {savepoint dir}/{job}/savepoint-{epoch:010d}-{request id}/_savepoint.json   a savepoint
    {checkpoint storage}/{job}/chk-{id:010d}/_metadata                          a checkpoint

A savepoint or checkpoint exists only once its metadata object does (it is written last), so
disposal deletes the metadata first: a half-deleted savepoint is never mistaken for a whole one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .checkpoint.coordinator import load_checkpoint
from .checkpoint.metadata import METADATA_NAME as CHECKPOINT_METADATA
from .checkpoint.metadata import (
    CheckpointMetadata,
    OperatorSnapshot,
    checkpoint_dir,
    parse_checkpoint_dir,
)
from .checkpoint.metadata import metadata_key as checkpoint_metadata_key
from .errors import CheckpointNotFoundError, StatorError, StorageError
from .keygroups import SubtaskId
from .savepoint.metadata import METADATA_NAME, OperatorSavepoint, SavepointMetadata
from .storage import ObjectStore, S3Options, open_store


def snapshot_dir(uri: str) -> str:
    """The savepoint or checkpoint directory ``uri`` names: users copy the path of its metadata
    file (``_savepoint.json``, ``_metadata``) as often as the directory's, and mean the same."""
    path = uri.rstrip("/")
    parent, _, name = path.rpartition("/")
    return parent if parent and name in (METADATA_NAME, CHECKPOINT_METADATA) else path


def default_savepoint_root(checkpoint_storage: str) -> str:
    """Where a pipeline's savepoints go when no directory is named: beside its checkpoints."""
    return f"{checkpoint_storage.rstrip('/')}/savepoints"


def savepoint_location(directory: str, job: str, epoch: int, request_id: str) -> str:
    """Where the savepoint of ``request_id`` goes when its trigger names no target."""
    return f"{directory.rstrip('/')}/{job}/savepoint-{epoch:010d}-{request_id}"


@dataclass(frozen=True)
class SavepointEntry:
    """A savepoint found under a root; ``metadata`` is None (and ``error`` says why) if its
    metadata cannot be read."""

    location: str
    metadata: SavepointMetadata | None
    error: str | None = None


@dataclass(frozen=True)
class CheckpointEntry:
    """A checkpoint directory of a job; ``metadata`` is None for an incomplete or corrupt one
    (``problem`` says which)."""

    id: int
    metadata: CheckpointMetadata | None
    problem: str | None = None


def load_savepoint(uri: str, s3: S3Options | None = None) -> SavepointMetadata:
    """The metadata of the savepoint at ``uri``; refuses anything that is not a savepoint."""
    store = open_store(uri.rstrip("/"), s3)
    if not store.exists(METADATA_NAME):
        raise StatorError(f"{uri} is not a savepoint: it has no {METADATA_NAME}")
    return SavepointMetadata.from_json(store.get(METADATA_NAME), store.url(METADATA_NAME))


def list_savepoints(root: str, s3: S3Options | None = None) -> list[SavepointEntry]:
    """Every savepoint under ``root`` (at any depth), by job and epoch."""
    store = open_store(root.rstrip("/"), s3)
    entries = []
    for prefix in _savepoint_dirs(store):
        location = store.url(prefix)
        try:
            meta = SavepointMetadata.from_json(
                store.get(_join(prefix, METADATA_NAME)), store.url(_join(prefix, METADATA_NAME))
            )
            entries.append(SavepointEntry(location, meta))
        except StatorError as exc:
            entries.append(SavepointEntry(location, None, str(exc)))
    entries.sort(key=lambda e: (e.metadata.job, e.metadata.epoch) if e.metadata else ("", 0))
    return entries


def find_savepoint(root: str, request_id: str, s3: S3Options | None = None) -> str | None:
    """The completed savepoint that request ``request_id`` wrote under ``root`` at its default
    location, or None: what the operator asks when the driver stopped before it could say."""
    store = open_store(root.rstrip("/"), s3)
    for prefix in _savepoint_dirs(store):
        if prefix.rpartition("/")[2].endswith(f"-{request_id}"):
            return store.url(prefix)
    return None


def dispose_savepoint(uri: str, s3: S3Options | None = None) -> int:
    """Delete every file of the savepoint at ``uri``, metadata first; returns how many.
    Refuses a directory without savepoint metadata (it may be anything)."""
    store = open_store(uri.rstrip("/"), s3)
    keys = [k for k, _ in store.listing()]
    if METADATA_NAME not in keys:
        raise StatorError(f"{uri} is not a savepoint: it has no {METADATA_NAME}")
    others = sorted({k.split("/", 1)[0] for k in keys if _marks_another(k)})
    if others:  # a savepoint never holds these: this is a root that also holds a savepoint
        raise StatorError(
            f"{uri} also holds other savepoints or checkpoints ({', '.join(others[:3])}): "
            f"nothing was deleted; dispose of a savepoint by its own directory"
        )
    store.delete([METADATA_NAME])
    store.delete([k for k in keys if k != METADATA_NAME])
    return len(keys)


def _marks_another(key: str) -> bool:
    """Whether a file under a savepoint's directory is another savepoint's or checkpoint's
    metadata (an operator's directory holds only key-group files, whatever its uid)."""
    if key.endswith(f"/{METADATA_NAME}"):
        return True
    cid = parse_checkpoint_dir(key.split("/", 1)[0])
    return cid is not None and key == checkpoint_metadata_key(cid)


def list_checkpoints(root: str, s3: S3Options | None = None) -> list[CheckpointEntry]:
    """The checkpoint directories under a job's checkpoint root, oldest first, complete or not."""
    store = open_store(root, s3)
    listing = dict(store.listing())
    ids = sorted({i for i in (parse_checkpoint_dir(k.split("/", 1)[0]) for k in listing) if i})
    entries = []
    for cid in ids:
        if checkpoint_metadata_key(cid) not in listing:
            entries.append(CheckpointEntry(cid, None, "incomplete (no _metadata)"))
            continue
        try:
            entries.append(CheckpointEntry(cid, load_checkpoint(store, checkpoint_dir(cid))))
        except StatorError as exc:
            entries.append(CheckpointEntry(cid, None, f"corrupt: {exc}"))
    return entries


Snapshot = CheckpointMetadata | SavepointMetadata


@dataclass(frozen=True)
class Target:
    """A checkpoint or savepoint to restore from, and the store its files are in."""

    meta: Snapshot
    store: ObjectStore

    @property
    def epoch(self) -> int:
        return self.meta.epoch

    @property
    def is_savepoint(self) -> bool:
        return isinstance(self.meta, SavepointMetadata)

    def part_for(self, region: str, uids: set[str]) -> Target:
        """What one failover region restores from this snapshot: the entries of its own
        operators, sources and sinks. A savepoint of a job of several regions recorded each
        region's epoch: the region resumes after the highest epoch of the regions it shares
        uids with (never at an epoch number one of them already used: its sinks would write
        it again). The whole snapshot was checked against the whole job first
        (``check_compatible``)."""
        meta = self.meta
        sources = {u: s for u, s in meta.sources.items() if u in uids}
        part: Snapshot
        if isinstance(meta, SavepointMetadata):
            overlapping = [
                meta.region_epochs[r]
                for r, members in meta.region_uids.items()
                if r in meta.region_epochs and uids.intersection(members)
            ]
            epoch = max(overlapping, default=meta.region_epochs.get(region, meta.epoch))
            ops = {u: op for u, op in meta.operators.items() if u in uids}
            part = replace(meta, operators=ops, sources=sources, epoch=epoch)
        else:
            snaps = {u: op for u, op in meta.operators.items() if u in uids}
            sinks = {u: c for u, c in meta.sinks.items() if u in uids}
            part = replace(meta, operators=snaps, sources=sources, sinks=sinks)
        return Target(part, self.store)

    def commits(self, parallelism: dict[str, int]) -> dict[SubtaskId, str]:
        """The database commit each keyed subtask's restored state is, for the operators
        whose parallelism is the one the snapshot was taken at (``EpochSpec.commits``)."""
        operators: dict[str, OperatorSnapshot] | dict[str, OperatorSavepoint]
        operators = self.meta.operators
        return {
            SubtaskId(uid, subtask): commit
            for uid, op in operators.items()
            if op.parallelism == parallelism.get(uid)
            for subtask, commit in op.commits.items()
            if commit
        }

    def describe(self) -> str:
        if isinstance(self.meta, SavepointMetadata):
            return f"savepoint {self.store.uri} (epoch {self.meta.epoch})"
        return f"checkpoint {self.meta.checkpoint_id} (epoch {self.meta.epoch}) at {self.store.uri}"


def load_target(uri: str, s3: S3Options) -> Target:
    """A savepoint directory, or a checkpoint directory (chk-N), by URI (or their metadata's)."""
    uri = snapshot_dir(uri)
    sp_store = open_store(uri, s3)
    if sp_store.exists(METADATA_NAME):
        meta = SavepointMetadata.from_json(sp_store.get(METADATA_NAME), sp_store.url(METADATA_NAME))
        return Target(meta, sp_store)
    parent, _, name = uri.rstrip("/").rpartition("/")
    try:
        store = open_store(parent, s3)
        return Target(load_checkpoint(store, name), store)
    except (CheckpointNotFoundError, StorageError) as exc:
        raise CheckpointNotFoundError(
            f"restore.source {uri!r} is neither a savepoint (no {METADATA_NAME}) nor a "
            f"checkpoint directory: {exc}"
        ) from exc


def check_restorable(uri: str, s3: S3Options | None = None) -> None:
    """Raise a StatorError saying why ``uri`` (a savepoint or a chk-N directory) cannot be
    restored from; reads, never writes."""
    load_target(uri, s3 or S3Options())


def _savepoint_dirs(store: ObjectStore) -> list[str]:
    """Keys (relative to ``store``) of the directories that hold savepoint metadata."""
    return [
        key[: -len(METADATA_NAME)].rstrip("/")
        for key, _ in store.listing()
        if key == METADATA_NAME or key.endswith("/" + METADATA_NAME)
    ]


def _join(prefix: str, name: str) -> str:
    return f"{prefix}/{name}" if prefix else name


def has_run(store_uri: str, lineage: str, s3: S3Options) -> bool:
    """Whether the job's checkpoints at ``store_uri`` include one of run ``lineage``
    (``restore.lineage``): then a restart resumes it, and does not need its starting point."""
    try:
        return any(
            e.metadata is not None and e.metadata.lineage == lineage
            for e in list_checkpoints(store_uri, s3)
        )
    except StatorError:
        return False
