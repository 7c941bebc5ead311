"""A pending checkpoint moves only forward through its states, and ends with one verdict:
completed (metadata written, retained) or aborted (forgotten, its files deleted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stator.checkpoint.coordinator import CheckpointCoordinator
from stator.checkpoint.metadata import RemoteFile, SubtaskSnapshot, metadata_key
from stator.checkpoint.pending import CheckpointResult, CheckpointState
from stator.driver.completion import PendingOutput, acknowledge
from stator.epoch.reports import StateReport
from stator.storage import FileStore


def _state(epoch: int, error: str | None = None) -> StateReport:
    files = (RemoteFile("000001.sst", "shared/op/a-000001.sst", 4, True),)
    snap = None if error else SubtaskSnapshot(0, 1, (0, 128), epoch, files)
    return StateReport("op", 0, epoch, 0, 0, 0, snap, error)


def test_a_checkpoint_is_triggered_acknowledged_and_completed(tmp_path: Path) -> None:
    store = FileStore(f"file://{tmp_path}")
    coord = CheckpointCoordinator(store)
    pending = coord.trigger(3, True)
    assert pending.state is CheckpointState.TRIGGERED and coord.pending == {1: pending}
    out = PendingOutput({})
    assert acknowledge(pending, "job", "", {"op": 1}, 128, [_state(3)], {}, out, coord, 0.0) is None
    assert pending.state is CheckpointState.ACKNOWLEDGED
    verdict = coord.finish(pending)
    assert verdict.result is CheckpointResult.COMPLETED and verdict.meta is not None
    assert pending.state is CheckpointState.COMPLETED and pending.verdict is verdict
    assert coord.pending == {} and store.exists(metadata_key(1))
    with pytest.raises(RuntimeError, match="COMPLETED -> ABORTED"):
        coord.fail(pending, "too late")


def test_a_declined_checkpoint_is_aborted_with_its_reason(tmp_path: Path) -> None:
    store = FileStore(f"file://{tmp_path}")
    store.put("shared/op/a-000001.sst", b"data")
    coord = CheckpointCoordinator(store)
    pending = coord.trigger(1, True)
    declined = [_state(1, "StorageError: unreachable")]
    out = PendingOutput({})
    verdict = acknowledge(pending, "job", "", {"op": 1}, 128, declined, {}, out, coord, 0.0)
    assert verdict is not None and verdict.result is CheckpointResult.FAILED
    assert verdict.error == "StorageError: unreachable"
    assert pending.state is CheckpointState.ABORTED and coord.pending == {}
    assert not store.exists(metadata_key(1))


def test_a_checkpoint_whose_epoch_failed_is_forgotten(tmp_path: Path) -> None:
    coord = CheckpointCoordinator(FileStore(f"file://{tmp_path}"))
    coord.trigger(1, True)
    coord.forget_triggered()
    assert coord.pending == {} and coord.trigger(2, True).checkpoint_id == 2
