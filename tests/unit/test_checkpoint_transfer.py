"""Planning a subtask's upload and materializing it again: small files go into the metadata
(``checkpoint.inline_max_bytes``), the rest are objects, shared SSTs already stored are
re-referenced, and a restore writes both kinds back byte for byte."""

from __future__ import annotations

from pathlib import Path

from stator.checkpoint.transfer import download_snapshot, plan_upload, send_files
from stator.state.backend import LocalFile
from stator.storage import FileStore
from tests.unit.checkpoint_fixtures import FILES, snapshot_dir


def test_small_files_go_into_the_metadata_and_restore_byte_for_byte(tmp_path: Path) -> None:
    store = FileStore(f"file://{tmp_path}/ck")
    local, files = snapshot_dir(tmp_path)
    plan = plan_upload(1, "count", 0, local, files, {}, True, inline_max=20_480)
    by_name = {f.name: f for f in plan.files}
    assert sorted(n for n, _ in plan.todo) == ["000007.sst", "000008.sst"]  # the SSTs
    assert all(by_name[n].shared and by_name[n].stored for n in ("000007.sst", "000008.sst"))
    inline = [n for n, f in by_name.items() if not f.stored]
    assert sorted(inline) == ["CURRENT", "MANIFEST-000005"]
    assert not any(by_name[n].shared for n in inline)
    assert plan.bytes == sum(len(d) for d in FILES.values())
    send_files(store, local, plan.todo)
    assert sorted(k for k, _ in store.listing()) == sorted(k for _, k in plan.todo)
    read = download_snapshot(store, plan.files, tmp_path / "restored")
    assert read == sum(len(d) for d in FILES.values())
    assert {p.name: p.read_bytes() for p in (tmp_path / "restored").iterdir()} == FILES


def test_the_next_checkpoint_re_references_the_ssts_and_inlines_small_files_again(
    tmp_path: Path,
) -> None:
    local, files = snapshot_dir(tmp_path)
    first = plan_upload(1, "count", 0, local, files, {}, True, inline_max=20_480)
    previous = {f.name: f for f in first.files}
    second = plan_upload(2, "count", 0, local, files, previous, True, inline_max=20_480)
    assert second.todo == ()  # the SSTs are referenced, the rest is inline again
    again = {f.name: f for f in second.files}
    assert all(again[n] == previous[n] for n in ("000007.sst", "000008.sst"))
    assert second.bytes == len(FILES["CURRENT"]) + len(FILES["MANIFEST-000005"])


def test_a_full_checkpoint_inlines_small_ssts_too(tmp_path: Path) -> None:
    local, files = snapshot_dir(tmp_path)
    plan = plan_upload(1, "count", 0, local, files, {}, False, inline_max=20_480)
    assert [n for n, _ in plan.todo] == ["000007.sst"]
    assert sorted(f.name for f in plan.files if not f.stored) == [
        "000008.sst",
        "CURRENT",
        "MANIFEST-000005",
    ]


def test_inline_off_makes_every_file_an_object(tmp_path: Path) -> None:
    local, files = snapshot_dir(tmp_path)
    plan = plan_upload(1, "count", 0, local, files, {}, True, inline_max=0)
    assert sorted(n for n, _ in plan.todo) == sorted(FILES)
    assert all(f.stored for f in plan.files)


def test_a_full_checkpoints_private_files_are_never_re_referenced(tmp_path: Path) -> None:
    """A job that switches from full to incremental checkpoints: the full checkpoint's SSTs
    are private (deleted with its directory), so the first incremental one uploads its own
    shared copies instead of referencing them."""
    local, files = snapshot_dir(tmp_path)
    full = plan_upload(5, "count", 0, local, files, {}, False, inline_max=20_480)
    previous = {f.name: f for f in full.files}
    assert previous["000007.sst"].stored and not previous["000007.sst"].shared
    incremental = plan_upload(6, "count", 0, local, files, previous, True, inline_max=20_480)
    by_name = {f.name: f for f in incremental.files}
    assert sorted(n for n, _ in incremental.todo) == ["000007.sst", "000008.sst"]
    assert by_name["000007.sst"].shared and by_name["000007.sst"].key.startswith("shared/")


def test_inline_off_makes_even_an_empty_file_an_object(tmp_path: Path) -> None:
    local = tmp_path / "chk-1"
    local.mkdir()
    (local / "LOCK").write_bytes(b"")
    plan = plan_upload(1, "count", 0, local, [LocalFile("LOCK", 0, False)], {}, True, 0)
    assert [n for n, _ in plan.todo] == ["LOCK"] and plan.files[0].stored
