"""The owner marker of a checkpoint root (issue 38): two jobs writing one root (two clusters
sharing a bucket and a ``<namespace>.<name>``, or a pipeline recreated while its predecessor
runs) never delete each other's checkpoints; a root is taken over only on purpose
(``checkpoint.adopt``), and a deleted pipeline releases it."""

from __future__ import annotations

from pathlib import Path

import pytest

from stator.checkpoint.coordinator import CheckpointCoordinator
from stator.checkpoint.metadata import RemoteFile
from stator.checkpoint.ownership import OWNER_KEY, NotOwner, Ownership, read_owner, release
from stator.errors import StorageError
from stator.storage import FileStore
from tests.unit.checkpoint_fixtures import SUM, make_meta


def run_checkpoints(coord: CheckpointCoordinator, store: FileStore, count: int) -> None:
    """``count`` checkpoints, each with a shared file of its own, subsumed as the driver does."""
    for _ in range(count):
        cid = coord.new_checkpoint_id()
        f = RemoteFile(f"{cid}.sst", f"shared/op/{cid:06d}.sst", 3, True, checksum=SUM)
        store.put(f.key, b"sst")
        coord.complete(make_meta(cid, [f]))
        coord.subsume()


def objects(store: FileStore) -> dict[str, int]:
    return dict(store.listing())


def test_a_second_job_on_an_owned_root_is_refused_and_deletes_nothing(tmp_path: Path) -> None:
    store = FileStore(f"file://{tmp_path}/ns.counts")
    a = CheckpointCoordinator(store, 2, Ownership("uid-a"))
    a.recover()
    run_checkpoints(a, store, 3)
    assert read_owner(store) == "uid-a"
    # A crashed attempt of a's next checkpoint: garbage a's recovery would delete.
    store.put("chk-0000000004/op/0/MANIFEST", b"m")
    before = objects(store)

    b = CheckpointCoordinator(store, 2, Ownership("uid-b"))
    with pytest.raises(NotOwner) as refused:
        b.recover()
    message = str(refused.value)
    assert "owner 'uid-a'" in message and "'uid-b'" in message
    assert "spec.checkpointing.adopt: true" in message
    assert objects(store) == before, "the refused job deleted or wrote nothing"

    # a itself recovers as ever (its own marker), and collects its own garbage.
    again = CheckpointCoordinator(store, 2, Ownership("uid-a"))
    report = again.recover()
    assert report.restored is not None and report.restored.checkpoint_id == 3
    assert report.deleted_files == 1


def test_an_adopted_root_stops_its_old_owner_before_it_deletes(tmp_path: Path) -> None:
    store = FileStore(f"file://{tmp_path}/ns.counts")
    a = CheckpointCoordinator(store, 2, Ownership("uid-a"))
    a.recover()
    run_checkpoints(a, store, 2)

    b = CheckpointCoordinator(store, 2, Ownership("uid-b", adopt=True))
    report = b.recover()
    assert report.restored is not None and report.restored.checkpoint_id == 2, "b continues"
    assert read_owner(store) == "uid-b"
    run_checkpoints(b, store, 1)
    kept = objects(store)

    # a (a zombie of the earlier pipeline) completes one more checkpoint: it stops before
    # subsuming, so nothing b retains is deleted.
    cid = a.new_checkpoint_id() + 100
    f = RemoteFile("late.sst", f"shared/op/{cid:06d}.sst", 3, True, checksum=SUM)
    store.put(f.key, b"sst")
    a.complete(make_meta(cid, [f]))
    with pytest.raises(NotOwner, match="taken over by 'uid-b'"):
        a.subsume()
    assert set(kept) <= set(objects(store)), "a deleted nothing b retains"


def test_a_released_root_is_claimed_again_without_adopt(tmp_path: Path) -> None:
    store = FileStore(f"file://{tmp_path}/ns.counts")
    a = CheckpointCoordinator(store, 2, Ownership("uid-a"))
    a.recover()
    run_checkpoints(a, store, 2)
    assert not release(store, "uid-other"), "only the owner releases"
    assert read_owner(store) == "uid-a"
    assert release(store, "uid-a")
    assert read_owner(store) is None
    c = CheckpointCoordinator(store, 2, Ownership("uid-c"))
    assert c.recover().restored is not None, "the recreated pipeline continues"
    assert read_owner(store) == "uid-c"


def test_an_unreadable_marker_refuses_instead_of_guessing(tmp_path: Path) -> None:
    store = FileStore(f"file://{tmp_path}/ns.counts")
    a = CheckpointCoordinator(store, 2, Ownership("uid-a"))
    a.recover()
    run_checkpoints(a, store, 2)
    store.put(OWNER_KEY, b" " * 5000)  # read by the operator too: never read whole
    with pytest.raises(StorageError, match="more than an owner marker"):
        CheckpointCoordinator(store, 2, Ownership("uid-a")).recover()
    with pytest.raises(StorageError, match="more than an owner marker"):
        release(store, "uid-a")  # the operator's delete reports it, reads nothing more
    store.put(OWNER_KEY, b"not json")
    before = objects(store)
    with pytest.raises(StorageError, match="is not an owner marker"):
        CheckpointCoordinator(store, 2, Ownership("uid-a")).recover()
    # A running owner that cannot read the marker subsumes nothing this time.
    run_checkpoints(a, store, 1)
    assert set(before) <= set(objects(store))


def test_a_job_without_an_owner_writes_no_marker(tmp_path: Path) -> None:
    store = FileStore(f"file://{tmp_path}/ns.counts")
    coord = CheckpointCoordinator(store, 2)
    coord.recover()
    run_checkpoints(coord, store, 3)
    assert read_owner(store) is None
    assert OWNER_KEY not in objects(store)
