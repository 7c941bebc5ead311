"""Timers per key, stored in RocksDB under the key's key-group, so they move with their
key-group on rescale and are part of every checkpoint and savepoint."""

from __future__ import annotations

from typing import cast

import rocksdict

from .layout import EVENT_TIME, kkey_group, split_timer, timer_bound, timer_key, timer_prefix


class TimerStore:
    """Registered timers plus this epoch's uncommitted additions and deletions."""

    def __init__(self, db: rocksdict.Rdict) -> None:
        self.db = db
        self.pending: dict[bytes, bool] = {}  # timer key -> registered (True) / deleted (False)

    def register(self, kkey: bytes, domain: int, ts: int) -> None:
        self.pending[timer_key(kkey, domain, ts)] = True

    def delete(self, kkey: bytes, domain: int, ts: int) -> None:
        self.pending[timer_key(kkey, domain, ts)] = False

    def pop_due(self, domain: int, bound: int, key_groups: range) -> list[tuple[int, bytes]]:
        """Remove and return timers with timestamp <= ``bound`` as (ts, kkey), sorted, so a
        replayed epoch fires exactly the same timers in the same order."""
        due: dict[bytes, None] = {}
        for kg in key_groups:
            start, stop = timer_prefix(kg, domain), timer_bound(kg, domain, bound)
            for raw in self.db.keys(from_key=start):
                key = cast(bytes, raw)
                if key >= stop:
                    break
                due[key] = None
        for key, registered in self.pending.items():
            ts, dom, kkey = split_timer(key)
            if dom == domain and ts <= bound and kkey_group(kkey) in key_groups:
                if registered:
                    due[key] = None
                else:
                    due.pop(key, None)
        fired = []
        for key in due:
            ts, _, kkey = split_timer(key)
            fired.append((ts, kkey))
            self.pending[key] = False
        fired.sort()
        return fired

    def write_to(self, batch: rocksdict.WriteBatch) -> int:
        for key, registered in self.pending.items():
            if registered:
                batch.put(key, b"")
            else:
                batch.delete(key)
        return len(self.pending)

    def count(self, key_groups: range, domain: int = EVENT_TIME) -> int:
        """Registered timers, committed or pending (for tests and metrics)."""
        keys: dict[bytes, bool] = {}
        for kg in key_groups:
            prefix = timer_prefix(kg, domain)
            for raw in self.db.keys(from_key=prefix):
                key = cast(bytes, raw)
                if not key.startswith(prefix):
                    break
                keys[key] = True
        for key, registered in self.pending.items():
            _, dom, kkey = split_timer(key)
            if dom == domain and kkey_group(kkey) in key_groups:
                keys[key] = registered
        return sum(keys.values())

    def reset(self) -> None:
        self.pending.clear()
