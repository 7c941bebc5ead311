"""The staged form of an epoch's Kafka records: length-prefixed frames in one object.

An exactly-once Kafka sink writes each task's records in this form where readers do not look
(``transactional.py``) and publishes them when the covering checkpoint completes; the
format only has to carry what a produce call takes (key, value, timestamp) and to refuse a
truncated or foreign object instead of publishing part of it.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from ...errors import StatorError

MAGIC = b"STKF1\n"
_HEAD = struct.Struct(">iiq")  # key length (-1: None), value length (-1: None), timestamp (-1)
_COUNT = struct.Struct(">q")

Frame = tuple[bytes | None, bytes | None, int | None]  # key, value, timestamp ms


class FrameWriter:
    """Appends frames to one growing buffer (cheaper than a list of small byte strings)."""

    def __init__(self) -> None:
        self.buf = bytearray(MAGIC)
        self.count = 0

    def add(self, key: bytes | None, value: bytes | None, timestamp: int | None = None) -> None:
        self.buf += _HEAD.pack(
            -1 if key is None else len(key),
            -1 if value is None else len(value),
            -1 if timestamp is None else timestamp,
        )
        if key is not None:
            self.buf += key
        if value is not None:
            self.buf += value
        self.count += 1

    def close(self) -> bytes:
        """The object to stage: the frames, then their count (a truncated object is refused)."""
        return bytes(self.buf + _COUNT.pack(self.count))


def read_frames(blob: bytes, where: str) -> Iterator[Frame]:
    """The frames of a staged object, in order. ``where`` names it in errors."""
    if not blob.startswith(MAGIC) or len(blob) < len(MAGIC) + _COUNT.size:
        raise StatorError(f"{where} is not a staged Kafka sink object (bad header)")
    view = memoryview(blob)
    end = len(blob) - _COUNT.size
    (expected,) = _COUNT.unpack_from(blob, end)
    pos, n, head = len(MAGIC), 0, _HEAD.size
    unpack = _HEAD.unpack_from
    while pos < end:
        if pos + head > end:
            break  # a cut frame: refused below
        klen, vlen, ts = unpack(blob, pos)
        pos += head
        if pos + max(klen, 0) + max(vlen, 0) > end:
            break
        key = None if klen < 0 else bytes(view[pos : pos + klen])
        pos += max(klen, 0)
        value = None if vlen < 0 else bytes(view[pos : pos + vlen])
        pos += max(vlen, 0)
        n += 1
        yield key, value, None if ts < 0 else ts
    if pos != end or n != expected:
        raise StatorError(f"{where} is truncated or corrupt: {n} frames read, {expected} written")


def count_frames(blob: bytes) -> int:
    """How many frames a staged object says it holds (its trailer)."""
    return int(_COUNT.unpack_from(blob, len(blob) - _COUNT.size)[0])
