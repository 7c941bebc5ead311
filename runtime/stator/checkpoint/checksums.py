"""A checksum per checkpoint file (xxh3-64): recorded in the metadata when the file is
uploaded, checked when a restore downloads it or takes a local copy of it instead, so that a
corrupted or replaced file (a bad disk, a volume another pod mounts, an object overwritten in
the bucket) fails the restore (which falls back to an older checkpoint) or is fetched again,
instead of becoming the job's state. Names and sizes alone catch truncation only."""

from __future__ import annotations

import re
from pathlib import Path

import xxhash

ALGORITHM = "xxh3"
_CHUNK = 1 << 20
_FORMAT = re.compile(rf"{ALGORITHM}:[0-9a-f]{{16}}")


def file_checksum(path: Path) -> str:
    """``xxh3:<16 hex digits>`` of the file's bytes (4 GB/s and more: small beside an upload)."""
    digest = xxhash.xxh3_64()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return f"{ALGORITHM}:{digest.hexdigest()}"


def matches(path: Path, checksum: str) -> bool:
    """Whether the file has ``checksum`` ("": none asked for, e.g. a salvaged file, checked
    when a restore uses it: it does)."""
    return not checksum or file_checksum(path) == checksum


def check_format(checksum: str, where: str) -> None:
    """A recorded checksum must be one this Stator can check (never skipped unread)."""
    if not _FORMAT.fullmatch(checksum):
        raise ValueError(f"{where} {checksum!r} is not an {ALGORITHM}:<16 hex digits> checksum")
