"""Removing expired entries of TTL-enabled states from the database (rocksdict has no
compaction filter that Python code can supply, which is how Flink's RocksDB backend does it).

Each commit scans a bounded number of database entries, continuing from a cursor stored in
the database (so a restored or moved subtask continues the pass), and removes what expired
in the same write batch as the epoch's changes: a retried epoch removes exactly the same.
Entries the epoch writes are left to that write. When it removed anything, the commit then
compacts the scanned key range, so the removed bytes leave the SST files too, and with them
every later checkpoint and savepoint. A full pass over a database of E entries takes
ceil(E / budget) epochs: that is the bound on how long an expired entry stays stored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import rocksdict

from .layout import META_PREFIX, TIMER_MARK
from .markers import MISSING
from .ttl_tables import TtlMapTable, TtlValueTable


@dataclass(frozen=True)
class Cleanup:
    """One commit's share of the pass."""

    puts: list[tuple[bytes, bytes | None]]  # db key -> pruned value, None: delete
    cursor: bytes  # where the next commit continues (b"": from the start)
    scanned: int
    lo: bytes  # the first and last removed or pruned key (compacted after the write)
    hi: bytes


def scan(
    db: rocksdict.Rdict,
    tables: dict[int, TtlValueTable | TtlMapTable],
    now: int,
    budget: int,
    cursor: bytes,
) -> Cleanup:
    it = db.iter()
    if cursor:
        it.seek(cursor)
    else:
        it.seek_to_first()
    puts: list[tuple[bytes, bytes | None]] = []
    scanned, wrapped = 0, not cursor
    while scanned < budget:
        if not it.valid():
            if wrapped:
                break
            wrapped = True
            it.seek_to_first()
            continue
        key = cast(bytes, it.key())
        if wrapped and cursor and key >= cursor:  # a full circle in one commit
            break
        scanned += 1
        if not key.startswith(META_PREFIX) and key[2:4] != TIMER_MARK:
            n = (key[2] << 8) | key[3]
            table = tables.get(key[4 + n]) if len(key) > 4 + n else None
            if table is not None and not table.written(key, n):
                raw = cast(bytes, it.value())
                pruned = table.prune(raw, now)
                if pruned is not raw:
                    puts.append((key, pruned))
                    cache_key = table.cache_key(key, n)
                    if cache_key in table.cache:  # the cache equals the database again
                        table.cache[cache_key] = MISSING if pruned is None else table.decode(pruned)
        it.next()
    next_cursor = cast(bytes, it.key()) if it.valid() else b""
    lo = puts[0][0] if puts else b""
    hi = max((k for k, _ in puts), default=b"")
    lo = min((k for k, _ in puts), default=lo)
    return Cleanup(puts, next_cursor, scanned, lo, hi)
