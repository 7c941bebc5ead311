"""Per-process cache of committed state, kept between epochs.

Spark reuses Python workers, and a worker that ran a subtask's last epoch usually runs its
next one too. Handing the epoch's decoded values to the next task in the same process skips
re-reading (and re-decoding) them from RocksDB. Correctness does not depend on it: every
commit writes a random token into the database, and a cache is used only if it was left by
the commit whose token the database holds. A task takes the cache out before it starts and
puts it back only after it committed, so a failed task never leaves a stale cache behind.
"""

from __future__ import annotations

import threading
from typing import Any

_lock = threading.Lock()
# state id -> (kkey -> value, whether that holds every stored entry of the state)
Tables = dict[int, tuple[dict[bytes, Any], bool]]
_caches: dict[str, tuple[bytes, Tables]] = {}


def take(path: str, token: bytes | None) -> Tables:
    """The cached tables for ``path`` at commit ``token``."""
    with _lock:
        entry = _caches.pop(path, None)
    if entry is None or token is None or entry[0] != token:
        return {}
    return entry[1]


def give(path: str, token: bytes, tables: Tables, limit: int) -> None:
    if sum(len(cache) for cache, _ in tables.values()) > limit:
        return  # too large to keep: the next epoch reads from RocksDB
    with _lock:
        _caches[path] = (token, tables)


def clear() -> None:
    with _lock:
        _caches.clear()
