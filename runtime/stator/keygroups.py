"""Keys to key-groups to subtasks: the unit of state distribution and rescaling.

A key is encoded to bytes (type-tagged, never Python's salted ``hash``), hashed with a stable
hash, and mapped to a key-group in ``[0, max_parallelism)``. Subtask ``i`` of ``p`` owns the
contiguous key-group range ``[ceil(i*m/p), ceil((i+1)*m/p))``, as in Flink, so changing the
parallelism moves whole key-groups between subtasks and never splits one.
"""

from __future__ import annotations

import pickle
import struct
import zlib
from dataclasses import dataclass
from typing import Any, NamedTuple

MAX_MAX_PARALLELISM = 32768  # key-groups are stored as 2 bytes; 0xFFFF prefixes metadata
# Key-groups of a job whose config and pipeline leave max_parallelism unset (the only default).
DEFAULT_MAX_PARALLELISM = 128
_INT = struct.Struct(">q")
_STR, _INT_TAG, _BYTES, _PICKLE = b"s", b"i", b"b", b"p"


def encode_key(key: Any) -> bytes:
    """Stable, type-tagged bytes for a key: equal keys give equal bytes in every process."""
    if type(key) is str:
        return _STR + key.encode()
    if type(key) is int and -(2**63) <= key < 2**63:
        return _INT_TAG + _INT.pack(key)
    if type(key) is bytes:
        return _BYTES + key
    return _PICKLE + pickle.dumps(key, protocol=4)


def encode_keys(keys: list[Any]) -> list[bytes]:
    """``encode_key`` of each key; string keys (the common case) without a call each."""
    return [_STR + k.encode() if type(k) is str else encode_key(k) for k in keys]


def decode_key(data: bytes) -> Any:
    tag, body = data[:1], data[1:]
    if tag == _STR:
        return body.decode()
    if tag == _INT_TAG:
        return _INT.unpack(body)[0]
    if tag == _BYTES:
        return bytes(body)
    if tag == _PICKLE:
        return pickle.loads(body)  # noqa: S301 - written by encode_key of this job's own state
    raise ValueError(f"not an encoded key (tag {tag!r})")


def stable_hash(data: bytes) -> int:
    """crc32 with murmur3's finaliser, so similar keys ('k1', 'k2') spread evenly."""
    h = zlib.crc32(data)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


def key_group(key_bytes: bytes, max_parallelism: int) -> int:
    return stable_hash(key_bytes) % max_parallelism


def subtask_for_key_group(kg: int, max_parallelism: int, parallelism: int) -> int:
    return kg * parallelism // max_parallelism


class SubtaskId(NamedTuple):
    """One parallel instance of a keyed operator: the key of everything kept per subtask
    (snapshots, commit tokens, restores, pinned executors). A tuple, so it compares, hashes
    and pickles as ``(operator, subtask)`` does."""

    operator: str  # the operator's uid
    subtask: int  # 0 .. parallelism - 1


@dataclass(frozen=True, order=True)
class KeyGroupRange:
    """Half-open range ``[start, end)`` of key-groups."""

    start: int
    end: int

    def __contains__(self, kg: object) -> bool:
        return isinstance(kg, int) and self.start <= kg < self.end

    def __len__(self) -> int:
        return max(0, self.end - self.start)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(range(self.start, self.end))

    def intersect(self, other: KeyGroupRange) -> KeyGroupRange:
        start, end = max(self.start, other.start), min(self.end, other.end)
        return KeyGroupRange(start, max(start, end))

    def __str__(self) -> str:
        return f"[{self.start},{self.end})"


def range_for_subtask(index: int, parallelism: int, max_parallelism: int) -> KeyGroupRange:
    """Flink's assignment: the inverse of :func:`subtask_for_key_group`."""
    check_parallelism(parallelism, max_parallelism)
    if not 0 <= index < parallelism:
        raise ValueError(f"subtask index {index} is outside [0, {parallelism})")
    start = (index * max_parallelism + parallelism - 1) // parallelism
    end = ((index + 1) * max_parallelism + parallelism - 1) // parallelism
    return KeyGroupRange(start, end)


def check_parallelism(parallelism: int, max_parallelism: int) -> None:
    if not 1 <= max_parallelism <= MAX_MAX_PARALLELISM:
        raise ValueError(
            f"maxParallelism must be in [1, {MAX_MAX_PARALLELISM}], got {max_parallelism}"
        )
    if not 1 <= parallelism <= max_parallelism:
        raise ValueError(
            f"parallelism must be in [1, maxParallelism={max_parallelism}], got {parallelism}"
        )
