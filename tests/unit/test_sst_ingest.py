"""Restored state ingested as SST files: any arrival order gives the same database."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import rocksdict

from stator.savepoint.ingest import SstIngest
from stator.state.options import RocksDBOptions


def _ingest(path: Path, rows: list[tuple[int, bytes, bytes]]) -> dict[bytes, bytes]:
    options = RocksDBOptions()
    db = rocksdict.Rdict(str(path / "db"), options.build())
    try:
        ingest = SstIngest(db, options, path / ".ingest")
        for kg, key, value in rows:
            ingest.add(kg, [(key, value)])
        ingest.finish()
        assert not (path / ".ingest").exists(), "the staged files are moved or removed"
        return {bytes(k): bytes(v) for k, v in db.items()}  # type: ignore[arg-type]
    finally:
        db.close()


def test_unsorted_key_groups_and_keys_give_the_same_database(tmp_path: Path) -> None:
    rows = [
        (kg, kg.to_bytes(2, "big") + f"key-{i:04d}".encode(), f"v{kg}-{i}".encode())
        for kg in range(20)
        for i in range(50)
    ]
    expected = {key: value for _, key, value in rows}
    in_order = _ingest(tmp_path / "a", rows)
    shuffled_within = sorted(rows, key=lambda r: (r[0], random.Random(r[1]).random()))
    by_group: dict[int, list[tuple[int, bytes, bytes]]] = {}
    for row in rows:
        by_group.setdefault(row[0], []).append(row)
    groups_backwards = [row for kg in reversed(range(20)) for row in by_group[kg]]
    assert in_order == expected
    assert _ingest(tmp_path / "b", shuffled_within) == expected
    assert _ingest(tmp_path / "c", groups_backwards) == expected


def test_nothing_to_ingest(tmp_path: Path) -> None:
    assert _ingest(tmp_path, []) == {}


def test_a_restore_that_fails_part_way_leaves_nothing_staged(tmp_path: Path) -> None:
    from stator.keygroups import KeyGroupRange
    from stator.savepoint.transfer import import_rows
    from stator.state.backend import KeyedBackend

    def entries() -> Any:
        yield 1, [(b"\x00\x01\x00\x01k\x00", b"v")]
        raise OSError("connection reset while reading kg-00002.bin")

    backend = KeyedBackend(tmp_path / "db", RocksDBOptions(), KeyGroupRange(0, 4), 4, "op").open()
    try:
        with pytest.raises(OSError, match="kg-00002"):
            import_rows(backend, {"count": {"kind": "value"}}, entries())
        assert not (tmp_path / ".ingest-db").exists()
        assert backend.db is not None
        state = [k for k, _ in backend.db.items() if bytes(k)[:2] != b"\xff\xff"]  # type: ignore[arg-type]
        assert state == [], "nothing reached the database"
    finally:
        backend.close()


@pytest.mark.parametrize(
    ("value", "written"),
    [(lambda i: random.Random(i).randbytes(1000), "none"), (lambda i: b"abc" * 300, "lz4")],
    ids=["random", "repetitive"],
)
def test_rows_that_do_not_compress_are_written_raw(
    tmp_path: Path, value: Any, written: str
) -> None:
    options = RocksDBOptions(compression="lz4")
    rows = {(7).to_bytes(2, "big") + f"key-{i:05d}".encode(): value(i) for i in range(200)}
    db = rocksdict.Rdict(str(tmp_path / "db"), options.build())
    try:
        ingest = SstIngest(db, options, tmp_path / ".ingest")
        ingest.add(7, list(rows.items()))
        ingest.finish()
        assert ingest.compression == written
        assert {bytes(k): bytes(v) for k, v in db.items()} == rows  # type: ignore[arg-type]
    finally:
        db.close()
