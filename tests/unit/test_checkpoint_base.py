"""Which checkpoint an epoch builds on (``driver/checkpoint_base.py``): only this job's own
checkpoint, and only the operators that keep their parallelism."""

from __future__ import annotations

from pathlib import Path

from stator.checkpoint.metadata import (
    CheckpointMetadata,
    OperatorSnapshot,
    RemoteFile,
    SubtaskSnapshot,
)
from stator.driver.checkpoint_base import incremental_base, local_restore
from stator.lineage import Target
from stator.locality.placement import LocalRestore
from stator.savepoint.metadata import SavepointMetadata
from stator.storage import open_store

SUM = "xxh3:0123456789abcdef"  # a stored file's checksum (its bytes are never read here)


def _checkpoint(checkpoint_id: int, parallelism: dict[str, int]) -> CheckpointMetadata:
    operators = {
        uid: OperatorSnapshot(
            uid,
            p,
            tuple(
                SubtaskSnapshot(
                    i,
                    p,
                    (0, 0),
                    3,
                    (RemoteFile(f"{i}.sst", f"shared/{uid}-{i}", 10, True, checksum=SUM),),
                )
                for i in range(p)
            ),
        )
        for uid, p in parallelism.items()
    }
    return CheckpointMetadata(checkpoint_id, 3, "j", 0, 32, True, operators, {}, {}, 0)


def test_the_base_is_the_newest_checkpoint_in_flight_else_the_jobs_own(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "job"))
    restored = Target(_checkpoint(4, {"count": 2, "sum": 1}), store)
    now = {"count": 2, "sum": 3}  # "sum" was rescaled: its files are not shared

    base, shared = incremental_base(None, restored, store, now, incremental=True)
    assert base == 0
    assert shared == {
        ("count", 0): {"0.sst": RemoteFile("0.sst", "shared/count-0", 10, True, checksum=SUM)},
        ("count", 1): {"1.sst": RemoteFile("1.sst", "shared/count-1", 10, True, checksum=SUM)},
    }
    in_flight = _checkpoint(6, {"count": 2, "sum": 3})
    base, shared = incremental_base(in_flight, restored, store, now, incremental=True)
    assert base == 6
    assert sorted(shared) == [("count", 0), ("count", 1), ("sum", 0), ("sum", 1), ("sum", 2)]
    assert incremental_base(in_flight, restored, store, now, incremental=False) == (0, {})


def test_nothing_is_shared_with_a_savepoint_or_another_jobs_checkpoint(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "job"))
    other = Target(_checkpoint(4, {"count": 2}), open_store(str(tmp_path / "other")))
    savepoint = Target(SavepointMetadata("j", 3, 0, 32, {}, {}, 0, "zlib"), store)
    for target in (other, savepoint, None):
        assert incremental_base(None, target, store, {"count": 2}, incremental=True) == (0, {})
        assert local_restore(target, store, {"count": 2}, enabled=True) is None


def test_local_copies_serve_the_operators_that_keep_their_parallelism(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "job"))
    restored = Target(_checkpoint(4, {"count": 2, "sum": 1}), store)
    now = {"count": 2, "sum": 3}
    assert local_restore(restored, store, now, enabled=True) == LocalRestore(
        4, frozenset({"count"})
    )
    assert local_restore(restored, store, now, enabled=False) is None
