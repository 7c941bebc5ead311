"""Byte layout of keyed state in RocksDB. Every user key starts with its key-group, so a
key-group range is one contiguous key range: scanned, exported and deleted as a range.

    value/list/reducing  kg:2 | sid:1 | len(key):2 | key
    map entry            kg:2 | sid:1 | len(key):2 | key | user-key
    timer                kg:2 | 0xFE  | domain:1   | ts:8 (offset) | key
    metadata             0xFFFF | name
"""

from __future__ import annotations

import struct

KG = struct.Struct(">H")
KEYLEN = struct.Struct(">H")
TS = struct.Struct(">Q")
TIMER_SID = 0xFE
MAX_STATE_ID = 0xFD
META_PREFIX = b"\xff\xff"
META_EPOCH = META_PREFIX + b"epoch"
META_WATERMARK = META_PREFIX + b"watermark"
META_STATES = META_PREFIX + b"states"
META_INFO = META_PREFIX + b"info"
EVENT_TIME, PROCESSING_TIME = 0, 1
_TS_OFFSET = 1 << 63
MAX_KEY_BYTES = 0xFFFF


def key_suffix(key_bytes: bytes) -> bytes:
    """``len(key) | key``: what follows the key-group and state id for one key."""
    if len(key_bytes) > MAX_KEY_BYTES:
        raise ValueError(f"a key may encode to at most {MAX_KEY_BYTES} bytes, got {len(key_bytes)}")
    return KEYLEN.pack(len(key_bytes)) + key_bytes


def state_prefix(kg: int, sid: int) -> bytes:
    return KG.pack(kg) + bytes((sid,))


def key_group_prefix(kg: int) -> bytes:
    return KG.pack(kg)


def key_group_of(db_key: bytes) -> int:
    return int(KG.unpack_from(db_key)[0])


def split_entry(db_key: bytes) -> tuple[int, int, bytes, bytes]:
    """(key-group, state id, key bytes, user-key bytes) of a state entry."""
    kg = KG.unpack_from(db_key)[0]
    sid = db_key[2]
    (n,) = KEYLEN.unpack_from(db_key, 3)
    return kg, sid, db_key[5 : 5 + n], db_key[5 + n :]


def timer_prefix(kg: int, domain: int) -> bytes:
    return KG.pack(kg) + bytes((TIMER_SID, domain))


def timer_key(kg: int, domain: int, ts: int, key_bytes: bytes) -> bytes:
    return timer_prefix(kg, domain) + TS.pack(ts + _TS_OFFSET) + key_bytes


def split_timer(db_key: bytes) -> tuple[int, int, int, bytes]:
    """(key-group, domain, timestamp, key bytes) of a timer entry."""
    kg = KG.unpack_from(db_key)[0]
    return kg, db_key[3], TS.unpack_from(db_key, 4)[0] - _TS_OFFSET, db_key[12:]


def timer_bound(kg: int, domain: int, ts_inclusive: int) -> bytes:
    """Smallest key strictly after every timer of (kg, domain) with timestamp <= ts."""
    if ts_inclusive + _TS_OFFSET + 1 > 0xFFFFFFFFFFFFFFFF:
        return prefix_end(timer_prefix(kg, domain))
    return timer_prefix(kg, domain) + TS.pack(ts_inclusive + _TS_OFFSET + 1)


def prefix_end(prefix: bytes) -> bytes:
    """The smallest byte string greater than every string that starts with ``prefix``."""
    data = bytearray(prefix)
    while data:
        if data[-1] < 0xFF:
            data[-1] += 1
            return bytes(data)
        data.pop()
    raise ValueError("no upper bound for an all-0xFF prefix")
