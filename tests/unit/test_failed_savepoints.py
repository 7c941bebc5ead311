"""A savepoint whose epoch fails leaves no files behind in a target that was empty before it
(a directory without metadata is not a savepoint: nothing lists it, nothing disposes of it),
and never deletes anything it did not write. The driver's savepoint flow with a fake job:
its epoch writes a part into the target and then fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from stator.config import SavepointConfig
from stator.driver.parallelism import Parallelism
from stator.driver.savepoints import (
    SavepointEpoch,
    SavepointRefused,
    SavepointRequest,
    take_savepoint,
)
from stator.epoch.spec import SavepointTask
from stator.errors import StatorError
from stator.storage import S3Options, open_store
from tests.unit.savepoints import write_savepoint


class FailingEpoch:
    """A job whose savepoint epoch writes its part, then fails (e.g. a task of another
    operator raised, or the checkpoint taken with it failed)."""

    job = "counts"
    parallelism = Parallelism(16, {"count": 1}, frozenset())

    def __init__(self, checkpoint_failed: bool) -> None:
        self.checkpoint_failed = checkpoint_failed

    def next_epoch(self) -> int:
        return 5

    def run_savepoint_epoch(self, task: SavepointTask) -> SavepointEpoch:
        task.store.put("count/kg-00000.bin", b"part")
        # Not the savepoint's: a checkpoint someone keeps under the target, written meanwhile.
        task.store.put("counts/chk-0000000001/_metadata", b"{}")
        if not self.checkpoint_failed:
            raise RuntimeError("a task of the savepoint epoch failed")
        return SavepointEpoch(5, [], {}, checkpoint_failed=True)


def files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("checkpoint_failed", [False, True])
def test_a_failed_savepoint_deletes_what_it_wrote_into_an_empty_target(
    tmp_path: Path, checkpoint_failed: bool
) -> None:
    target = f"file://{tmp_path}/sp/counts/mine"
    request = SavepointRequest(target, stop=False)
    with pytest.raises((StatorError, RuntimeError)):
        take_savepoint(
            request,
            FailingEpoch(checkpoint_failed),
            SavepointConfig(dir=f"file://{tmp_path}/sp"),
            S3Options(),
        )
    assert request.status == "FAILED" and request.error
    assert files(tmp_path / "sp") == ["counts/mine/counts/chk-0000000001/_metadata"]


def test_a_target_that_held_files_keeps_them_and_an_existing_savepoint_is_never_touched(
    tmp_path: Path,
) -> None:
    shared = f"file://{tmp_path}/sp/shared"
    open_store(shared).put("notes.txt", b"the user's")
    request = SavepointRequest(shared, stop=False)
    config = SavepointConfig(dir=f"file://{tmp_path}/sp")
    with pytest.raises(RuntimeError):
        take_savepoint(request, FailingEpoch(False), config, S3Options())
    # Not provably ours: what S wrote stays beside the user's file (documented).
    assert files(tmp_path / "sp" / "shared") == [
        "count/kg-00000.bin",
        "counts/chk-0000000001/_metadata",
        "notes.txt",
    ]

    taken = f"file://{tmp_path}/sp/taken"
    write_savepoint(taken)
    request = SavepointRequest(taken, stop=False)
    with pytest.raises(SavepointRefused):
        take_savepoint(request, FailingEpoch(False), config, S3Options())
    assert files(tmp_path / "sp" / "taken") == ["_savepoint.json"]


def test_a_savepoint_whose_metadata_landed_keeps_its_files(tmp_path: Path) -> None:
    # The metadata write reported a failure, but landed (its response was lost): the files
    # it names stay, or the savepoint lists as whole and cannot be restored.
    class MetadataLanded(FailingEpoch):
        def run_savepoint_epoch(self, task: SavepointTask) -> SavepointEpoch:
            task.store.put("count/kg-00000.bin", b"part")
            task.store.put("_savepoint.json", b"{}")
            raise RuntimeError("the metadata write timed out")

    target = f"file://{tmp_path}/sp/counts/mine"
    request = SavepointRequest(target, stop=False)
    with pytest.raises(RuntimeError):
        take_savepoint(
            request,
            MetadataLanded(False),
            SavepointConfig(dir=f"file://{tmp_path}/sp"),
            S3Options(),
        )
    assert files(tmp_path / "sp") == [
        "counts/mine/_savepoint.json",
        "counts/mine/count/kg-00000.bin",
    ]
