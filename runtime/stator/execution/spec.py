"""What the driver sends with each epoch's Spark job: everything a task needs to read its
input, find or restore its state, and take its part in a checkpoint."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..api.pipeline import Pipeline
from ..checkpoint.metadata import RemoteFile, SubtaskSnapshot
from ..sources.base import SplitRange
from ..state.options import RocksDBOptions
from ..storage import ObjectStore


@dataclass(frozen=True)
class CheckpointTask:
    checkpoint_id: int
    store: ObjectStore
    incremental: bool
    # (uid, subtask) -> files of the previous completed checkpoint (base for incremental)
    previous: dict[tuple[str, int], dict[str, RemoteFile]]


@dataclass(frozen=True)
class RestoreTask:
    """The snapshots a task restores from when its local state is not at ``base_epoch``."""

    store: ObjectStore
    snapshots: dict[tuple[str, int], SubtaskSnapshot]
    checkpoint_id: int


@dataclass(frozen=True)
class EpochSpec:
    job: str
    epoch: int
    base_epoch: int  # the epoch every stateful task's state must be at before this one
    processing_time_ms: int
    pipeline: Pipeline
    parallelism: dict[str, int]  # keyed operator uid -> subtasks
    local_dir: str
    rocksdb: RocksDBOptions
    warm_entries: int
    ranges: dict[str, list[SplitRange]]  # source uid -> ranges, in split order
    split_max_ts: dict[str, dict[str, int]]  # source uid -> split -> max timestamp so far
    checkpoint: CheckpointTask | None = None
    restore: RestoreTask | None = None
    downstream: dict[int, list[int]] = field(default_factory=dict)

    @property
    def max_parallelism(self) -> int:
        return self.pipeline.max_parallelism

    def state_dir(self, uid: str, subtask: int) -> Path:
        p = self.parallelism[uid]
        return Path(self.local_dir) / self.job / uid / f"{subtask}-of-{p}"
