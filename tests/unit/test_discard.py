"""Directories a task replaces or drops are deleted in the background (``state/discard.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stator.state.discard import MARK, discard, replace_dir, sweep


def _tree(root: Path, files: int = 3) -> Path:
    root.mkdir(parents=True)
    for i in range(files):
        (root / f"{i:06d}.sst").write_bytes(b"x" * 1000)
    return root


def test_a_replaced_directory_is_swapped_at_once_and_the_old_one_deleted_after(
    tmp_path: Path,
) -> None:
    old = _tree(tmp_path / "db")
    (old / "OLD").write_text("old")
    new = _tree(tmp_path / ".db.restoring-1")
    (new / "NEW").write_text("new")
    thread = replace_dir(new, tmp_path / "db")
    assert (tmp_path / "db" / "NEW").read_text() == "new"
    assert not (tmp_path / "db" / "OLD").exists()
    assert not new.exists()
    assert thread is not None
    thread.join(10)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["db"]  # nothing left aside


def test_replacing_where_nothing_was_needs_no_thread(tmp_path: Path) -> None:
    new = _tree(tmp_path / ".db.restoring-1")
    assert replace_dir(new, tmp_path / "db") is None
    assert len(list((tmp_path / "db").iterdir())) == 3


def test_a_discarded_directory_leaves_its_name_free_at_once(tmp_path: Path) -> None:
    copy = _tree(tmp_path / "chk-4")
    thread = discard(copy)
    assert not copy.exists()  # renamed aside before the call returned
    _tree(tmp_path / "chk-4")  # the name can be used again at once
    assert thread is not None
    thread.join(10)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chk-4"]
    assert discard(tmp_path / "missing") is None


def test_what_a_dead_process_left_aside_is_swept(tmp_path: Path) -> None:
    left = _tree(tmp_path / f".db{MARK}deadbeef")
    kept = _tree(tmp_path / "db")
    threads = sweep(tmp_path)
    for t in threads:
        t.join(10)
    assert len(threads) == 1
    assert not left.exists()
    assert kept.is_dir() and len(list(kept.iterdir())) == 3
    assert sweep(tmp_path / "missing") == []


def test_a_directory_another_process_discarded_first_is_left_to_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = _tree(tmp_path / "chk-4")

    def gone(self: Path, target: Path) -> Path:
        raise FileNotFoundError(self)

    monkeypatch.setattr(Path, "rename", gone)
    assert discard(copy) is None  # no error: the other process deletes it


def test_a_directory_that_cannot_be_renamed_is_deleted_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = _tree(tmp_path / "chk-4")

    def refused(self: Path, target: Path) -> Path:
        raise PermissionError(self)

    monkeypatch.setattr(Path, "rename", refused)
    assert discard(copy) is None
    assert not copy.exists()
