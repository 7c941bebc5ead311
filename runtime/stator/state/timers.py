"""Timers per key, stored in RocksDB next to the key's state (same key-group prefix), so they
move with their key-group on rescale and are part of every checkpoint and savepoint."""

from __future__ import annotations

from typing import Any, cast

import rocksdict

from .layout import EVENT_TIME, split_timer, timer_bound, timer_key, timer_prefix


class TimerStore:
    """Registered timers plus this epoch's uncommitted additions and deletions."""

    def __init__(self, db: rocksdict.Rdict) -> None:
        self.db = db
        self.pending: dict[bytes, bool] = {}  # timer key -> registered (True) / deleted (False)

    def register(self, kg: int, domain: int, ts: int, key_bytes: bytes) -> None:
        self.pending[timer_key(kg, domain, ts, key_bytes)] = True

    def delete(self, kg: int, domain: int, ts: int, key_bytes: bytes) -> None:
        self.pending[timer_key(kg, domain, ts, key_bytes)] = False

    def pop_due(self, domain: int, bound: int, key_groups: range) -> list[tuple[int, int, bytes]]:
        """Remove and return timers with timestamp <= ``bound`` as (ts, kg, key bytes), sorted:
        firing order is deterministic, so a replayed epoch fires exactly the same way."""
        due: dict[bytes, None] = {}
        for kg in key_groups:
            start, stop = timer_prefix(kg, domain), timer_bound(kg, domain, bound)
            for raw in self.db.keys(from_key=start):
                key = cast(bytes, raw)
                if key >= stop:
                    break
                due[key] = None
        for key, registered in self.pending.items():
            if key[3] == domain and _in(key, key_groups) and split_timer(key)[2] <= bound:
                if registered:
                    due[key] = None
                else:
                    due.pop(key, None)
        fired = []
        for key in due:
            kg, _, ts, kb = split_timer(key)
            fired.append((ts, kg, kb))
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
            if key[3] == domain and _in(key, key_groups):
                keys[key] = registered
        return sum(keys.values())

    def reset(self) -> None:
        self.pending.clear()


def _in(key: bytes, key_groups: Any) -> bool:
    return int.from_bytes(key[:2], "big") in key_groups
