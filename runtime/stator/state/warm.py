"""Cache of committed state, kept between epochs: in the process, and beside the database
for the executor's other Python workers.

Spark reuses Python workers, and a worker that ran a subtask's last epoch often runs its next
one too. Handing the epoch's decoded values to the next task in the same process skips
re-reading (and re-decoding) them from RocksDB. But an executor with several workers hands a
task to whichever worker is idle, so subtasks move between workers (10 of 16 keyed tasks in
the keyed-count benchmark on ``local[2]``), and a moved subtask read its whole state again
(a scan: 0.25-0.36 s there). So a worker that holds the caches of several subtasks, or has
seen one of its subtasks come back changed by another worker, also writes its cache to the
subtask's state directory at each commit (``warm.pickle``: the commit token, then the
tables pickled without the memo, ``pickling.py``: ~5 ms for 200,000 entries), and a worker
without a current cache reads that file: one unpickling instead of a scan. A worker that
runs one subtask, as with an executor per subtask, writes nothing.

Correctness does not depend on either: every commit writes a random token into the database,
and a cache (in memory or on disk) is used only if it was left by the commit whose token the
database holds. A task takes the cache out before it starts and puts it back only after it
committed, so a failed task never leaves a stale cache behind; a file left by a failed write
or an older commit is ignored for its token.

The file is unpickled, and unpickling runs code: it is read only if it carries a keyed MAC
(BLAKE2b) of the job's driver, whose random key reaches tasks with the epoch's spec
(``EpochSpec.warm_key``), so another pod that can mount the state volume cannot plant one.
Without a key (tests that build a backend alone) nothing is written to or read from disk.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import pickle
import threading
from pathlib import Path
from typing import Any

from .. import pickling
from ..atomic_file import write_atomically

log = logging.getLogger("stator.state")

# state id -> (kkey -> value, whether that holds every stored entry of the state)
Tables = dict[int, tuple[dict[bytes, Any], bool]]
SNAPSHOT = "warm.pickle"  # in the subtask's state directory, beside its database
_TOKEN_BYTES = 16
_MAC_BYTES = 32

_lock = threading.Lock()
_caches: dict[str, tuple[bytes, Tables]] = {}
_moved: set[str] = set()  # subtasks this worker ran that another worker committed since


def take(path: str, token: bytes | None, key: bytes = b"") -> Tables:
    """The cached tables for the database at ``path`` at commit ``token``: this process's
    own, else the file another worker left at that commit (MAC'd with ``key``), else none."""
    with _lock:
        entry = _caches.pop(path, None)
    if token is None:
        return {}
    if entry is not None:
        if entry[0] == token:
            return entry[1]
        _moved.add(path)
    return _read(_snapshot_path(path), token, key) if key else {}


def give(path: str, token: bytes, tables: Tables, limit: int, key: bytes = b"") -> None:
    if sum(len(cache) for cache, _ in tables.values()) > limit:
        return  # too large to keep: the next epoch reads from RocksDB
    with _lock:
        _caches[path] = (token, tables)
        shared = bool(_moved) or len(_caches) > 1
    if shared and key:
        _write(_snapshot_path(path), token, tables, key)


def clear() -> None:
    with _lock:
        _caches.clear()
        _moved.clear()


def _snapshot_path(db_path: str) -> Path:
    return Path(db_path).parent / SNAPSHOT


def _mac(key: bytes, token: bytes, payload: bytes) -> bytes:
    return hashlib.blake2b(token + payload, key=key, digest_size=_MAC_BYTES).digest()


def _read(file: Path, token: bytes, key: bytes) -> Tables:
    try:
        with file.open("rb") as f:
            if f.read(_TOKEN_BYTES) != token:
                return {}
            mac, payload = f.read(_MAC_BYTES), f.read()
        if not hmac.compare_digest(mac, _mac(key, token, payload)):
            log.warning("warm cache %s is not this job's (bad MAC): ignored", file)
            return {}
        tables: Tables = pickle.loads(payload)  # noqa: S301 - MAC'd by this job's driver key
        return tables
    except FileNotFoundError:
        return {}
    except Exception as exc:  # a torn or foreign file: read RocksDB instead
        log.debug("warm cache %s unreadable: %s", file, exc)
        return {}


def _write(file: Path, token: bytes, tables: Tables, key: bytes) -> None:
    """Atomically, so a reader sees a whole file or the previous one."""
    try:
        payload = pickling.dumps(tables)
        write_atomically(file, token, _mac(key, token, payload), payload)
    except Exception as exc:  # e.g. a state value that does not pickle: no file
        log.debug("warm cache %s not written: %s", file, exc)
