"""What the driver sends with each epoch's Spark job: everything a task needs to read its
input, find or restore its state, and take its part in a checkpoint."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..api.graph import PipelineGraph
from ..checkpoint.metadata import RemoteFile, SubtaskSnapshot
from ..keygroups import SubtaskId
from ..savepoint.metadata import SavepointMetadata
from ..sources.base import SplitRange
from ..state.options import RocksDBOptions
from ..storage import ObjectStore

# Set on executors that keep their state on a volume of their own (the operator sets it to the
# executor pod's state volume): it beats the driver's ``state.local_dir``.
STATE_DIR_ENV = "STATOR_STATE_DIR"
# The Kubernetes node an executor runs on (from the pod's spec.nodeName), for placement status.
NODE_NAME_ENV = "STATOR_NODE_NAME"


def state_root(local_dir: str) -> Path:
    """The state directory of the process this runs in: its own ``STATOR_STATE_DIR`` if set,
    else the job's ``state.local_dir``."""
    return Path(os.environ.get(STATE_DIR_ENV) or local_dir)


def node_name() -> str:
    """The node this executor runs on ("" outside Kubernetes)."""
    return os.environ.get(NODE_NAME_ENV, "")


@dataclass(frozen=True)
class CheckpointTask:
    """Take part in checkpoint ``checkpoint_id``: snapshot after the commit, upload what the
    checkpoint it builds on (``previous``, per subtask) does not already hold."""

    checkpoint_id: int
    store: ObjectStore
    incremental: bool
    # (uid, subtask) -> files of the checkpoint it builds on: the newest in flight, else the
    # latest completed (base for incremental)
    previous: dict[SubtaskId, dict[str, RemoteFile]]
    # Keep the snapshot as the executor's local copy (local_recovery.enabled).
    keep_local: bool = True
    # Hand the upload to the worker's uploader and return (``checkpoint/uploads.py``), which
    # gives up past ``deadline_ms`` (epoch milliseconds).
    async_upload: bool = False
    deadline_ms: int = 0
    # The in-flight checkpoint ``previous`` comes from (0: a completed one, or none): this
    # one fails if that one does (driver side only).
    base_in_flight: int = 0
    # Files of at most this many bytes go into the metadata (checkpoint.inline_max_bytes).
    inline_max_bytes: int = 0


@dataclass(frozen=True)
class RestoreTask:
    """Where a task's state comes from when its local state is not at ``base_epoch``.

    - ``snapshots``: a checkpoint taken at the same parallelism: download the subtask's files;
    - ``rescale``: a checkpoint taken at another parallelism: copy this subtask's key-groups
      out of every old subtask's snapshot that overlaps them;
    - ``savepoint``: the key-group files of a canonical savepoint; a native savepoint fills
      ``snapshots`` or ``rescale`` as a checkpoint does, from its own directory.
    An operator in none of them is new and starts empty.
    """

    store: ObjectStore
    checkpoint_id: int  # 0 for a savepoint
    # The epoch the source's state is at: a task may restore from it only when the job
    # expects that epoch (``EpochSpec.base_epoch``); otherwise the job must rewind to it.
    epoch: int
    snapshots: dict[SubtaskId, SubtaskSnapshot] = field(default_factory=dict)
    rescale: dict[str, tuple[SubtaskSnapshot, ...]] = field(default_factory=dict)
    savepoint: SavepointMetadata | None = None
    # This job's own checkpoint: an executor's local copy of it may serve the restore.
    local_copies: bool = False

    def covers(self, uid: str) -> bool:
        if self.savepoint is not None:
            return uid in self.savepoint.operators
        return uid in self.rescale or any(u == uid for u, _ in self.snapshots)


@dataclass(frozen=True)
class SavepointTask:
    """Write this epoch's committed state into a savepoint: key-group files (``canonical``)
    or each subtask's database files (``native``)."""

    store: ObjectStore
    prefix: str
    compression: str
    format_type: str = "canonical"


@dataclass(frozen=True)
class StandbyOrder:
    """Keep a standby copy of one keyed subtask's part of checkpoint ``checkpoint_id`` (its
    snapshot's ``files``) on the executor this order is for (``locality/standby_copy.py``)."""

    uid: str
    subtask: int
    parallelism: int
    checkpoint_id: int
    files: tuple[RemoteFile, ...]


@dataclass(frozen=True)
class StandbyTask:
    """``local_recovery.standby``: per executor location (``executor_<host>_<id>``), the
    standby copies it keeps; a keyed task there hands them to the executor's uploader."""

    store: ObjectStore
    orders: dict[str, tuple[StandbyOrder, ...]]


@dataclass(frozen=True)
class EpochSpec:
    """One epoch, as every task of its Spark job sees it."""

    job: str
    epoch: int
    base_epoch: int  # the epoch every stateful task's state must be at before this one
    processing_time_ms: int
    pipeline: PipelineGraph
    parallelism: dict[str, int]  # keyed operator uid -> subtasks
    max_parallelism: int
    local_dir: str
    rocksdb: RocksDBOptions
    warm_entries: int
    ranges: dict[str, list[SplitRange]]  # source uid -> ranges, in split order
    split_max_ts: dict[str, dict[str, int]]  # source uid -> split -> max timestamp so far
    checkpoint: CheckpointTask | None = None
    restore: RestoreTask | None = None
    savepoint: SavepointTask | None = None
    # First epoch after a restore: check that the code declares every restored state.
    verify_states: bool = False
    allow_non_restored_state: bool = False
    # The latest checkpoint the driver completed (0: none). Tasks keep its local copy and
    # delete older ones (``locality/local_copy.py``); a copy of any other id is never restored.
    completed_checkpoint: int = 0
    # Checkpoints whose uploads may still be running: their local copies are kept.
    in_flight: frozenset[int] = frozenset()
    # > 0 (a job without keyed operators, failover.strategy=region): Spark's attempts of a
    # task; a source task's last attempt reports its failure instead of failing the epoch,
    # so only its split fails over (``driver/split_failover.py``).
    split_failover_attempts: int = 0
    # (uid, subtask) -> the database commit its state at ``base_epoch`` must be (the last
    # epoch's reports, or the restore source's metadata): local state at that epoch but of
    # another commit is of another lineage and is restored over. Absent: nothing local is
    # trusted but at epoch 0.
    commits: dict[SubtaskId, str] = field(default_factory=dict)
    # (uid, subtask) -> the executor location (``executor_<host>_<id>``) the driver sent the
    # subtask to because its state is there (``locality/placement.py``): a Spark retry of
    # its task elsewhere fails rather than restore from the object store, so that the
    # driver can wait for that executor's replacement (``locality/restore.py``, step 3).
    pinned: dict[SubtaskId, str] = field(default_factory=dict)
    # Standby copies of the latest completed checkpoint to keep (``locality/standby.py``).
    standby: StandbyTask | None = None
    # The driver's random key for the warm cache files its tasks write (``state/warm.py``):
    # a file without its MAC is never unpickled. Empty: no files.
    warm_key: bytes = b""
    # When the driver planned the epoch (epoch ms; 0: unknown, a task takes its own clock):
    # records of sources that cannot tell when they became available count from then.
    planned_ms: int = 0

    def state_dir(self, uid: str, subtask: int) -> Path:
        return subtask_dir(self.local_dir, self.job, uid, subtask, self.parallelism[uid])


def subtask_dir(local_dir: str, job: str, uid: str, subtask: int, parallelism: int) -> Path:
    """A keyed subtask's state directory on the executor this runs on."""
    return state_root(local_dir) / job / uid / f"{subtask}-of-{parallelism}"
