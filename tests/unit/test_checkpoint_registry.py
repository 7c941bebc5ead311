"""The shared-state registry and the coordinator, checked against a model: no file that a
retained checkpoint needs is ever deleted, and every file nothing needs is deleted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stator.checkpoint.coordinator import CheckpointCoordinator
from stator.checkpoint.metadata import (
    CheckpointMetadata,
    RemoteFile,
    metadata_key,
)
from stator.checkpoint.registry import SharedStateRegistry
from stator.errors import StorageError
from stator.storage import FileStore
from tests.unit.checkpoint_fixtures import SUM, make_meta

# Each step: which of the previous checkpoint's shared files to keep (by index), how many new
# shared files to add, and whether the checkpoint fails instead of completing.
steps = st.lists(
    st.tuples(st.lists(st.integers(0, 20), max_size=8), st.integers(0, 3), st.booleans()),
    min_size=1,
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(steps=steps, retained=st.integers(1, 4))
def test_coordinator_never_deletes_a_needed_file(
    tmp_path_factory: object, steps: list, retained: int
) -> None:

    root = tmp_path_factory.mktemp("store")  # type: ignore[attr-defined]
    store = FileStore(f"file://{root}")
    coord = CheckpointCoordinator(store, retained)
    model: list[tuple[int, set[str]]] = []  # retained checkpoints: id -> shared keys
    previous: list[RemoteFile] = []
    n = 0
    for keep, new, fails in steps:
        cid = coord.new_checkpoint_id()
        files = [previous[i] for i in sorted(set(keep)) if i < len(previous)]
        uploaded = []
        for _ in range(new):
            n += 1
            f = RemoteFile(f"{n:06d}.sst", f"shared/op/{n:06d}.sst", 3, True, checksum=SUM)
            store.put(f.key, b"sst")
            uploaded.append(f)
        private = RemoteFile("MANIFEST", f"chk-{cid:010d}/op/0/MANIFEST", 1, False, checksum=SUM)
        store.put(private.key, b"m")
        files += [*uploaded, private]
        if fails:
            coord.abort(cid, uploaded, "test")
            continue
        meta = make_meta(cid, files)
        coord.complete(meta)
        coord.subsume()
        previous = [f for f in files if f.shared]
        model.append((cid, {f.key for f in files if f.shared}))
        model = model[-retained:]
        # Invariant: exactly the files of retained checkpoints exist (plus their metadata).
        needed = set().union(*(keys for _, keys in model))
        present = {k for k, _ in store.listing("shared/")}
        assert needed <= present, f"deleted a needed file: {needed - present}"
        assert present <= needed, f"kept garbage: {present - needed}"
        assert [m.checkpoint_id for m in coord.completed] == [c for c, _ in model]

    # After a restart the registry is rebuilt from storage alone and agrees with the model.
    again = CheckpointCoordinator(store, retained)
    report = again.recover()
    assert [m.checkpoint_id for m in again.completed] == [c for c, _ in model]
    assert again.registry.keys() == set().union(*(keys for _, keys in model)) if model else True
    assert (report.restored.checkpoint_id if report.restored else None) == (
        model[-1][0] if model else None
    )


def test_recover_deletes_files_of_a_checkpoint_that_never_completed(tmp_path: Path) -> None:
    store = FileStore(f"file://{tmp_path}")
    coord = CheckpointCoordinator(store, 2)
    good = RemoteFile("1.sst", "shared/op/a-1.sst", 3, True, checksum=SUM)
    store.put(good.key, b"sst")
    coord.complete(make_meta(coord.new_checkpoint_id(), [good]))
    coord.subsume()
    # The driver crashes after tasks uploaded files for checkpoint 2 but before its metadata.
    store.put("shared/op/b-2.sst", b"sst")
    store.put("chk-0000000002/op/0/MANIFEST", b"m")
    again = CheckpointCoordinator(store, 2)
    report = again.recover()
    assert report.restored is not None and report.restored.checkpoint_id == 1
    assert report.deleted_files == 2
    assert {k for k, _ in store.listing()} == {good.key, metadata_key(1)}
    assert again.new_checkpoint_id() == 3, "ids of failed checkpoints are never reused"


def test_corrupt_or_incomplete_latest_falls_back_and_is_kept(tmp_path: Path) -> None:
    store = FileStore(f"file://{tmp_path}")
    coord = CheckpointCoordinator(store, 3)
    for cid in (1, 2, 3):
        f = RemoteFile(f"{cid}.sst", f"shared/op/{cid}.sst", 3, True, checksum=SUM)
        store.put(f.key, b"sst")
        coord.complete(make_meta(coord.new_checkpoint_id(), [f]))
        coord.subsume()
    store.put(metadata_key(3), b"{not json")
    store.delete(["shared/op/2.sst"])  # checkpoint 2 lost a file
    again = CheckpointCoordinator(store, 3)
    report = again.recover()
    assert report.restored is not None and report.restored.checkpoint_id == 1
    assert any("checkpoint 3" in s and "corrupt" in s for s in report.skipped)
    assert any("checkpoint 2" in s and "missing" in s for s in report.skipped)
    # Nothing of the unusable checkpoints is deleted: they stay for inspection.
    assert store.exists(metadata_key(3)) and store.exists(metadata_key(2))
    assert store.exists("shared/op/3.sst")


def test_metadata_round_trip() -> None:
    meta = make_meta(7, [RemoteFile("1.sst", "shared/op/1.sst", 10, True, checksum=SUM)])
    again = CheckpointMetadata.from_json(meta.to_json())
    assert again == meta
    assert json.loads(meta.to_json())["format_version"] == 3  # the one version


def test_registry_release_returns_only_unreferenced() -> None:
    reg = SharedStateRegistry()
    reg.register(1, ["a", "b"])
    reg.register(2, ["b", "c"])
    assert reg.release(1) == ["a"]
    assert reg.release(2) == ["b", "c"]
    assert reg.keys() == set()


def test_metadata_is_written_as_the_one_version_with_or_without_inline_files() -> None:
    from stator.checkpoint.metadata import FORMAT_VERSION

    stored = make_meta(7, [RemoteFile("1.sst", "shared/op/1.sst", 10, True, checksum=SUM)])
    inline = make_meta(7, [RemoteFile("CURRENT", "", 3, False, "YWJj")])
    for meta in (stored, inline):
        assert meta.format_version == FORMAT_VERSION == 3
        assert CheckpointMetadata.from_json(meta.to_json()) == meta


def test_a_metadata_object_the_store_fails_to_return_fails_the_recovery(tmp_path: Path) -> None:
    # Unlike a corrupt one, it is not skipped: the job would restore checkpoint 1 and replay
    # epochs whose output checkpoint 2 committed.
    class Flaky(FileStore):
        def get(self, key: str) -> bytes:
            if key == metadata_key(2):
                raise StorageError(f"cannot read {self.url(key)}: timed out")
            return super().get(key)

    store = FileStore(f"file://{tmp_path}")
    coord = CheckpointCoordinator(store, 2)
    for _ in range(2):
        coord.complete(make_meta(coord.new_checkpoint_id(), []))
        coord.subsume()
    with pytest.raises(StorageError, match="cannot read checkpoint 2's metadata, listed in"):
        CheckpointCoordinator(Flaky(f"file://{tmp_path}"), 2).recover()
    assert store.exists(metadata_key(1)) and store.exists(metadata_key(2))
