"""What a job restores from (a ``lineage.Target``: the latest checkpoint, an explicit checkpoint,
or a savepoint): whether the pipeline can take it (maxParallelism, operators that no longer
exist); and how each operator's tasks get their state (same parallelism, rescaled, or from
key-group files)."""

from __future__ import annotations

from ..checkpoint.metadata import SubtaskSnapshot
from ..epoch.spec import RestoreTask
from ..errors import ConfigError
from ..keygroups import SubtaskId
from ..lineage import Target
from ..savepoint.metadata import SavepointMetadata
from ..storage import ObjectStore


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
    snapshots: dict[SubtaskId, SubtaskSnapshot] = {}
    rescale = {}
    for uid, op in meta.operators.items():
        if uid not in parallelism:
            continue  # dropped (allow_non_restored_state)
        if op.parallelism == parallelism[uid]:
            snapshots.update({SubtaskId(uid, s.index): s for s in op.subtasks})
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
