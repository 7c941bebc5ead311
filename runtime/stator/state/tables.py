"""Per-epoch write-back caches over RocksDB, one per declared state.

A task reads each key's state from RocksDB at most once per epoch (batched with multi-get
where the keys are known up front), works on Python objects, and writes every changed entry
in the epoch's single write batch. That makes the epoch atomic and keeps serialization off the
per-record path: a key updated a thousand times in an epoch is serialized once.

Caches of one-value-per-key states are keyed by the kkey alone (a table is one state id), so
a state access on the per-record path is one dict operation, with no key bytes built; the
state id byte is appended once per key and epoch, when a key is read from or written to
RocksDB.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast

import rocksdict

from .descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from .layout import prefix_end
from .markers import MISSING, UNLOADED
from .serializers import Serializer

_LEN = struct.Struct(">I")


class Table:
    """Cache of one state's entries, keyed by kkey (their RocksDB key is kkey + the state id)."""

    def __init__(self, db: rocksdict.Rdict, sid: int, desc: StateDescriptor) -> None:
        self.db, self.sid, self.desc = db, sid, desc
        self.serializer: Serializer = desc.serializer
        self.sid_byte = bytes((sid,))  # a key's entry is its kkey + this
        self.cache: dict[bytes, Any] = {}
        self.dirty: set[bytes] = set()
        # The cache holds every stored entry of this state: a key not in it is absent.
        self.complete = False

    # -- (de)serialization of one stored value; lists override
    def decode(self, raw: bytes) -> Any:
        return self.serializer.loads(raw)

    def encode(self, value: Any) -> bytes:
        return self.serializer.dumps(value)

    def decoder(self) -> Callable[[bytes], Any]:
        """``decode`` for bulk use: the serializer's own where this table stores values as
        the serializer writes them (a call less per value)."""
        return self.serializer.loads if type(self).decode is Table.decode else self.decode

    def encoder(self) -> Callable[[Any], bytes]:
        return self.serializer.dumps if type(self).encode is Table.encode else self.encode

    def load(self, kkey: bytes) -> Any:
        return self._cached(kkey, kkey + self.sid_byte)

    def _cached(self, cache_key: bytes, db_key: bytes) -> Any:
        """The cached value of ``cache_key``, read (once) from RocksDB at ``db_key``."""
        value = self.cache.get(cache_key, UNLOADED)
        if value is UNLOADED:
            raw = None if self.complete else self.db.get(db_key)
            value = MISSING if raw is None else self.decode(raw)
            self.cache[cache_key] = value
        return value

    def prefetch(self, kkeys: Iterable[bytes]) -> None:
        """Read every not-yet-cached key with one multi-get."""
        if self.complete:
            return  # absent: ``load`` says so without reading
        cache, sid = self.cache, self.sid_byte
        wanted = [k for k in kkeys if k not in cache]
        if not wanted:
            return
        decode = self.decoder()
        values = cast(list[bytes | None], self.db.get([k + sid for k in wanted]))
        for kkey, raw in zip(wanted, values, strict=True):
            cache[kkey] = MISSING if raw is None else decode(raw)

    def store(self, kkey: bytes, value: Any) -> None:
        self.cache[kkey] = value
        self.dirty.add(kkey)

    def delete(self, kkey: bytes) -> None:
        self.cache[kkey] = MISSING
        self.dirty.add(kkey)

    def write_to(self, batch: rocksdict.WriteBatch) -> int:
        cache, encode, sid = self.cache, self.encoder(), self.sid_byte
        for kkey in self.dirty:
            value = cache[kkey]
            if value is MISSING:
                batch.delete(kkey + sid)
            else:
                batch.put(kkey + sid, encode(value))
        return len(self.dirty)

    def reset(self) -> None:
        self.cache.clear()
        self.dirty.clear()
        self.complete = False


class ValueTable(Table):
    pass


class ReducingTable(Table):
    def __init__(self, db: rocksdict.Rdict, sid: int, desc: StateDescriptor) -> None:
        super().__init__(db, sid, desc)
        assert isinstance(desc, ReducingStateDescriptor)
        self.reduce_fn = desc.reduce_fn

    def add(self, key: bytes, value: Any) -> None:
        current = self.load(key)
        self.store(key, value if current is MISSING else self.reduce_fn(current, value))


class AggregatingTable(Table):
    """One accumulator per key."""

    def __init__(self, db: rocksdict.Rdict, sid: int, desc: StateDescriptor) -> None:
        super().__init__(db, sid, desc)
        assert isinstance(desc, AggregatingStateDescriptor)
        self.function = desc.aggregate_function

    def add(self, key: bytes, value: Any) -> None:
        acc = self.load(key)
        fn = self.function
        self.store(key, fn.add(fn.create() if acc is MISSING else acc, value))


def decode_list(raw: bytes, serializer: Serializer) -> list[Any]:
    """A stored list: length-prefixed serialized elements."""
    loads, out, pos, end = serializer.loads, [], 0, len(raw)
    while pos < end:
        (n,) = _LEN.unpack_from(raw, pos)
        pos += 4
        out.append(loads(raw[pos : pos + n]))
        pos += n
    return out


class ListTable(Table):
    """A key's whole list is one RocksDB value: length-prefixed serialized elements."""

    def decode(self, raw: bytes) -> Any:
        return decode_list(raw, self.serializer)

    def encode(self, value: Any) -> bytes:
        dumps = self.serializer.dumps
        parts = []
        for item in value:
            data = dumps(item)
            parts.append(_LEN.pack(len(data)))
            parts.append(data)
        return b"".join(parts)


class MapTable(Table):
    """Each user key is its own entry (``state key | user key``, the state key being kkey +
    state id); its cache is keyed by that whole entry key. Iteration merges a RocksDB prefix
    scan with this epoch's uncommitted changes."""

    def __init__(self, db: rocksdict.Rdict, sid: int, desc: StateDescriptor) -> None:
        super().__init__(db, sid, desc)
        assert isinstance(desc, MapStateDescriptor)
        self.user_key_serializer = desc.key_serializer
        self.changes: dict[bytes, dict[bytes, Any]] = {}  # state key -> user key -> value|MISSING
        self.cleared: set[bytes] = set()

    def get(self, skey: bytes, ukey: bytes) -> Any:
        changed = self.changes.get(skey)
        if changed is not None and ukey in changed:
            return changed[ukey]
        if skey in self.cleared:
            return MISSING
        key = skey + ukey  # the whole entry key, in the cache and in RocksDB
        return self._cached(key, key)

    def put(self, skey: bytes, ukey: bytes, value: Any) -> None:
        self.changes.setdefault(skey, {})[ukey] = value

    def remove(self, skey: bytes, ukey: bytes) -> None:
        self.changes.setdefault(skey, {})[ukey] = MISSING

    def clear_key(self, skey: bytes) -> None:
        self.cleared.add(skey)
        self.changes.pop(skey, None)

    def items(self, skey: bytes) -> Iterator[tuple[bytes, Any]]:
        """(user key bytes, value) in user-key byte order, with this epoch's changes applied."""
        merged: dict[bytes, Any] = {}
        if skey not in self.cleared:
            start, n = skey, len(skey)
            for k, raw in self.db.items(from_key=start):
                key = cast(bytes, k)
                if not key.startswith(start):
                    break
                merged[key[n:]] = raw
        decoded = {k: self.decode(v) for k, v in merged.items()}
        for ukey, value in self.changes.get(skey, {}).items():
            if value is MISSING:
                decoded.pop(ukey, None)
            else:
                decoded[ukey] = value
        for ukey in sorted(decoded):
            yield ukey, decoded[ukey]

    def write_to(self, batch: rocksdict.WriteBatch) -> int:
        count = 0
        for skey in self.cleared:
            batch.delete_range(skey, prefix_end(skey))
            count += 1
        encode = self.encode
        for skey, changed in self.changes.items():
            for ukey, value in changed.items():
                if value is MISSING:
                    batch.delete(skey + ukey)
                else:
                    batch.put(skey + ukey, encode(value))
                count += 1
        return count

    def reset(self) -> None:
        super().reset()
        self.changes.clear()
        self.cleared.clear()


def table_for(db: rocksdict.Rdict, sid: int, desc: StateDescriptor) -> Table:
    """The table of a state without TTL (``ttl_tables.ttl_table_for`` makes the others)."""
    if isinstance(desc, MapStateDescriptor):
        return MapTable(db, sid, desc)
    if isinstance(desc, ListStateDescriptor):
        return ListTable(db, sid, desc)
    if isinstance(desc, ReducingStateDescriptor):
        return ReducingTable(db, sid, desc)
    if isinstance(desc, ValueStateDescriptor):
        return ValueTable(db, sid, desc)
    if isinstance(desc, AggregatingStateDescriptor):
        return AggregatingTable(db, sid, desc)
    raise TypeError(f"not a state descriptor: {desc!r}")
