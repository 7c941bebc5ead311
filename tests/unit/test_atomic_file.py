"""A file written atomically is the whole new content or the old one, and a failed write
leaves nothing beside it (``stator/atomic_file.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stator.atomic_file import staged_file, write_atomically


def test_a_write_replaces_the_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    write_atomically(path, b"old")
    write_atomically(path, b"new ", b"content")
    assert path.read_bytes() == b"new content"
    assert [p.name for p in tmp_path.iterdir()] == ["keys.json"]


def test_a_failed_write_keeps_the_old_file_and_leaves_nothing_staged(tmp_path: Path) -> None:
    path = tmp_path / "tally.json"
    write_atomically(path, b"old")
    with pytest.raises(OSError, match="disk full"), staged_file(path) as staged:
        staged.write_bytes(b"half of it")
        raise OSError("disk full")
    with pytest.raises(TypeError):
        write_atomically(path, b"half of it", "not bytes")  # type: ignore[arg-type]
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["tally.json"]
