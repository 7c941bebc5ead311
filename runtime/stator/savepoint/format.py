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
from collections.abc import Iterator
from dataclasses import dataclass

MAGIC = b"STKG"
VERSION = 1
COMPRESSIONS = {"none": 0, "zlib": 1}
_HEAD = struct.Struct(">4sBB")
_STATE = struct.Struct(">BHI")  # tag, state index, key length
_LEN = struct.Struct(">I")
_TIMER = struct.Struct(">BBqI")  # tag, domain, timestamp, key length
STATE_ENTRY, TIMER_ENTRY = 0, 1


@dataclass(frozen=True)
class StateEntry:
    state: int
    key: bytes
    user_key: bytes
    value: bytes


@dataclass(frozen=True)
class TimerEntry:
    domain: int
    timestamp: int
    key: bytes


class KeyGroupWriter:
    """Accumulates one key-group's entries and produces the file's bytes."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.entries = 0

    def state(self, state: int, key: bytes, user_key: bytes, value: bytes) -> None:
        self.parts += (
            _STATE.pack(STATE_ENTRY, state, len(key)),
            key,
            _LEN.pack(len(user_key)),
            user_key,
            _LEN.pack(len(value)),
            value,
        )
        self.entries += 1

    def timer(self, domain: int, timestamp: int, key: bytes) -> None:
        self.parts += (_TIMER.pack(TIMER_ENTRY, domain, timestamp, len(key)), key)
        self.entries += 1

    def finish(self, compression: str = "zlib") -> bytes:
        if compression not in COMPRESSIONS:
            raise ValueError(f"savepoint compression must be one of {sorted(COMPRESSIONS)}")
        body = b"".join(self.parts)
        if compression == "zlib":
            body = zlib.compress(body, 1)
        return _HEAD.pack(MAGIC, VERSION, COMPRESSIONS[compression]) + body


class FormatError(ValueError):
    """A key-group file is not in a format this version can read."""


def read_key_group(data: bytes, where: str = "") -> Iterator[StateEntry | TimerEntry]:
    if len(data) < _HEAD.size:
        raise FormatError(f"{where}: truncated key-group file ({len(data)} bytes)")
    magic, version, compression = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise FormatError(f"{where}: not a Stator key-group file")
    if version > VERSION:
        raise FormatError(f"{where}: format version {version} is newer than Stator's {VERSION}")
    body = data[_HEAD.size :]
    if compression == COMPRESSIONS["zlib"]:
        try:
            body = zlib.decompress(body)
        except zlib.error as exc:
            raise FormatError(f"{where}: corrupt compressed data: {exc}") from exc
    elif compression != COMPRESSIONS["none"]:
        raise FormatError(f"{where}: unknown compression {compression}")
    pos, end = 0, len(body)
    try:
        while pos < end:
            tag = body[pos]
            if tag == STATE_ENTRY:
                _, state, n = _STATE.unpack_from(body, pos)
                pos += _STATE.size
                key = body[pos : pos + n]
                pos += n
                (n,) = _LEN.unpack_from(body, pos)
                user_key = body[pos + 4 : pos + 4 + n]
                pos += 4 + n
                (n,) = _LEN.unpack_from(body, pos)
                value = body[pos + 4 : pos + 4 + n]
                pos += 4 + n
                yield StateEntry(state, key, user_key, value)
            elif tag == TIMER_ENTRY:
                _, domain, ts, n = _TIMER.unpack_from(body, pos)
                pos += _TIMER.size
                yield TimerEntry(domain, ts, body[pos : pos + n])
                pos += n
            else:
                raise FormatError(f"{where}: unknown entry tag {tag} at byte {pos}")
    except struct.error as exc:
        raise FormatError(f"{where}: truncated entry at byte {pos}") from exc
    if pos != end:
        raise FormatError(f"{where}: truncated entry at byte {pos}")
