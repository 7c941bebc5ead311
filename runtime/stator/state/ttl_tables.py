"""The caches of TTL-enabled states (``ttl.py``): each stored value carries the processing
time of its last access as an 8-byte prefix (per element of a list, per entry of a map), and
the caches hold ``(stamp, value)`` pairs. Reads apply expiry and the update type here, so the
handles stay thin; states without TTL use ``tables.py`` and pay nothing for this."""

from __future__ import annotations

import struct
from typing import Any

import rocksdict

from .descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from .markers import MISSING
from .serializers import Serializer
from .tables import MapTable, Table
from .ttl import STAMP, STAMP_BYTES, StateTtlConfig, TtlClock

_LEN = struct.Struct(">I")


def _config(desc: StateDescriptor) -> StateTtlConfig:
    assert desc.ttl is not None, f"state '{desc.name}' has no TTL"
    return desc.ttl


class _Stamped:
    """What value and map tables with TTL share: the config, and values stored as
    ``stamp | value`` (the last access, in the epoch's processing time)."""

    serializer: Serializer

    def _stamped(self, desc: StateDescriptor, clock: TtlClock) -> None:
        ttl = _config(desc)
        self.ttl_ms, self.clock = ttl.ttl_ms, clock
        self.refresh_on_read, self.return_expired = ttl.refresh_on_read, ttl.return_expired
        self.cleanup_scan = ttl.cleanup_scan_per_epoch

    def decode(self, raw: bytes) -> Any:
        return STAMP.unpack_from(raw)[0], self.serializer.loads(raw[STAMP_BYTES:])

    def encode(self, value: Any) -> bytes:
        return STAMP.pack(value[0]) + self.serializer.dumps(value[1])


class TtlValueTable(_Stamped, Table):
    """Value state with TTL (and the base of reducing and aggregating state with TTL)."""

    def __init__(
        self, db: rocksdict.Rdict, sid: int, desc: StateDescriptor, clock: TtlClock
    ) -> None:
        super().__init__(db, sid, desc)
        self._stamped(desc, clock)

    def read(self, kkey: bytes) -> Any:
        """The key's value (MISSING if none or expired); an expired value is removed."""
        entry = self.load(kkey)
        if entry is MISSING:
            return MISSING
        stamp, value = entry
        now = self.clock.now_ms
        if stamp + self.ttl_ms <= now:
            self.delete(kkey)
            return value if self.return_expired else MISSING
        if self.refresh_on_read and stamp != now:
            self.store(kkey, (now, value))
        return value

    def write(self, kkey: bytes, value: Any) -> None:
        self.store(kkey, (self.clock.now_ms, value))

    def current(self, kkey: bytes) -> Any:
        """The value an ``add`` combines with: an expired one counts as absent unless the
        visibility returns expired values (as Flink's TTL reduce and aggregate functions)."""
        entry = self.load(kkey)
        if entry is MISSING or (
            entry[0] + self.ttl_ms <= self.clock.now_ms and not self.return_expired
        ):
            return MISSING
        return entry[1]

    # -- cleanup (``ttl_cleanup.py``): raw entries, without deserializing values

    def prune(self, raw: bytes, now: int) -> bytes | None:
        """``raw`` if nothing in it expired, None if the entry goes, else what remains."""
        return None if STAMP.unpack_from(raw)[0] + self.ttl_ms <= now else raw

    def written(self, db_key: bytes, n: int) -> bool:
        """Whether this epoch writes the entry (cleanup leaves it to that write)."""
        return db_key[:-1] in self.dirty

    def cache_key(self, db_key: bytes, n: int) -> bytes:
        return db_key[:-1]


class TtlReducingTable(TtlValueTable):
    def __init__(
        self, db: rocksdict.Rdict, sid: int, desc: StateDescriptor, clock: TtlClock
    ) -> None:
        super().__init__(db, sid, desc, clock)
        assert isinstance(desc, ReducingStateDescriptor)
        self.reduce_fn = desc.reduce_fn

    def add(self, kkey: bytes, value: Any) -> None:
        current = self.current(kkey)
        self.write(kkey, value if current is MISSING else self.reduce_fn(current, value))


class TtlAggregatingTable(TtlValueTable):
    def __init__(
        self, db: rocksdict.Rdict, sid: int, desc: StateDescriptor, clock: TtlClock
    ) -> None:
        super().__init__(db, sid, desc, clock)
        assert isinstance(desc, AggregatingStateDescriptor)
        self.function = desc.aggregate_function

    def add(self, kkey: bytes, value: Any) -> None:
        acc, fn = self.current(kkey), self.function
        self.write(kkey, fn.add(fn.create() if acc is MISSING else acc, value))


class TtlListTable(TtlValueTable):
    """A key's list is one RocksDB value of length-prefixed ``stamp | element`` records; the
    cache holds a list of ``(stamp, element)``. Each element expires on its own."""

    def decode(self, raw: bytes) -> Any:
        loads, out, pos, end = self.serializer.loads, [], 0, len(raw)
        while pos < end:
            (n,) = _LEN.unpack_from(raw, pos)
            pos += 4
            out.append((STAMP.unpack_from(raw, pos)[0], loads(raw[pos + STAMP_BYTES : pos + n])))
            pos += n
        return out

    def encode(self, value: Any) -> bytes:
        dumps, parts = self.serializer.dumps, []
        for stamp, item in value:
            data = dumps(item)
            parts.append(_LEN.pack(len(data) + STAMP_BYTES))
            parts.append(STAMP.pack(stamp))
            parts.append(data)
        return b"".join(parts)

    def get(self, kkey: bytes) -> list[Any]:
        """The live elements (with RETURN_EXPIRED_IF_NOT_CLEANED_UP also the expired ones,
        once); expired elements are removed, live ones restamped if reads refresh."""
        entries = self.load(kkey)
        if entries is MISSING:
            return []
        now, ttl = self.clock.now_ms, self.ttl_ms
        live = [e for e in entries if e[0] + ttl > now]
        out = [v for _, v in (entries if self.return_expired else live)]
        refresh = self.refresh_on_read and any(s != now for s, _ in live)
        if refresh:
            live = [(now, v) for _, v in live]
        if refresh or len(live) != len(entries):
            if live:
                self.store(kkey, live)
            else:
                self.delete(kkey)
        return out

    def add(self, kkey: bytes, value: Any) -> None:
        entries = self.load(kkey)
        if entries is MISSING:
            self.store(kkey, [(self.clock.now_ms, value)])
        else:
            entries.append((self.clock.now_ms, value))
            self.dirty.add(kkey)

    def update(self, kkey: bytes, values: list[Any]) -> None:
        now = self.clock.now_ms
        if values:
            self.store(kkey, [(now, v) for v in values])
        else:
            self.delete(kkey)

    def prune(self, raw: bytes, now: int) -> bytes | None:
        kept, pos, end, ttl, dropped = [], 0, len(raw), self.ttl_ms, False
        while pos < end:
            (n,) = _LEN.unpack_from(raw, pos)
            if STAMP.unpack_from(raw, pos + 4)[0] + ttl > now:
                kept.append(raw[pos : pos + 4 + n])
            else:
                dropped = True
            pos += 4 + n
        if not dropped:
            return raw
        return b"".join(kept) if kept else None


class TtlMapTable(_Stamped, MapTable):
    """Map state with TTL: each entry's value is ``stamp | value``; each entry expires on
    its own."""

    def __init__(
        self, db: rocksdict.Rdict, sid: int, desc: StateDescriptor, clock: TtlClock
    ) -> None:
        super().__init__(db, sid, desc)
        self._stamped(desc, clock)

    def read(self, skey: bytes, ukey: bytes) -> Any:
        entry = self.get(skey, ukey)
        if entry is MISSING:
            return MISSING
        stamp, value = entry
        now = self.clock.now_ms
        if stamp + self.ttl_ms <= now:
            self.remove(skey, ukey)
            return value if self.return_expired else MISSING
        if self.refresh_on_read and stamp != now:
            self.put(skey, ukey, (now, value))
        return value

    def write(self, skey: bytes, ukey: bytes, value: Any) -> None:
        self.put(skey, ukey, (self.clock.now_ms, value))

    def live_items(self, skey: bytes) -> list[tuple[bytes, Any]]:
        """(user key bytes, value) of the live entries in user-key order, read as ``read``
        reads one: expired entries removed, live ones restamped if reads refresh."""
        now, ttl, out = self.clock.now_ms, self.ttl_ms, []
        for ukey, (stamp, value) in list(self.items(skey)):
            if stamp + ttl <= now:
                self.remove(skey, ukey)
                if self.return_expired:
                    out.append((ukey, value))
                continue
            if self.refresh_on_read and stamp != now:
                self.put(skey, ukey, (now, value))
            out.append((ukey, value))
        return out

    def has_live(self, skey: bytes) -> bool:
        """Whether any entry is live (not a read: nothing is restamped or removed)."""
        now, ttl = self.clock.now_ms, self.ttl_ms
        return any(stamp + ttl > now for _, (stamp, _v) in self.items(skey))

    def prune(self, raw: bytes, now: int) -> bytes | None:
        return None if STAMP.unpack_from(raw)[0] + self.ttl_ms <= now else raw

    def written(self, db_key: bytes, n: int) -> bool:
        skey = db_key[: 5 + n]
        return skey in self.cleared or db_key[5 + n :] in self.changes.get(skey, ())

    def cache_key(self, db_key: bytes, n: int) -> bytes:
        return db_key


TtlTable = TtlValueTable | TtlMapTable


def ttl_table_for(
    db: rocksdict.Rdict, sid: int, desc: StateDescriptor, clock: TtlClock
) -> TtlValueTable | TtlMapTable:
    if isinstance(desc, MapStateDescriptor):
        return TtlMapTable(db, sid, desc, clock)
    if isinstance(desc, ListStateDescriptor):
        return TtlListTable(db, sid, desc, clock)
    if isinstance(desc, ReducingStateDescriptor):
        return TtlReducingTable(db, sid, desc, clock)
    if isinstance(desc, AggregatingStateDescriptor):
        return TtlAggregatingTable(db, sid, desc, clock)
    if isinstance(desc, ValueStateDescriptor):
        return TtlValueTable(db, sid, desc, clock)
    raise TypeError(f"not a state descriptor: {desc!r}")
