"""A checksum per checkpoint file (issue 38): a file changed after it was written (same name,
same size: what a size check misses) fails the restore when downloaded, and a changed local
copy is downloaded again instead of used."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stator.checkpoint.checksums import file_checksum
from stator.checkpoint.metadata import CheckpointMetadata
from stator.checkpoint.transfer import TruncatedFile, download_snapshot, plan_upload, send_files
from stator.errors import CheckpointNotFoundError
from stator.storage import FileStore
from tests.unit.checkpoint_fixtures import FILES, make_meta, snapshot_dir


def uploaded(tmp_path: Path) -> tuple[FileStore, tuple]:
    store = FileStore(f"file://{tmp_path}/ck")
    local, files = snapshot_dir(tmp_path)
    plan = plan_upload(1, "count", 0, local, files, {}, True, inline_max=20_480)
    send_files(store, local, plan.todo)
    return store, plan.files


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_every_stored_file_has_the_checksum_of_its_bytes(tmp_path: Path) -> None:
    _, files = uploaded(tmp_path)
    stored = [f for f in files if f.stored]
    assert stored and all(f.checksum == file_checksum(tmp_path / "chk-1" / f.name) for f in stored)
    assert all(f.checksum.startswith("xxh3:") and len(f.checksum) == 21 for f in stored)
    assert len({f.checksum for f in stored}) == len(stored)
    assert all(not f.checksum for f in files if not f.stored), "inline bytes are the metadata's"


def test_a_changed_object_of_the_same_size_fails_the_restore(tmp_path: Path) -> None:
    store, files = uploaded(tmp_path)
    sst = next(f for f in files if f.name == "000007.sst")
    flip_a_byte(tmp_path / "ck" / sst.key)
    with pytest.raises(TruncatedFile, match="does not have the checksum"):
        download_snapshot(store, files, tmp_path / "restored")
    assert not (tmp_path / "restored").exists(), "nothing half-restored is left"


def test_a_changed_local_copy_is_downloaded_instead(tmp_path: Path) -> None:
    store, files = uploaded(tmp_path)
    sst = next(f for f in files if f.name == "000007.sst")
    copy = tmp_path / "copy.sst"
    copy.write_bytes(FILES["000007.sst"])
    flip_a_byte(copy)
    read = download_snapshot(store, files, tmp_path / "restored", reuse={sst.key: copy})
    assert (tmp_path / "restored" / "000007.sst").read_bytes() == FILES["000007.sst"]
    assert read == sum(len(d) for d in FILES.values()), "the copy was not used"
    intact = tmp_path / "intact.sst"
    intact.write_bytes(FILES["000007.sst"])
    read = download_snapshot(store, files, tmp_path / "again", reuse={sst.key: intact})
    assert read == sum(len(d) for d in FILES.values()) - len(FILES["000007.sst"]), "linked"


def test_checksums_survive_the_metadata_and_a_malformed_one_is_refused(tmp_path: Path) -> None:
    _, files = uploaded(tmp_path)
    meta = make_meta(1, list(files))
    again = CheckpointMetadata.from_json(meta.to_json())
    assert [f.checksum for f in again.files()] == [f.checksum for f in meta.files()]
    raw = json.loads(meta.to_json())
    snap = raw["operators"]["op"]["subtasks"][0]
    stored = next(f for f in snap["files"] if f["key"])
    stored["checksum"] = "md5:abc"
    with pytest.raises(CheckpointNotFoundError, match="checksum"):
        CheckpointMetadata.from_json(json.dumps(raw).encode(), "chk-1/_metadata")
    stored["checksum"] = ""  # a stored file's checksum is required
    with pytest.raises(CheckpointNotFoundError, match="checksum '' is not an xxh3"):
        CheckpointMetadata.from_json(json.dumps(raw).encode(), "chk-1/_metadata")
