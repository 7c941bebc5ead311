"""The keys of a subtask that hold a given state, for ``apply_to_keyed_state`` (a broadcast
record that must touch every key's state, as Flink's ``applyToKeyedState``): one scan of the
subtask's key-group range in RocksDB, merged with the epoch's uncommitted changes."""

from __future__ import annotations

from typing import cast

import rocksdict

from ..keygroups import KeyGroupRange
from .layout import HEADER, TIMER_MARK, key_group_prefix
from .markers import MISSING
from .tables import MapTable, Table


def keys_with_state(db: rocksdict.Rdict, key_groups: KeyGroupRange, table: Table) -> list[bytes]:
    """kkeys that have an entry of ``table``'s state now, in key order."""
    sid = table.sid
    found: set[bytes] = set()
    start = key_group_prefix(key_groups.start)
    end = key_group_prefix(key_groups.end) if key_groups.end < 0x8000 else b"\x80\x00"
    for k in db.keys(from_key=start):
        key = cast(bytes, k)
        if key >= end:
            break
        if key[2:4] == TIMER_MARK:
            continue
        n = HEADER.unpack_from(key)[1]
        if len(key) > 4 + n and key[4 + n] == sid:
            found.add(key[: 4 + n])
    if isinstance(table, MapTable):  # this epoch's changes, by state key (kkey + state id)
        for skey in table.cleared:
            found.discard(skey[:-1])
        for skey, changed in table.changes.items():
            if any(v is not MISSING for v in changed.values()):
                found.add(skey[:-1])
    else:
        for kkey in table.dirty:
            if table.cache[kkey] is MISSING:
                found.discard(kkey)
            else:
                found.add(kkey)
    return sorted(found)
