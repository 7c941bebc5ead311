"""Opening a keyed subtask's state on an executor: which failures drop a checkpoint (only
corrupt files), which rewind the job (state at another epoch) and which retry (an object
store that cannot be reached). No Spark: the task-side functions on real RocksDB."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from stator.checkpoint.metadata import SubtaskSnapshot
from stator.epoch.spec import CheckpointTask, RestoreTask
from stator.errors import StateMismatchError, StorageError
from stator.locality.restore import RESTORE_ERROR_MARKER, RestoreError, open_state
from stator.locality.snapshot import take_snapshot
from stator.state.backend import KeyedBackend
from stator.state.options import RocksDBOptions
from stator.storage import FileStore, ObjectStore
from tests.unit.subtask_epochs import KG, LAST_COMMIT, MP, UID, commit, spec


def checkpointed(tmp_path: Path, store: ObjectStore, epoch: int = 1) -> SubtaskSnapshot:
    """Epochs 1..``epoch`` committed on "executor A", checkpoint 1 taken after the last."""
    local = tmp_path / "executor-a"
    for e in range(1, epoch + 1):
        ck = CheckpointTask(1, store, True, {}) if e == epoch else None
        s = spec(local, e, checkpoint=ck)
        backend, _ = open_state(s, UID, 0, KG)
        try:
            commit(local, backend, e)
            if ck is not None:
                return take_snapshot(s, UID, 0, KG, backend)[0]
        finally:
            backend.close()
    raise AssertionError("unreachable")


def restore_of(store: ObjectStore, snap: SubtaskSnapshot) -> RestoreTask:
    return RestoreTask(store, 1, snap.epoch, snapshots={(UID, 0): snap}, local_copies=True)


def test_restore_at_the_base_epoch_continues(tmp_path: Path) -> None:
    store = FileStore(f"file://{tmp_path}/ck")
    snap = checkpointed(tmp_path, store, epoch=2)
    s = spec(tmp_path / "executor-b", 3, restore=restore_of(store, snap))
    backend, restored = open_state(s, UID, 0, KG)
    try:
        assert backend.epoch == 2
        assert restored.source == "remote"
        assert restored.remote_bytes == snap.state_bytes > 0
    finally:
        backend.close()


def test_local_state_of_another_commit_at_the_base_epoch_is_restored_over(tmp_path: Path) -> None:
    """Executor A's database is at epoch 2 but is not the commit checkpoint 1 holds (another
    lineage on the same disk): it is restored over, here from A's copy of the checkpoint;
    with no restore source at epoch 2 the job must rewind instead."""
    store = FileStore(f"file://{tmp_path}/ck")
    snap = checkpointed(tmp_path, store, epoch=2)
    local = tmp_path / "executor-a"
    assert snap.commit and LAST_COMMIT[local] == snap.commit
    s = spec(local, 3, restore=restore_of(store, snap))
    backend, restored = open_state(s, UID, 0, KG)
    assert restored.source == "none"  # the expected commit: kept as it is
    backend.commit(2, 0)  # another commit of epoch 2, which the driver never heard of
    backend.close()
    backend, restored = open_state(s, UID, 0, KG)
    try:
        assert (backend.epoch, backend.commit_token, restored.source) == (2, snap.commit, "local")
    finally:
        backend.close()
    backend = open_state(s, UID, 0, KG)[0]
    backend.commit(2, 0)
    backend.close()
    older = dataclasses.replace(restore_of(store, snap), epoch=1)
    with pytest.raises(StateMismatchError, match="another lineage"):
        open_state(spec(local, 3, restore=older), UID, 0, KG)


def test_checkpoint_older_than_the_base_epoch_rewinds_and_is_not_corrupt(tmp_path: Path) -> None:
    """Issue 9, item 7: epochs 2 and 3 ran after checkpoint 1 on executor A; epoch 4 lands
    on executor B. That must rewind the job (StateMismatchError), never report the good
    checkpoint as unrestorable (which made the driver drop it)."""
    store = FileStore(f"file://{tmp_path}/ck")
    snap = checkpointed(tmp_path, store, epoch=1)
    s = spec(tmp_path / "executor-b", 4, restore=restore_of(store, snap))
    with pytest.raises(StateMismatchError) as caught:
        open_state(s, UID, 0, KG)
    assert RESTORE_ERROR_MARKER not in str(caught.value)
    assert "rewind" in str(caught.value)
    assert not (tmp_path / "executor-b" / "job" / UID / "0-of-1" / "db").exists()  # no download


def test_new_operator_after_an_older_restore_source_rewinds(tmp_path: Path) -> None:
    """An operator the restore source does not cover starts empty only at that source's
    epoch; later, starting it empty would silently lose the epochs it already processed."""
    store = FileStore(f"file://{tmp_path}/ck")
    snap = checkpointed(tmp_path, store, epoch=1)
    other = RestoreTask(store, 1, 1, snapshots={("other", 0): snap})
    with pytest.raises(StateMismatchError):
        open_state(spec(tmp_path / "b", 3, restore=other), UID, 0, KG)
    backend, _ = open_state(spec(tmp_path / "c", 2, restore=other), UID, 0, KG)
    try:
        assert backend.epoch == 1
    finally:
        backend.close()


def test_truncated_remote_file_is_a_restore_error(tmp_path: Path) -> None:
    store = FileStore(f"file://{tmp_path}/ck")
    snap = checkpointed(tmp_path, store)
    victim = max(snap.files, key=lambda f: f.size)
    target = tmp_path / "ck" / victim.key
    target.write_bytes(target.read_bytes()[: victim.size // 2])
    with pytest.raises(RestoreError) as caught:
        open_state(spec(tmp_path / "b", 2, restore=restore_of(store, snap)), UID, 0, KG)
    assert caught.value.checkpoint_id == 1


def test_missing_remote_file_is_a_restore_error(tmp_path: Path) -> None:
    store = FileStore(f"file://{tmp_path}/ck")
    snap = checkpointed(tmp_path, store)
    (tmp_path / "ck" / snap.files[0].key).unlink()
    with pytest.raises(RestoreError):
        open_state(spec(tmp_path / "b", 2, restore=restore_of(store, snap)), UID, 0, KG)


class FlakyStore(FileStore):
    """Lists and sizes work, downloads fail: the store, not the checkpoint, is at fault."""

    def get_file(self, key: str, path: Path) -> None:
        raise StorageError(f"cannot download {self.url(key)}: connection reset")


def test_unreachable_store_is_not_a_restore_error(tmp_path: Path) -> None:
    store = FileStore(f"file://{tmp_path}/ck")
    snap = checkpointed(tmp_path, store)
    flaky = FlakyStore(f"file://{tmp_path}/ck")
    with pytest.raises(StorageError) as caught:
        open_state(spec(tmp_path / "b", 2, restore=restore_of(flaky, snap)), UID, 0, KG)
    assert not isinstance(caught.value, RestoreError)
    assert RESTORE_ERROR_MARKER not in str(caught.value)


def test_a_full_disk_is_not_a_restore_error(tmp_path: Path) -> None:
    # The executor's disk, not the checkpoint: the checkpoint must not be dropped as corrupt.
    class FullDisk(FileStore):
        def get_file(self, key: str, path: Path) -> None:
            raise OSError(28, "No space left on device")

    store = FileStore(f"file://{tmp_path}/ck")
    snap = checkpointed(tmp_path, store)
    full = FullDisk(f"file://{tmp_path}/ck")
    with pytest.raises(OSError, match="No space left") as caught:
        open_state(spec(tmp_path / "b", 2, restore=restore_of(full, snap)), UID, 0, KG)
    assert not isinstance(caught.value, RestoreError)


# ---------------------------------------------------------------- task-local recovery


def copy_of(tmp_path: Path, checkpoint_id: int = 1) -> Path:
    return tmp_path / "executor-a" / "job" / UID / "0-of-1" / f"chk-{checkpoint_id}"


def test_restore_on_the_same_executor_reads_the_local_copy(tmp_path: Path) -> None:
    """Epochs 2-3 ran after checkpoint 1 (at epoch 1); the job rewinds to it: the executor's
    database is at epoch 3, its copy of checkpoint 1 serves the restore, no remote bytes."""
    store = FileStore(f"file://{tmp_path}/ck")
    snap = checkpointed(tmp_path, store, epoch=1)
    local = tmp_path / "executor-a"
    for e in (2, 3):
        b, _ = open_state(spec(local, e, completed_checkpoint=1), UID, 0, KG)
        commit(local, b, e)
        b.close()
    assert copy_of(tmp_path).is_dir()  # kept: checkpoint 1 is still the latest completed
    s = spec(local, 2, restore=restore_of(store, snap), completed_checkpoint=1)
    backend, restored = open_state(s, UID, 0, KG)
    try:
        assert backend.epoch == 1
        assert (restored.source, restored.remote_bytes) == ("local", 0)
        assert restored.local_bytes == snap.state_bytes
    finally:
        backend.close()
    # the copy survives its own restore (the database has its own manifest)
    assert copy_of(tmp_path).is_dir()


def test_truncated_local_copy_falls_back_to_the_object_store(tmp_path: Path) -> None:
    store = FileStore(f"file://{tmp_path}/ck")
    snap = checkpointed(tmp_path, store, epoch=1)
    victim = next(f for f in snap.files if not f.name.endswith(".sst"))
    (copy_of(tmp_path) / victim.name).write_bytes(b"x")
    s = spec(tmp_path / "executor-a", 2, restore=restore_of(store, snap), completed_checkpoint=1)
    (tmp_path / "executor-a" / "job" / UID / "0-of-1" / "db").rename(tmp_path / "gone")
    backend, restored = open_state(s, UID, 0, KG)
    try:
        assert backend.epoch == 1
        assert restored.source == "remote"
        assert restored.fallback is not None and victim.name in restored.fallback
        # The copy's SSTs are sound: linked, not read again; the rest comes from the store.
        ssts = sum(f.size for f in snap.files if f.name.endswith(".sst"))
        assert ssts > 0 and restored.local_bytes == ssts
        assert restored.remote_bytes == snap.state_bytes - ssts
    finally:
        backend.close()


def test_stale_local_copy_of_another_id_is_not_used(tmp_path: Path) -> None:
    """A copy under another checkpoint id (e.g. a declined checkpoint) never serves."""
    store = FileStore(f"file://{tmp_path}/ck")
    snap = checkpointed(tmp_path, store, epoch=1)
    copy_of(tmp_path).rename(copy_of(tmp_path, 7))
    restore = RestoreTask(store, 1, 1, snapshots={(UID, 0): snap}, local_copies=True)
    s = spec(tmp_path / "executor-a", 3, restore=restore)
    s = dataclasses.replace(s, base_epoch=1)
    backend, restored = open_state(s, UID, 0, KG)
    backend.close()
    assert restored.source in ("none", "remote")  # db still at epoch 1: nothing to restore


def test_copies_are_kept_until_the_driver_confirms_the_next_checkpoint(tmp_path: Path) -> None:
    store = FileStore(f"file://{tmp_path}/ck")
    local = tmp_path / "executor-a"
    state_dir = local / "job" / UID / "0-of-1"
    b, _ = open_state(spec(local, 1, checkpoint=CheckpointTask(1, store, True, {})), UID, 0, KG)
    commit(local, b, 1)
    take_snapshot(spec(local, 1, checkpoint=CheckpointTask(1, store, True, {})), UID, 0, KG, b)
    b.close()
    # epoch 2 takes checkpoint 2 while 1 is the latest completed: both copies stay
    s2 = spec(local, 2, checkpoint=CheckpointTask(2, store, True, {}), completed_checkpoint=1)
    b, _ = open_state(s2, UID, 0, KG)
    commit(local, b, 2)
    take_snapshot(s2, UID, 0, KG, b)
    b.close()
    assert sorted(p.name for p in state_dir.glob("chk-*")) == ["chk-1", "chk-2"]
    # checkpoint 2 was declined: the driver still names 1; the next task drops 2's copy
    b, _ = open_state(spec(local, 3, completed_checkpoint=1), UID, 0, KG)
    b.close()
    assert sorted(p.name for p in state_dir.glob("chk-*")) == ["chk-1"]


def test_a_failed_snapshot_attempt_leaves_no_keys_naming_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retried epoch snapshots checkpoint 1 again, and fails before it names its files'
    keys: the first attempt's keys must not be left to name the new files (a restore links
    local files by key)."""
    from stator.locality import local_copy, snapshot

    store = FileStore(f"file://{tmp_path}/ck")
    checkpointed(tmp_path, store, epoch=1)
    local = tmp_path / "executor-a"
    state_dir = local / "job" / UID / "0-of-1"
    assert local_copy.reusable(state_dir)  # the first attempt named its keys

    def fail(*_: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(snapshot, "plan_upload", fail)
    s = spec(local, 1, checkpoint=CheckpointTask(1, store, True, {}))
    s = dataclasses.replace(s, base_epoch=0, commits={})
    backend, _ = open_state(s, UID, 0, KG)
    try:
        with pytest.raises(OSError, match="disk full"):
            take_snapshot(s, UID, 0, KG, backend)
    finally:
        backend.close()
    assert local_copy.copy_ids(state_dir) == [1] and local_copy.reusable(state_dir) == {}


def test_rows_left_at_epoch_0_by_a_killed_restore_are_not_a_new_jobs_state(
    tmp_path: Path,
) -> None:
    # A restore builds in the database's own directory and commits last: killed halfway, it
    # leaves rows at epoch 0. A job that then starts empty on this disk (stateless upgrade,
    # restore.source=none) must not find them.
    local = tmp_path / "executor-a"
    half = KeyedBackend(
        Path(spec(local, 1).state_dir(UID, 0)) / "db", RocksDBOptions(), KG, MP, UID, 0
    )
    half.open()
    assert half.db is not None
    half.db[b"\x00\x00\x00\x01k\x00"] = b"restored halfway"
    half.close()
    backend, restored = open_state(spec(local, 1), UID, 0, KG)
    try:
        assert backend.epoch == 0 and restored.source == "none"
        assert backend.db is not None
        stored = list(backend.db.keys())  # metadata keys only
        assert [k for k in stored if not k.startswith(b"\xff\xff")] == []
    finally:
        backend.close()


@pytest.mark.parametrize(
    ("executor", "retry", "gone", "refused"),
    [
        ("2", True, False, True),  # Spark's retry elsewhere, after the holder was lost
        ("2", False, False, False),  # a first attempt placed elsewhere after the locality wait
        ("2", False, True, True),  # a first attempt elsewhere: the holder was lost since the
        # epoch was planned
        ("1", True, False, False),  # a retry on the executor the driver sent it to
    ],
)
def test_a_retry_away_from_the_executor_holding_the_state_does_not_read_the_store(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    executor: str,
    retry: bool,
    gone: bool,
    refused: bool,
) -> None:
    """The driver sent subtask 0 to executor 1, which holds its state. When that executor
    is lost, Spark retries the task at once on any executor with a free slot, before the
    lost one's replacement (same node and volume, same local copies) can register. That
    retry must fail (the driver rewinds and waits for the replacement) rather than read the
    state from the object store; nothing is downloaded and the checkpoint is not blamed."""
    from stator.locality import restore

    store = FileStore(f"file://{tmp_path}/ck")
    snap = checkpointed(tmp_path, store, epoch=2)
    monkeypatch.setattr(restore, "task_location", lambda: (executor, "10.0.0.9"))
    monkeypatch.setattr(restore, "task_is_retry", lambda: retry)
    monkeypatch.setattr(restore, "task_sent_to_gone", lambda: gone)
    pinned = {(UID, 0): "executor_10.0.0.9_1"}
    s = spec(tmp_path / "executor-b", 3, restore=restore_of(store, snap), pinned=pinned)
    if not refused:
        backend, restored = open_state(s, UID, 0, KG)
        backend.close()
        assert (restored.source, restored.remote_bytes) == ("remote", snap.state_bytes)
        return
    with pytest.raises(StateMismatchError, match=r"waits up to local_recovery\.executor_wait_ms"):
        open_state(s, UID, 0, KG)
    assert not (tmp_path / "executor-b" / "job" / UID / "0-of-1" / "db").exists()
    # Without the pin (the driver planned a restore anywhere) the same retry restores.
    backend, restored = open_state(dataclasses.replace(s, pinned={}), UID, 0, KG)
    backend.close()
    assert restored.source == "remote"
