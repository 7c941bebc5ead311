"""What a job restores from: the latest checkpoint, an explicit checkpoint, or a savepoint;
whether the pipeline can take it (maxParallelism, operators that no longer exist); and how
each operator's tasks get their state (same parallelism, rescaled, or from key-group files)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..checkpoint.coordinator import load_checkpoint
from ..checkpoint.metadata import CheckpointMetadata, OperatorSnapshot
from ..epoch.spec import RestoreTask
from ..errors import CheckpointNotFoundError, ConfigError, StorageError
from ..lineage import snapshot_dir
from ..savepoint.metadata import METADATA_NAME as SAVEPOINT_METADATA
from ..savepoint.metadata import OperatorSavepoint, SavepointMetadata
from ..storage import ObjectStore, S3Options, open_store

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

    def commits(self, parallelism: dict[str, int]) -> dict[tuple[str, int], str]:
        """The database commit each keyed subtask's restored state is, for the operators
        whose parallelism is the one the snapshot was taken at (``EpochSpec.commits``)."""
        operators: dict[str, OperatorSnapshot] | dict[str, OperatorSavepoint]
        operators = self.meta.operators
        return {
            (uid, subtask): commit
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
    if sp_store.exists(SAVEPOINT_METADATA):
        meta = SavepointMetadata.from_json(
            sp_store.get(SAVEPOINT_METADATA), sp_store.url(SAVEPOINT_METADATA)
        )
        return Target(meta, sp_store)
    parent, _, name = uri.rstrip("/").rpartition("/")
    try:
        store = open_store(parent, s3)
        return Target(load_checkpoint(store, name), store)
    except (CheckpointNotFoundError, StorageError) as exc:
        raise CheckpointNotFoundError(
            f"restore.source {uri!r} is neither a savepoint (no {SAVEPOINT_METADATA}) nor a "
            f"checkpoint directory: {exc}"
        ) from exc


def check_compatible(
    target: Target, max_parallelism: int, operators: set[str], allow_non_restored: bool
) -> None:
    meta = target.meta
    if meta.max_parallelism != max_parallelism:
        raise ConfigError(
            f"{target.describe()} was written with maxParallelism={meta.max_parallelism}; the "
            f"pipeline declares {max_parallelism}. maxParallelism is fixed for the life of the "
            f"state: it decides which key-group every key belongs to. Keep "
            f"max_parallelism={meta.max_parallelism} in Pipeline(...)"
        )
    gone = sorted(set(meta.operators) - operators)
    if gone and not allow_non_restored:
        raise ConfigError(
            f"{target.describe()} has state for operator(s) {gone} that this pipeline no longer "
            f"has; give them back their uid, or set restore.allow_non_restored_state=true to "
            f"drop that state"
        )


def restore_task(
    target: Target, parallelism: dict[str, int], own_store: ObjectStore | None = None
) -> RestoreTask:
    """How tasks get their state from ``target`` at the job's current parallelism. Local
    copies serve only checkpoints in ``own_store`` (the job's own lineage; None: local
    recovery is off)."""
    meta = target.meta
    if isinstance(meta, SavepointMetadata) and not meta.native:
        return RestoreTask(target.store, 0, meta.epoch, savepoint=meta)
    snapshots = {}
    rescale = {}
    for uid, op in meta.operators.items():
        if uid not in parallelism:
            continue  # dropped (allow_non_restored_state)
        if op.parallelism == parallelism[uid]:
            snapshots.update({(uid, s.index): s for s in op.subtasks})
        else:
            rescale[uid] = op.subtasks
    if isinstance(meta, SavepointMetadata):  # native: restored as a checkpoint's databases are
        return RestoreTask(
            target.store, 0, meta.epoch, snapshots=snapshots, rescale=rescale, savepoint=meta
        )
    return RestoreTask(
        target.store,
        meta.checkpoint_id,
        meta.epoch,
        snapshots=snapshots,
        rescale=rescale,
        local_copies=own_store is not None and own_store.uri == target.store.uri,
    )
