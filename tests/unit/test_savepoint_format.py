"""The canonical key-group file: round trips, and every truncation or corruption is an error
that names the file, never a silently shortened key-group."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stator.keygroups import KeyGroupRange
from stator.savepoint.format import (
    FormatError,
    KeyGroupWriter,
    StateEntry,
    TimerEntry,
    read_key_group,
)
from stator.savepoint.transfer import savepoint_rows
from stator.state.layout import HEADER, timer_key
from stator.storage import open_store

ENTRIES: list[StateEntry | TimerEntry] = [
    StateEntry(0, b"k1", b"", b"v" * 300),
    StateEntry(2, b"k1", b"map-key", b""),
    TimerEntry(1, -5, b"k1"),
    StateEntry(1, b"", b"", b"x"),
    TimerEntry(0, 2**62, b"k" * 70),
]


def encode(compression: str) -> bytes:
    writer = KeyGroupWriter()
    for entry in ENTRIES:
        if isinstance(entry, StateEntry):
            writer.state(*entry)
        else:
            writer.timer(*entry)
    assert writer.entries == len(ENTRIES)
    return writer.finish(compression)


@pytest.mark.parametrize("compression", ["none", "zlib"])
def test_round_trip(compression: str) -> None:
    assert list(read_key_group(encode(compression), "kg-1")) == ENTRIES


def _boundaries() -> set[int]:
    """Where whole entries end in the uncompressed file."""
    out = set()
    for n in range(len(ENTRIES) + 1):
        writer = KeyGroupWriter()
        for entry in ENTRIES[:n]:
            (writer.state if isinstance(entry, StateEntry) else writer.timer)(*entry)  # type: ignore[operator]
        out.add(len(writer.finish("none")))
    return out


def test_a_truncated_entry_is_an_error_and_only_whole_entries_are_read() -> None:
    data, boundaries = encode("none"), _boundaries()
    for cut in range(len(data)):
        seen: list[StateEntry | TimerEntry] = []
        if cut in boundaries:  # the format alone cannot tell: the metadata's byte count does
            seen.extend(read_key_group(data[:cut], "kg-7"))
        else:
            with pytest.raises(FormatError, match="kg-7"):
                seen.extend(read_key_group(data[:cut], "kg-7"))
        assert seen == ENTRIES[: len(seen)], cut


def test_restore_checks_each_file_against_the_metadata(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}")
    data = encode("zlib")
    store.put("op/kg-00003.bin", data[:-1])
    files = {3: {"file": "op/kg-00003.bin", "bytes": len(data), "entries": len(ENTRIES)}}
    with pytest.raises(FormatError, match=f"{len(data) - 1} bytes, the savepoint's metadata"):
        list(savepoint_rows(store, files, KeyGroupRange(0, 8)))
    store.put("op/kg-00003.bin", data)
    # Rows in the database's layout: key-group, key length, key, state id, user key.
    rows = [
        (HEADER.pack(3, len(e.key)) + e.key + bytes((e.state,)) + e.user_key, e.value)
        if isinstance(e, StateEntry)
        else (timer_key(HEADER.pack(3, len(e.key)) + e.key, e.domain, e.timestamp), b"")
        for e in ENTRIES
    ]
    assert list(savepoint_rows(store, files, KeyGroupRange(0, 8))) == [(3, rows)]
    assert list(savepoint_rows(store, files, KeyGroupRange(4, 8))) == []


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"NOPE\x01\x00", "not a Stator key-group file"),
        (b"STKG\x09\x00", "format version 9, this Stator reads version 1 only: restore"),
        (b"STKG\x00\x00", "format version 0, this Stator reads version 1 only: restore"),
        (b"STKG\x01\x07", "unknown compression 7"),
        (b"STKG\x01\x01garbage", "corrupt compressed data"),
        (b"STKG\x01\x00\x05", "unknown entry tag 5"),
    ],
)
def test_corrupt_files_are_named(data: bytes, message: str) -> None:
    with pytest.raises(FormatError, match=message):
        list(read_key_group(data, "s3://b/sp/kg-3.bin"))


def test_unknown_compression_is_refused_when_writing() -> None:
    with pytest.raises(ValueError, match="savepoint compression must be one of"):
        KeyGroupWriter().finish("lz4")


def test_zlib_stores_data_that_does_not_compress_raw() -> None:
    random_value, repeated_value = os.urandom(200_000), b"count=1;" * 25_000
    for value, stored in ((random_value, 0), (repeated_value, 1)):  # header: 0 raw, 1 zlib
        writer = KeyGroupWriter()
        writer.state(0, b"k", b"", value)
        data = writer.finish("zlib")
        assert data[5] == stored
        assert list(read_key_group(data, "kg-0")) == [StateEntry(0, b"k", b"", value)]
    writer = KeyGroupWriter()
    writer.state(0, b"k", b"", repeated_value)
    assert writer.finish("none")[5] == 0, "none is never compressed"
