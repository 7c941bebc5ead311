"""The canonical, versioned format of one key-group's state in a savepoint.

Independent of RocksDB's files and of Stator's internal byte layout: entries name their state
by its index in the operator's sorted state names, carry the user key in Stator's stable key
encoding (``keygroups.encode_key``) and the value exactly as the state's serializer wrote it.
A savepoint therefore survives RocksDB option changes and state-id renumbering.

    file      := MAGIC VERSION:u8 COMPRESSION:u8 body        (body zlib-compressed or raw)
    body      := entry*
    entry     := 0x00 state:u16 key:bytes user_key:bytes value:bytes     (state entry)
               | 0x01 domain:u8 timestamp:i64 key:bytes                  (timer)
    bytes     := length:u32 data
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterable
from typing import NamedTuple, TypeVar

MAGIC = b"STKG"
VERSION = 1
COMPRESSIONS = {"none": 0, "zlib": 1}
_HEAD = struct.Struct(">4sBB")
_STATE = struct.Struct(">BHI")  # tag, state index, key length
_LEN = struct.Struct(">I")
_TIMER = struct.Struct(">BBqI")  # tag, domain, timestamp, key length
STATE_ENTRY, TIMER_ENTRY = 0, 1
T = TypeVar("T")


class StateEntry(NamedTuple):  # named tuples: a savepoint moves millions of these
    state: int
    key: bytes
    user_key: bytes
    value: bytes


class TimerEntry(NamedTuple):
    domain: int
    timestamp: int
    key: bytes


STATE_HEAD, LENGTH = _STATE, _LEN


def encode_state(state: int, key: bytes, user_key: bytes, value: bytes) -> bytes:
    return b"".join(
        (
            _STATE.pack(STATE_ENTRY, state, len(key)),
            key,
            _LEN.pack(len(user_key)),
            user_key,
            _LEN.pack(len(value)),
            value,
        )
    )


class KeyGroupWriter:
    """Accumulates one key-group's entries and produces the file's bytes."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.entries = 0

    def state(self, state: int, key: bytes, user_key: bytes, value: bytes) -> None:
        self.parts.append(encode_state(state, key, user_key, value))
        self.entries += 1

    def encoded(self, entries: list[bytes]) -> None:
        """Entries already encoded (by ``encode_state`` or an inlined copy of it)."""
        self.parts += entries
        self.entries += len(entries)

    def timer(self, domain: int, timestamp: int, key: bytes) -> None:
        self.parts += (_TIMER.pack(TIMER_ENTRY, domain, timestamp, len(key)), key)
        self.entries += 1

    def finish(self, compression: str = "zlib") -> bytes:
        """The file's bytes. With zlib, a key-group whose data does not compress (by a
        sample of its start, then as a whole: less than 1/8 saved, RocksDB's rule) is stored
        raw, its header saying so: zlib costs a core about 15 s per GB of random bytes and
        saves nothing there (it runs at ~400 MB/s on data that compresses)."""
        if compression not in COMPRESSIONS:
            raise ValueError(f"savepoint compression must be one of {sorted(COMPRESSIONS)}")
        if compression == "zlib" and compresses(leading_bytes(self.parts, COMPRESSION_SAMPLE)):
            body = b"".join(self.parts)
            packed = zlib.compress(body, 1)
            if _worth_it(len(packed), len(body)):
                return _HEAD.pack(MAGIC, VERSION, COMPRESSIONS["zlib"]) + packed
        # One join with the header: the file is copied once, not twice.
        return b"".join((_HEAD.pack(MAGIC, VERSION, COMPRESSIONS["none"]), *self.parts))


COMPRESSION_SAMPLE = 64 * 1024


def leading_bytes(parts: Iterable[bytes], size: int) -> bytes:
    """The first ``size`` bytes of ``parts`` joined, without joining the rest (a sample)."""
    taken: list[bytes] = []
    have = 0
    for part in parts:
        taken.append(part)
        have += len(part)
        if have >= size:
            break
    return b"".join(taken)[:size]


def compresses(sample: bytes) -> bool:
    """Whether ``sample`` is worth compressing (zlib at its fastest level saves 1/8): if it
    does not, no faster codec (lz4, snappy) will."""
    if not sample:
        return True
    return _worth_it(len(zlib.compress(sample, 1)), len(sample))


def _worth_it(packed: int, raw: int) -> bool:
    return packed < raw - raw // 8


class FormatError(ValueError):
    """A key-group file is not in a format this version can read."""


def _body(data: bytes, where: str) -> bytes:
    if len(data) < _HEAD.size:
        raise FormatError(f"{where}: truncated key-group file ({len(data)} bytes)")
    magic, version, compression = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise FormatError(f"{where}: not a Stator key-group file")
    if version != VERSION:
        raise FormatError(
            f"{where}: format version {version}, this Stator reads version {VERSION} only: "
            f"restore the savepoint with the Stator version that wrote it"
        )
    body = data[_HEAD.size :]
    if compression == COMPRESSIONS["zlib"]:
        try:
            return zlib.decompress(body)
        except zlib.error as exc:
            raise FormatError(f"{where}: corrupt compressed data: {exc}") from exc
    if compression != COMPRESSIONS["none"]:
        raise FormatError(f"{where}: unknown compression {compression}")
    return body


def read_key_group(data: bytes, where: str = "") -> list[StateEntry | TimerEntry]:
    return decode_key_group(data, where, StateEntry, TimerEntry)


def decode_key_group(
    data: bytes,
    where: str,
    state: Callable[[int, bytes, bytes, bytes], T],
    timer: Callable[[int, int, bytes], T],
) -> list[T]:
    """Every entry of a key-group file, made by ``state(state, key, user_key, value)`` or
    ``timer(domain, timestamp, key)``: a restore makes its database rows here, once per entry,
    without an entry object in between. The whole file is checked before anything is
    returned: a truncated or corrupt file gives an error naming ``where``, never some entries."""
    body = _body(data, where)
    out: list[T] = []
    append = out.append
    pos, end = 0, len(body)
    state_head, timer_head, length = _STATE.unpack_from, _TIMER.unpack_from, _LEN.unpack_from
    state_size, timer_size = _STATE.size, _TIMER.size
    try:
        while pos < end:
            tag = body[pos]
            if tag == STATE_ENTRY:
                _, index, n = state_head(body, pos)
                key_at = pos + state_size
                user_at = key_at + n + 4
                value_at = user_at + length(body, key_at + n)[0] + 4
                stop = value_at + length(body, value_at - 4)[0]
                if stop > end:
                    break
                append(
                    state(
                        index,
                        body[key_at : key_at + n],
                        body[user_at : value_at - 4],
                        body[value_at:stop],
                    )
                )
                pos = stop
            elif tag == TIMER_ENTRY:
                _, domain, ts, n = timer_head(body, pos)
                stop = pos + timer_size + n
                if stop > end:
                    break
                append(timer(domain, ts, body[stop - n : stop]))
                pos = stop
            else:
                raise FormatError(f"{where}: unknown entry tag {tag} at byte {pos}")
    except struct.error as exc:
        raise FormatError(f"{where}: truncated entry at byte {pos}") from exc
    if pos != end:
        raise FormatError(f"{where}: truncated entry at byte {pos}")
    return out
