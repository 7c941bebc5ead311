"""Standby copies (``local_recovery.standby``): which executor keeps each subtask's copy, what
keeping one reads from the object store, and a restore on the standby executor. No Spark:
the task-side functions on real RocksDB and a file store."""

from __future__ import annotations

import io
import pickle
import time
from dataclasses import replace
from pathlib import Path

import pytest

from stator.checkpoint import transfer, uploads
from stator.checkpoint.metadata import (
    CheckpointMetadata,
    OperatorSnapshot,
    RemoteFile,
    SubtaskSnapshot,
)
from stator.driver.status import StandbyCopies
from stator.epoch.reports import StandbyTally
from stator.epoch.spec import STATE_DIR_ENV, CheckpointTask, RestoreTask, StandbyOrder
from stator.errors import StorageError
from stator.locality import local_copy, standby_copy
from stator.locality.inventory import Holding, list_copies
from stator.locality.placement import EpochLocations, LocalRestore, PlacementTracker
from stator.locality.restore import open_state
from stator.locality.snapshot import take_snapshot
from stator.locality.standby import StandbyAssigner
from stator.storage import FileStore, ObjectStore
from tests.unit.subtask_epochs import KG, UID, commit, spec

# ---------------------------------------------------------------- keeping and restoring


def two_checkpoints(tmp_path: Path, store: ObjectStore) -> tuple[SubtaskSnapshot, SubtaskSnapshot]:
    """Executor A: checkpoint 1 at epoch 1, then checkpoint 2 at epoch 2 on top of it
    (incremental: it re-references 1's SST under the same key)."""
    local = tmp_path / "executor-a"
    snaps = []
    previous: dict[str, RemoteFile] = {}
    for e in (1, 2):
        ck = CheckpointTask(e, store, True, {(UID, 0): previous} if previous else {})
        s = spec(local, e, checkpoint=ck, completed_checkpoint=e - 1)
        backend, _ = open_state(s, UID, 0, KG)
        try:
            commit(local, backend, e)
            snap = take_snapshot(s, UID, 0, KG, backend)[0]
        finally:
            backend.close()
        snaps.append(snap)
        previous = {f.name: f for f in snap.files}
    return snaps[0], snaps[1]


def stored_bytes(snap: SubtaskSnapshot, besides: SubtaskSnapshot | None = None) -> int:
    had = {f.key for f in besides.files} if besides is not None else set()
    return sum(f.size for f in snap.files if f.stored and f.key not in had)


def standby_dir(tmp_path: Path) -> Path:
    return tmp_path / "executor-b" / "job" / UID / "0-of-1"


def test_a_standby_copy_reads_only_the_files_each_checkpoint_added(tmp_path: Path) -> None:
    store = FileStore(f"file://{tmp_path}/ck")
    one, two = two_checkpoints(tmp_path, store)
    shared = {f.key for f in one.files} & {f.key for f in two.files}
    assert shared, "checkpoint 2 shares an SST with checkpoint 1"
    where = standby_dir(tmp_path)
    assert standby_copy.keep(store, where, 1, one.files) == stored_bytes(one)
    assert standby_copy.keep(store, where, 1, one.files) == 0  # already there
    assert standby_copy.keep(store, where, 2, two.files) == stored_bytes(two, besides=one) > 0
    assert standby_copy.standby_ids(where) == [2]  # the older copy is gone
    assert sorted(p.name for p in where.glob("chk-*")) == ["chk-2"]


def test_a_copy_already_on_the_disk_is_not_read_again(tmp_path: Path) -> None:
    """Executors sharing a disk, or a subtask that ran here: its own copy of the checkpoint
    serves as the standby copy (recorded, so the next one reuses its files)."""
    store = FileStore(f"file://{tmp_path}/ck")
    _, two = two_checkpoints(tmp_path, store)
    own = tmp_path / "executor-a" / "job" / UID / "0-of-1"
    assert standby_copy.keep(store, own, 2, two.files) == 0
    assert standby_copy.standby_ids(own) == [2]


def test_a_standby_copy_reuses_the_executors_own_older_copy(tmp_path: Path) -> None:
    """The replacement of the executor that ran the subtask becomes its standby, on the same
    volume: the subtask's own copy of an older checkpoint lies there, its keys named, and
    the standby copy reads only the files the newer checkpoint added."""
    store = FileStore(f"file://{tmp_path}/ck")
    one, two = two_checkpoints(tmp_path, store)
    own = tmp_path / "executor-a" / "job" / UID / "0-of-1"
    assert local_copy.copy_ids(own) == [1, 2]
    local_copy.drop(own, 2)  # only the older own copy is left
    assert standby_copy.keep(store, own, 2, two.files) == stored_bytes(two, besides=one) > 0
    assert standby_copy.standby_ids(own) == [2]
    assert local_copy.copy_ids(own) == [2] and not local_copy.keys_path(own, 1).exists()


def test_a_restore_links_the_ssts_the_executors_own_older_copy_holds(tmp_path: Path) -> None:
    """The subtask comes back to an executor whose volume holds only its own copy of an
    older checkpoint (no standby record): the restore is remote, and reads only the files
    the newer checkpoint added; the SSTs both name are hard-linked from the older copy."""
    store = FileStore(f"file://{tmp_path}/ck")
    one, two = two_checkpoints(tmp_path, store)
    local = tmp_path / "executor-a"
    own = local / "job" / UID / "0-of-1"
    local_copy.drop(own, 2)
    (own / "db").rename(tmp_path / "lost")  # the database is gone, its copy of 1 is not
    restore = RestoreTask(store, 2, 2, snapshots={(UID, 0): two}, local_copies=True)
    backend, restored = open_state(spec(local, 3, restore=restore), UID, 0, KG)
    try:
        assert backend.epoch == 2
        assert (restored.source, restored.fallback) == ("remote", "no local copy")
        linked = sum(f.size for f in two.files if f.key in {g.key for g in one.files})
        assert linked > 0 and restored.local_bytes == linked
        assert restored.remote_bytes == two.state_bytes - linked
    finally:
        backend.close()
    # Without local recovery (the checkpoint is not this job's), nothing local is trusted.
    local_copy.drop(own, 2)
    (own / "db").rename(tmp_path / "lost-again")
    foreign = replace(restore, local_copies=False)
    backend, restored = open_state(spec(local, 3, restore=foreign), UID, 0, KG)
    backend.close()
    assert (restored.remote_bytes, restored.local_bytes) == (two.state_bytes, 0)


def test_a_restore_whose_linked_file_proves_wrong_reads_it_all_again(tmp_path: Path) -> None:
    """An SST of the older copy has the size its key says but not its bytes (a damaged disk):
    the restore that linked it fails to open or shows another commit, and the object store,
    the truth, is read whole instead; the checkpoint is not blamed."""
    store = FileStore(f"file://{tmp_path}/ck")
    one, two = two_checkpoints(tmp_path, store)
    local = tmp_path / "executor-a"
    own = local / "job" / UID / "0-of-1"
    local_copy.drop(own, 2)
    (own / "db").rename(tmp_path / "lost")
    shared = [f for f in two.files if f.key in {g.key for g in one.files}]
    assert shared and all(f.name.endswith(".sst") for f in shared)
    for f in shared:  # replaced, not written through: the lost database keeps its own
        damaged = own / "chk-1" / f.name
        damaged.unlink()
        damaged.write_bytes(bytes(f.size))
    restore = RestoreTask(store, 2, 2, snapshots={(UID, 0): two}, local_copies=True)
    backend, restored = open_state(spec(local, 3, restore=restore), UID, 0, KG)
    try:
        assert (backend.epoch, backend.commit_token) == (2, two.commit)
        assert restored.source == "remote"
        assert (restored.remote_bytes, restored.local_bytes) == (two.state_bytes, 0)
    finally:
        backend.close()


def test_a_failed_copy_keeps_what_it_read_for_the_next_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention deleted a file of the checkpoint while the copy read it (a large state,
    read in the background): the next attempt reads only the file it lacks, not all again.
    One reader, the missing file first: the files queued behind it are still read."""
    monkeypatch.setattr(transfer, "TRANSFER_CALLERS", 1)
    store = FileStore(f"file://{tmp_path}/ck")
    _, two = two_checkpoints(tmp_path, store)
    stored = sorted((f for f in two.files if f.stored), key=lambda f: f.size)
    assert len(stored) >= 2, "a checkpoint of several objects"
    gone = stored[0]
    saved = store.get(gone.key)
    store.delete([gone.key])
    where = standby_dir(tmp_path)
    with pytest.raises(StorageError, match="cannot read"):
        standby_copy.keep(store, where, 2, (gone, *(f for f in two.files if f != gone)))
    assert standby_copy.standby_ids(where) == []  # no copy without every file
    store.put(gone.key, saved)
    assert standby_copy.keep(store, where, 2, two.files) == gone.size
    assert standby_copy.standby_ids(where) == [2]
    assert not (where / standby_copy.SALVAGE_NAME).exists()
    # The copy is whole: a restore from it reads nothing from the store.
    restore = RestoreTask(store, 2, 2, snapshots={(UID, 0): two}, local_copies=True)
    backend, restored = open_state(spec(tmp_path / "executor-b", 3, restore=restore), UID, 0, KG)
    try:
        assert backend.epoch == 2
        assert (restored.source, restored.remote_bytes) == ("local", 0)
    finally:
        backend.close()


def test_a_restore_on_the_standby_executor_catches_its_copy_up(tmp_path: Path) -> None:
    """The standby kept checkpoint 1; the job restores checkpoint 2 there: only the files
    checkpoint 2 added are read, and the database is at checkpoint 2's epoch."""
    store = FileStore(f"file://{tmp_path}/ck")
    one, two = two_checkpoints(tmp_path, store)
    standby_copy.keep(store, standby_dir(tmp_path), 1, one.files)
    restore = RestoreTask(store, 2, 2, snapshots={(UID, 0): two}, local_copies=True)
    s = spec(tmp_path / "executor-b", 3, restore=restore, completed_checkpoint=2)
    backend, restored = open_state(s, UID, 0, KG)
    try:
        assert backend.epoch == 2
        assert restored.source == "local"
        assert restored.remote_bytes == stored_bytes(two, besides=one)
        assert restored.local_bytes == two.state_bytes - restored.remote_bytes
    finally:
        backend.close()
    # The subtask runs here now: the copy is its own local copy, no longer a standby one.
    assert standby_copy.standby_ids(standby_dir(tmp_path)) == []
    assert (standby_dir(tmp_path) / "chk-2").is_dir()


def test_a_standby_copy_with_a_wrong_file_is_not_restored(tmp_path: Path) -> None:
    store = FileStore(f"file://{tmp_path}/ck")
    _, two = two_checkpoints(tmp_path, store)
    where = standby_dir(tmp_path)
    standby_copy.keep(store, where, 2, two.files)
    victim = next(f for f in two.files if f.name.endswith(".sst"))
    (where / "chk-2" / victim.name).unlink()
    (where / "chk-2" / victim.name).write_bytes(b"x")
    restore = RestoreTask(store, 2, 2, snapshots={(UID, 0): two}, local_copies=True)
    backend, restored = open_state(spec(tmp_path / "executor-b", 3, restore=restore), UID, 0, KG)
    backend.close()
    # Caught up again (the record names the key; the size differs, so it is read again).
    assert restored.source == "local"
    assert restored.remote_bytes == victim.size


def test_the_survey_lists_standby_copies_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(f"file://{tmp_path}/ck")
    one, _ = two_checkpoints(tmp_path, store)
    standby_copy.keep(store, standby_dir(tmp_path), 1, one.files)
    monkeypatch.setenv(STATE_DIR_ENV, str(tmp_path / "executor-b"))
    [(_, _, _, copies, standby)] = list(list_copies("job", "/nowhere", []))
    assert copies == standby == [(UID, 0, 1, 1)]


def test_the_uploader_keeps_the_copies_a_task_hands_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step 3 runs in the uploader process, beside its uploads (here its ``serve`` loop),
    and tallies what the copies read for the tasks on its executor to report: every byte
    read once, a failed attempt's too (the retry reads only the file it lacked)."""
    monkeypatch.setattr(standby_copy, "_tally", StandbyTally("uploader-1"))
    store = FileStore(f"file://{tmp_path}/ck")
    one, two = two_checkpoints(tmp_path, store)
    where = standby_dir(tmp_path)
    local_dir = str(tmp_path / "executor-b")
    assert standby_copy.read_tally(local_dir, "job") is None
    gone = next(f for f in two.files if f.stored and f.key not in {g.key for g in one.files})
    saved = store.get(gone.key)
    store.delete([gone.key])
    tally = standby_copy.tally_path(local_dir, "job")
    made = StandbyTally("uploader-1", copies=1, bytes=stored_bytes(one))
    failed = replace(made, failed=1, bytes=made.bytes + stored_bytes(two, one) - gone.size)
    retried = replace(failed, copies=2, bytes=stored_bytes(one) + stored_bytes(two, one))
    steps = ((1, one, made), (2, two, failed), (2, two, retried))
    for i, (checkpoint_id, checkpoint, expected) in enumerate(steps):
        if i == 2:
            assert standby_copy.standby_ids(where) == [1]  # the failed copy left the older
            store.put(gone.key, saved)
        order = StandbyOrder(UID, 0, 1, checkpoint_id, checkpoint.files)
        job = standby_copy.StandbyJob(store, ((where, order),), tally)
        uploads.serve(io.BytesIO(pickle.dumps(job)))
        deadline = time.monotonic() + 30
        while standby_copy.read_tally(local_dir, "job") != expected:
            assert time.monotonic() < deadline, (
                standby_copy.read_tally(local_dir, "job"),
                expected,
            )
            time.sleep(0.05)
    assert standby_copy.standby_ids(where) == [2]


def test_orders_queued_behind_a_copy_are_run_newest_only(tmp_path: Path) -> None:
    """While a large copy runs, each checkpoint's orders queue in the uploader; what queued
    is then taken at once, each subtask's newest order only, where the last job names it."""
    store = FileStore(f"file://{tmp_path}/ck")
    a, b = tmp_path / "a", tmp_path / "b"

    def job(*orders: tuple[Path, int]) -> standby_copy.StandbyJob:
        return standby_copy.StandbyJob(
            store, tuple((d, StandbyOrder(UID, 0, 1, cid, ())) for d, cid in orders), a / "tally"
        )

    queued = [job((a, 7), (b, 7)), job((a, 8)), job((b, 9), (a, 8)), job((b, 8))]
    kept = standby_copy.newest_orders(queued)
    assert [[(d, o.checkpoint_id) for d, o in j.orders] for j in kept] == [[(b, 9), (a, 8)]]
    assert standby_copy.newest_orders([job((a, 3))]) == [job((a, 3))]


# ---------------------------------------------------------------- placement


def test_placement_prefers_an_exact_copy_then_a_standby_copy_to_catch_up() -> None:
    t = PlacementTracker()
    live = {"2": "10.0.0.2", "3": "10.0.0.3"}
    restore = LocalRestore(5, frozenset({"count"}))
    standby = Holding(
        "2", "10.0.0.2", "n2", frozenset({("count", 0, 1, 4)}), frozenset({("count", 0, 1, 4)})
    )
    plan = t.plan({"count": 1}, live, {"2": standby}, restore)
    assert plan.by_operator["count"] == ["executor_10.0.0.2_2"]
    assert plan.pinned == {("count", 0): "executor_10.0.0.2_2"}
    exact = Holding("3", "10.0.0.3", "n3", frozenset({("count", 0, 1, 5)}))
    plan = t.plan({"count": 1}, live, {"2": standby, "3": exact}, restore)
    assert plan.by_operator["count"] == ["executor_10.0.0.3_3"]
    # A standby copy newer than the restored checkpoint cannot serve it.
    newer = Holding(
        "2", "10.0.0.2", "n2", frozenset({("count", 0, 1, 6)}), frozenset({("count", 0, 1, 6)})
    )
    assert t.plan({"count": 1}, live, {"2": newer}, restore).pinned == {}


# ---------------------------------------------------------------- which executor


def latest(checkpoint_id: int = 7, parallelism: int = 3) -> CheckpointMetadata:
    subtasks = tuple(SubtaskSnapshot(i, parallelism, (i, i + 1), 3, ()) for i in range(parallelism))
    op = OperatorSnapshot("count", parallelism, subtasks)
    return CheckpointMetadata(checkpoint_id, 3, "job", 0, 128, True, {"count": op}, {}, {}, 0)


LIVE = {"1": "10.0.0.1", "2": "10.0.0.2", "3": "10.0.0.3"}


def planned(*executors: str, live: dict[str, str] = LIVE) -> EpochLocations:
    locations = [f"executor_{live[e]}_{e}" for e in executors]
    return EpochLocations({"count": locations}, {}, dict(live))


def standbys(task: object) -> dict[int, str]:
    assert task is not None
    return {o.subtask: where for where, orders in task.orders.items() for o in orders}  # type: ignore[attr-defined]


def test_each_subtask_has_a_standby_on_another_executor_spread_evenly() -> None:
    a = StandbyAssigner(FileStore("file:///tmp/unused"), lambda _: None)
    task = a.orders(planned("1", "2", "3"), {"count": 3}, latest(), {})
    got = standbys(task)
    assert all(got[i] != f"executor_{LIVE[str(i + 1)]}_{i + 1}" for i in range(3))
    assert sorted(got.values()) == sorted(f"executor_{h}_{e}" for e, h in LIVE.items())
    assert {o.checkpoint_id for orders in task.orders.values() for o in orders} == {7}  # type: ignore[union-attr]


def test_standbys_stay_put_and_move_only_off_the_subtasks_own_executor() -> None:
    a = StandbyAssigner(FileStore("file:///tmp/unused"), lambda _: None)
    first = standbys(a.orders(planned("1", "2", "3"), {"count": 3}, latest(), {}))
    assert standbys(a.orders(planned("1", "2", "3"), {"count": 3}, latest(8), {})) == first
    # Subtask 0 moves onto the executor that kept its copy: the copy goes elsewhere.
    runs_on = first[0].rsplit("_", 1)[1]
    moved = standbys(a.orders(planned(runs_on, "2", "3"), {"count": 3}, latest(8), {}))
    assert moved[0] != first[0] and (moved[1], moved[2]) == (first[1], first[2])


def test_a_standby_on_another_node_is_preferred() -> None:
    a = StandbyAssigner(FileStore("file:///tmp/unused"), lambda _: None)
    nodes = {"1": "n1", "2": "n1", "3": "n2"}
    got = standbys(a.orders(planned("1", live=LIVE), {"count": 1}, latest(parallelism=1), nodes))
    assert got == {0: "executor_10.0.0.3_3"}


def test_no_orders_without_a_checkpoint_a_second_executor_or_the_same_parallelism() -> None:
    a = StandbyAssigner(FileStore("file:///tmp/unused"), lambda _: None)
    assert a.orders(planned("1", "2", "3"), {"count": 3}, None, {}) is None
    one = {"1": "10.0.0.1"}
    assert a.orders(planned("1", live=one), {"count": 1}, latest(parallelism=1), {}) is None
    rescaled = a.orders(planned("1", "2", "3"), {"count": 3}, latest(parallelism=2), {})
    assert rescaled is not None and rescaled.orders == {}


def test_the_placement_status_names_each_subtasks_standby() -> None:
    from stator.epoch.reports import RestoreReport, RestoreSource, StateReport

    t = PlacementTracker()
    reports = [
        StateReport(
            "count",
            i,
            1,
            0,
            0,
            0,
            restore=RestoreReport(RestoreSource.NONE),
            executor=e,
            host=f"10.0.0.{e}",
            node=f"n{e}",
        )
        for i, e in ((0, "1"), (1, "2"))
    ]
    t.record(reports, {"count": 2})
    t.standby = {("count", 0, 2): ("2", "n2"), ("count", 1, 2): ("1", "n1")}
    entries = t.to_json()["count"]
    assert [e["standby"] for e in entries] == [
        {"executor": "2", "node": "n2"},
        {"executor": "1", "node": "n1"},
    ]


def test_the_driver_counts_each_uploaders_newest_tally_once() -> None:
    """Tallies are cumulative per uploader: one reported by two tasks, or late (an older
    one after a newer), counts once; regions sharing an executor's uploader merge."""
    one, two = StandbyCopies(), StandbyCopies()
    a1, a2 = StandbyTally("a", copies=1, bytes=100), StandbyTally("a", copies=2, bytes=150)
    for tally in (a1, a2, a1, None, a2):
        one.note(tally)
    two.note(StandbyTally("b", copies=1, bytes=40, failed=1))
    two.note(a1)
    assert one.to_json() == {"copies": 2, "bytes": 150, "failed": 0}
    one.merge(two)
    assert one.to_json() == {"copies": 3, "bytes": 190, "failed": 1}
