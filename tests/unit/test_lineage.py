"""Savepoints and checkpoints in storage (``stator.lineage``), on ``file://``: one layout for
the driver, the command line and the operator."""

from __future__ import annotations

from pathlib import Path

import pytest

from stator.checkpoint.metadata import CheckpointMetadata
from stator.errors import StatorError
from stator.lineage import (
    check_restorable,
    default_savepoint_root,
    dispose_savepoint,
    find_savepoint,
    list_checkpoints,
    list_savepoints,
    load_savepoint,
    savepoint_location,
)
from stator.storage import open_store
from tests.unit.savepoints import write_savepoint


def test_default_locations() -> None:
    assert default_savepoint_root("s3://b/ck/") == "s3://b/ck/savepoints"
    assert (
        savepoint_location("s3://b/sp/", "team.counts", 42, "abc")
        == "s3://b/sp/team.counts/savepoint-0000000042-abc"
    )


def test_list_find_and_dispose_savepoints(tmp_path: Path) -> None:
    root = f"file://{tmp_path}/sp"
    first = savepoint_location(root, "team.counts", 3, "r1")
    second = savepoint_location(root, "team.counts", 9, "r2")
    write_savepoint(second, epoch=9)
    write_savepoint(first, epoch=3)
    open_store(first).put("counts/kg-00001.sst", b"data")
    open_store(f"{root}/broken").put("_savepoint.json", b"{not json")

    entries = list_savepoints(root)
    assert [e.location for e in entries] == [f"{root}/broken", first, second]
    assert entries[0].metadata is None and "unusable" in (entries[0].error or "")
    assert [e.metadata.epoch for e in entries[1:] if e.metadata] == [3, 9]
    assert load_savepoint(first).epoch == 3

    assert find_savepoint(root, "r2") == second
    assert find_savepoint(root, "r3") is None

    with pytest.raises(StatorError, match="is not a savepoint"):
        dispose_savepoint(f"file://{tmp_path}")
    assert dispose_savepoint(first) == 2
    gone = tmp_path / "sp" / "team.counts" / "savepoint-0000000003-r1"
    assert not any(p.is_file() for p in gone.rglob("*"))
    assert [e.location for e in list_savepoints(root)] == [f"{root}/broken", second]


def test_list_checkpoints_tells_complete_incomplete_and_corrupt(tmp_path: Path) -> None:
    root = f"file://{tmp_path}/ck/team.counts"
    store = open_store(root)
    meta = CheckpointMetadata(2, 5, "team.counts", 1_700_000_000_000, 128, True, {}, {}, {}, 0)
    store.put("chk-0000000002/_metadata", meta.to_json())
    store.put("chk-0000000003/counts/0/MANIFEST", b"x")
    store.put("chk-0000000004/_metadata", b"{}")
    store.put("shared/counts/a.sst", b"x")
    entries = list_checkpoints(root)
    assert [(e.id, e.metadata is not None) for e in entries] == [(2, True), (3, False), (4, False)]
    assert entries[0].metadata is not None and entries[0].metadata.epoch == 5
    assert entries[1].problem == "incomplete (no _metadata)"
    assert (entries[2].problem or "").startswith("corrupt: ")


def test_check_restorable(tmp_path: Path) -> None:
    location = f"file://{tmp_path}/sp/one"
    write_savepoint(location)
    check_restorable(location)
    with pytest.raises(StatorError, match="neither a savepoint"):
        check_restorable(f"file://{tmp_path}/nothing")


def test_dispose_refuses_a_root_that_also_holds_other_savepoints_or_checkpoints(
    tmp_path: Path,
) -> None:
    """A savepoint written at a root (``any_target``) must not take the root's other
    savepoints and checkpoints with it when disposed of."""
    root = f"file://{tmp_path}/data"
    write_savepoint(root, epoch=1)
    other = savepoint_location(root, "team.counts", 3, "r1")
    write_savepoint(other, epoch=3)
    meta = CheckpointMetadata(2, 5, "team.counts", 1_700_000_000_000, 128, True, {}, {}, {}, 0)
    open_store(root).put("chk-0000000002/_metadata", meta.to_json())
    before = sorted(p for p in (tmp_path / "data").rglob("*") if p.is_file())
    with pytest.raises(StatorError, match="also holds other savepoints or checkpoints"):
        dispose_savepoint(root)
    assert sorted(p for p in (tmp_path / "data").rglob("*") if p.is_file()) == before
    write_savepoint(f"{root}/only", epoch=4)
    open_store(f"{root}/only").put("chk-5/kg-00001.bin", b"an operator named chk-5")
    assert dispose_savepoint(f"{root}/only") >= 2
