"""Which of this job's own checkpoints the next epoch builds on.

Two parts of an epoch's spec depend on it, and both only on a checkpoint of this job (its own
store) at the operators' current parallelism, never on a savepoint or another job's
checkpoint:

- an incremental checkpoint re-references the files its subtasks share with the newest
  checkpoint in flight, else with the one the job restored or last completed
  (:func:`incremental_base`; ``in_flight.py`` step 1);
- keyed subtasks that must restore may find local copies of the restored checkpoint on the
  executors, with local recovery on (:func:`local_restore`; ``locality/placement.py``).
"""

from __future__ import annotations

from ..checkpoint.metadata import CheckpointMetadata, RemoteFile
from ..keygroups import SubtaskId
from ..lineage import Target
from ..locality.placement import LocalRestore
from ..storage import ObjectStore

# (operator uid, subtask) -> file name -> the file as stored
SharedFiles = dict[SubtaskId, dict[str, RemoteFile]]


def own_checkpoint(target: Target | None, store: ObjectStore) -> CheckpointMetadata | None:
    """``target``'s metadata if it is a checkpoint of the job whose store is ``store``."""
    if target is None or target.store.uri != store.uri:
        return None
    return target.meta if isinstance(target.meta, CheckpointMetadata) else None


def incremental_base(
    newest_in_flight: CheckpointMetadata | None,
    target: Target | None,
    store: ObjectStore,
    parallelism: dict[str, int],
    incremental: bool,
) -> tuple[int, SharedFiles]:
    """The checkpoint in flight the next checkpoint builds on (0: none) and the files each
    subtask shares with its base: the newest in flight, else the job's restored or latest
    completed checkpoint (``target``). Nothing for a savepoint, another job's checkpoint or
    none: everything is uploaded."""
    if not incremental:
        return 0, {}
    if newest_in_flight is not None:
        return newest_in_flight.checkpoint_id, shared_with(newest_in_flight, parallelism)
    meta = own_checkpoint(target, store)
    return 0, shared_with(meta, parallelism) if meta is not None else {}


def shared_with(meta: CheckpointMetadata, parallelism: dict[str, int]) -> SharedFiles:
    """The files of each subtask of ``meta`` whose operator keeps its parallelism."""
    previous: SharedFiles = {}
    for uid, op in meta.operators.items():
        if op.parallelism == parallelism.get(uid):
            for snap in op.subtasks:
                previous[SubtaskId(uid, snap.index)] = {f.name: f for f in snap.files}
    return previous


def local_restore(
    target: Target | None, store: ObjectStore, parallelism: dict[str, int], enabled: bool
) -> LocalRestore | None:
    """The checkpoint keyed subtasks would restore from, if executors may hold local copies
    of it (``enabled``: local recovery is on), with the operators whose parallelism it keeps."""
    meta = own_checkpoint(target, store) if enabled else None
    if meta is None:
        return None
    same = frozenset(
        uid for uid, op in meta.operators.items() if op.parallelism == parallelism.get(uid)
    )
    return LocalRestore(meta.checkpoint_id, same)
