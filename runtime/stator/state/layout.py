"""Byte layout of keyed state in RocksDB. Every user key starts with its key-group, so a
key-group range is one contiguous key range: scanned, exported and deleted as a range.

    keyed key (kkey)     kg:2 | len(key):2 | key            computed once, before the shuffle
    value/list/reducing  kkey | sid:1
    map entry            kkey | sid:1 | user-key
    timer                kg:2 | 0xFFFF | domain:1 | ts:8 (offset) | key
    metadata             0xFFFF | name                        (key-groups are < 0x8000)
    non-keyed state      0xFFFF | "operator_state"            (one blob: operator_state.py)

The shuffle carries kkeys, so a keyed task builds a state key with one concatenation.
"""

from __future__ import annotations

import struct

from ..keygroups import encode_key, stable_hash

KG = struct.Struct(">H")
HEADER = struct.Struct(">HH")  # key-group, key length
TS = struct.Struct(">Q")
TIMER_MARK = b"\xff\xff"  # in the key-length position: never a real length
MAX_STATE_ID = 0xFF
META_PREFIX = b"\xff\xff"
META_EPOCH = META_PREFIX + b"epoch"
META_WATERMARK = META_PREFIX + b"watermark"
META_STATES = META_PREFIX + b"states"
META_INFO = META_PREFIX + b"info"
META_COMMIT = META_PREFIX + b"commit"
META_OPERATOR_STATE = META_PREFIX + b"operator_state"
META_TTL_CURSOR = META_PREFIX + b"ttl-cursor"  # where TTL cleanup continues (ttl_cleanup.py)
EVENT_TIME, PROCESSING_TIME = 0, 1
_TS_OFFSET = 1 << 63
MAX_KEY_BYTES = 0xFFFE


def keyed_key(key: object, max_parallelism: int) -> bytes:
    """The kkey of a user key: key-group, length and the key's stable encoding."""
    kb = encode_key(key)
    return kkey_of(kb, stable_hash(kb) % max_parallelism)


def kkey_of(key_bytes: bytes, kg: int) -> bytes:
    if len(key_bytes) > MAX_KEY_BYTES:
        raise ValueError(f"a key may encode to at most {MAX_KEY_BYTES} bytes, got {len(key_bytes)}")
    return HEADER.pack(kg, len(key_bytes)) + key_bytes


def kkey_group(kkey: bytes) -> int:
    return (kkey[0] << 8) | kkey[1]


def kkey_bytes(kkey: bytes) -> bytes:
    """The encoded user key inside a kkey (see keygroups.decode_key)."""
    return kkey[4:]


def key_group_prefix(kg: int) -> bytes:
    return KG.pack(kg)


def split_state_key(db_key: bytes) -> tuple[int, bytes, int, bytes]:
    """(key-group, encoded key, state id, user-key bytes) of a state entry."""
    kg, n = HEADER.unpack_from(db_key)
    return kg, db_key[4 : 4 + n], db_key[4 + n], db_key[5 + n :]


def is_timer_key(db_key: bytes) -> bool:
    return db_key[2:4] == TIMER_MARK


def timer_prefix(kg: int, domain: int) -> bytes:
    return KG.pack(kg) + TIMER_MARK + bytes((domain,))


def timer_key(kkey: bytes, domain: int, ts: int) -> bytes:
    return kkey[:2] + TIMER_MARK + bytes((domain,)) + TS.pack(ts + _TS_OFFSET) + kkey[4:]


def split_timer(db_key: bytes) -> tuple[int, int, bytes]:
    """(timestamp, domain, kkey) of a timer entry."""
    ts = TS.unpack_from(db_key, 5)[0] - _TS_OFFSET
    kb = db_key[13:]
    return ts, db_key[4], db_key[:2] + struct.pack(">H", len(kb)) + kb


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
