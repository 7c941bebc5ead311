"""One keyed subtask's epochs on an executor without Spark: the epoch specs the driver would
send and the commits it would remember, for the tests of restoring and copying local state."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from stator.api.pipeline import Pipeline
from stator.epoch.spec import EpochSpec
from stator.keygroups import range_for_subtask
from stator.state.backend import KeyedBackend
from stator.state.options import RocksDBOptions

UID, MP = "count", 16  # the keyed operator, and its max parallelism
KG = range_for_subtask(0, 1, MP)
# What the driver knows from its tasks' reports: the commit each executor's subtask made last.
LAST_COMMIT: dict[Path, str] = {}


def commit(local: Path, backend: KeyedBackend, epoch: int) -> None:
    """Commit ``epoch`` and remember the commit as the driver would from the task's report."""
    backend.commit(epoch, 0)
    LAST_COMMIT[local] = backend.commit_token


def spec(local: Path, epoch: int, **extra: object) -> EpochSpec:
    """Epoch ``epoch`` on the executor whose disk is ``local``, expecting its last commit."""
    base = EpochSpec(
        job="job",
        epoch=epoch,
        base_epoch=epoch - 1,
        processing_time_ms=0,
        pipeline=Pipeline("job"),
        parallelism={UID: 1},
        max_parallelism=MP,
        local_dir=str(local),
        rocksdb=RocksDBOptions(),
        warm_entries=0,
        ranges={},
        split_max_ts={},
        commits={(UID, 0): LAST_COMMIT.get(local, "")},
    )
    return dataclasses.replace(base, **extra)  # type: ignore[arg-type]
