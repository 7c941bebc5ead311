"""The keyed state backend of one operator subtask: a RocksDB database holding the state of a
key-group range, opened for one epoch, committed atomically together with the epoch number."""

from __future__ import annotations

import json
import os
import shutil
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import rocksdict

from ..errors import StateCompatibilityError
from ..keygroups import KeyGroupRange
from . import operator_state as opstate
from . import warm
from .descriptors import ListStateDescriptor, MapStateDescriptor, StateDescriptor
from .layout import (
    MAX_STATE_ID,
    META_COMMIT,
    META_EPOCH,
    META_INFO,
    META_OPERATOR_STATE,
    META_PREFIX,
    META_STATES,
    META_TTL_CURSOR,
    META_WATERMARK,
    TIMER_MARK,
)
from .markers import MISSING
from .options import RocksDBOptions
from .tables import MapTable, Table, table_for
from .timers import TimerStore
from .ttl import TtlClock
from .ttl_cleanup import scan as scan_expired
from .ttl_tables import TtlMapTable, TtlValueTable, ttl_table_for

_I64 = struct.Struct(">q")
MIN_WATERMARK = -(2**63)
ROCKSDB_SMALL_FILES = ("CURRENT", "rocksdict-config.json")
# Prefetch with one scan instead of point reads when this share of stored entries is wanted.
SCAN_FRACTION = 0.1


@dataclass(frozen=True)
class LocalFile:
    """A file of a local RocksDB snapshot."""

    name: str
    size: int
    shared: bool  # SST files are immutable and shareable between checkpoints


class KeyedBackend:
    def __init__(
        self,
        path: Path,
        options: RocksDBOptions,
        key_groups: KeyGroupRange,
        max_parallelism: int,
        operator_uid: str,
        warm_entries: int = 0,
        warm_key: bytes = b"",
        kept: KeptOpen | None = None,
    ) -> None:
        """``warm_entries``: keep up to this many decoded values in this process between
        epochs (0: off); ``warm_key``: the job's key for the cache file other workers read
        (none: no file). See :mod:`stator.state.warm`. ``kept``: where a task that runs
        epoch after epoch in this process keeps the database open between them."""
        self.path, self.options = path, options
        self.kept = kept
        # The open database is exactly the committed state of ``epoch`` (a commit ran and
        # nothing since): only then may it be kept open for the next epoch.
        self._committed = False
        self.warm_entries, self.warm_key = warm_entries, warm_key
        self._warm: dict[int, tuple[dict[bytes, Any], bool]] = {}
        self.warm_hit = False
        self.key_groups, self.max_parallelism, self.operator_uid = (
            key_groups,
            max_parallelism,
            operator_uid,
        )
        self.db: rocksdict.Rdict | None = None
        self.epoch = 0
        # Which commit the state is (random per commit, hex; "" before the first): two
        # databases at the same epoch may be of different lineages (a run from a savepoint,
        # another run of the job on the same disks), and only this tells them apart.
        self.commit_token = ""
        self.watermark = MIN_WATERMARK
        self.registry: dict[str, dict[str, Any]] = {}
        self.tables: dict[str, Table] = {}
        self.timers: TimerStore | None = None
        self._registry_changed = False
        # Non-keyed state (``operator_state.py``): the committed blob, its states as stored
        # (those not declared this epoch are kept as they are), and the declared ones' tables.
        self.operator_blob = b""
        self._operator_image: opstate.Image = {}
        self.operator_tables: dict[str, opstate.OperatorTable] = {}
        self._operator_changed = False
        # The processing time TTL-enabled states compare against (the epoch's).
        self.clock = TtlClock()
        self.ttl_tables: dict[int, TtlValueTable | TtlMapTable] = {}
        self.ttl_cursor, self.ttl_removed = b"", False

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> KeyedBackend:
        self.path.mkdir(parents=True, exist_ok=True)
        db = self.kept.take(self.path) if self.kept is not None else None
        if db is None:
            db = rocksdict.Rdict(str(self.path), self.options.build())
            write = rocksdict.WriteOptions()
            # An epoch becomes durable when the task flushes at its end (or its checkpoint
            # snapshot does). (The stub declares disable_wal a method; at runtime it is a
            # property.)
            write.disable_wal = True  # type: ignore[method-assign,assignment]
            db.set_write_options(write)
        self.db, self._committed = db, False
        raw_epoch = db.get(META_EPOCH)
        self.epoch = _I64.unpack(raw_epoch)[0] if raw_epoch is not None else 0
        raw_wm = db.get(META_WATERMARK)
        self.watermark = _I64.unpack(raw_wm)[0] if raw_wm is not None else MIN_WATERMARK
        raw_states = db.get(META_STATES)
        self.registry = json.loads(raw_states) if raw_states is not None else {}
        raw_cursor = db.get(META_TTL_CURSOR) or b"\x00"
        # (whether the pass removed anything yet: it then compacts when it ends, cursor)
        self.ttl_removed, self.ttl_cursor = raw_cursor[0] == 1, raw_cursor[1:]
        raw_token = db.get(META_COMMIT)
        self.commit_token = raw_token.hex() if raw_token is not None else ""
        if self.warm_entries:
            self._warm = warm.take(str(self.path), raw_token, self.warm_key)
            self.warm_hit = bool(self._warm)
        raw_info = db.get(META_INFO)
        if raw_info is not None:
            info = json.loads(raw_info)
            if info["max_parallelism"] != self.max_parallelism:
                raise StateCompatibilityError(
                    f"operator '{self.operator_uid}': the state was written with "
                    f"maxParallelism={info['max_parallelism']}, the job now uses "
                    f"{self.max_parallelism}. maxParallelism is fixed for the life of the state."
                )
        self.operator_blob = db.get(META_OPERATOR_STATE) or b""
        self._operator_image = opstate.decode(
            self.operator_blob, f"of operator '{self.operator_uid}'"
        )
        self.timers = TimerStore(db)
        return self

    def close(self) -> None:
        if self.db is None:
            return
        if self.kept is not None and self._committed:
            self.kept.give(self.path, self.db)  # open, unflushed, for this process's next epoch
        else:
            self.db.flush()
            self.db.close()
        self.db, self._committed = None, False

    def __enter__(self) -> KeyedBackend:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ state registration

    def table(self, desc: StateDescriptor) -> Table:
        """The cache of a declared state; checks it against what is stored under its name."""
        existing = self.tables.get(desc.name)
        if existing is not None:
            return existing
        assert self.db is not None, "open() the backend first"
        sid = self._register(desc, desc.kind.value)
        table: Table
        if desc.ttl is None:
            table = table_for(self.db, sid, desc)
        else:
            table = self.ttl_tables[sid] = ttl_table_for(self.db, sid, desc, self.clock)
        cached = self._warm.pop(sid, None)
        if cached is not None and not isinstance(table, MapTable):
            table.cache, table.complete = cached
        self.tables[desc.name] = table
        return table

    def operator_table(
        self, desc: ListStateDescriptor | MapStateDescriptor, kind: opstate.OperatorStateKind
    ) -> opstate.OperatorTable:
        """The heap table of a declared non-keyed state (``operator_state.py``); checks it
        against what is stored under its name, as ``table`` does."""
        existing = self.operator_tables.get(desc.name)
        if existing is not None:
            if existing.kind is not kind:
                raise StateCompatibilityError(
                    f"state '{desc.name}' of operator '{self.operator_uid}' is declared both "
                    f"as {existing.kind} and as {kind} state; give each its own name"
                )
            return existing
        assert self.db is not None, "open() the backend first"
        expected = (
            MapStateDescriptor
            if kind is opstate.OperatorStateKind.BROADCAST
            else ListStateDescriptor
        )
        if not isinstance(desc, expected):
            raise TypeError(
                f"{kind} state '{getattr(desc, 'name', desc)}' is declared with a "
                f"{type(desc).__name__}; it takes a {expected.__name__}"
            )
        self._register(desc, kind.value)
        raw = self._operator_image.get(desc.name)
        table: opstate.OperatorTable
        if isinstance(desc, MapStateDescriptor):
            table = opstate.BroadcastTable(desc, raw)
        else:
            table = opstate.OperatorListTable(desc, kind, raw)
        self.operator_tables[desc.name] = table
        return table

    def _register(self, desc: StateDescriptor, kind: str) -> int:
        """The state id of a declared state, recorded in the registry if it is new."""
        entry: dict[str, Any] = {
            "kind": kind,
            "serializer": desc.serializer.name,
            "version": desc.serializer.version,
        }
        if isinstance(desc, MapStateDescriptor):
            entry["key_serializer"] = desc.key_serializer.name
        ttl = getattr(desc, "ttl", None)
        if ttl is not None:
            entry["ttl"] = ttl.registry_entry()
        stored = self.registry.get(desc.name)
        if stored is not None:
            self._check_compatible(desc.name, stored, entry)
            if stored.get("ttl") != entry.get("ttl"):  # a new duration or update type
                stored["ttl"] = entry["ttl"]
                self._registry_changed = True
            return int(stored["sid"])
        used = {int(s["sid"]) for s in self.registry.values()}
        sid = next((i for i in range(MAX_STATE_ID + 1) if i not in used), None)
        if sid is None:
            raise StateCompatibilityError(
                f"operator '{self.operator_uid}' declares more than {MAX_STATE_ID + 1} states"
            )
        self.registry[desc.name] = {**entry, "sid": sid}
        self._registry_changed = True
        return sid

    def install_operator_state(self, image: opstate.Image) -> None:
        """Replace the non-keyed state (a restore's redistributed share), written at the next
        commit; the states must be in the registry."""
        self._operator_image = dict(image)
        self._operator_changed = True

    def _check_compatible(self, name: str, stored: dict[str, Any], entry: dict[str, Any]) -> None:
        where = f"state '{name}' of operator '{self.operator_uid}'"
        if stored["kind"] != entry["kind"]:
            raise StateCompatibilityError(
                f"{where} is stored as {stored['kind']} state but declared as {entry['kind']} "
                f"state; give the new state another name (and allowNonRestoredState to drop "
                f"the old one)"
            )
        for field in ("serializer", "key_serializer"):
            if field in entry and stored.get(field) != entry[field]:
                raise StateCompatibilityError(
                    f"{where} was written with serializer '{stored.get(field)}', the code now "
                    f"declares '{entry[field]}': the stored values cannot be read. Keep the old "
                    f"serializer or migrate the state offline"
                )
        if ("ttl" in stored) != ("ttl" in entry):
            now, was = ("with", "without") if "ttl" in entry else ("without", "with")
            raise StateCompatibilityError(
                f"{where} was written {was} TTL and is now declared {now} it: stored values "
                f"{'lack' if was == 'without' else 'carry'} the access time TTL needs. Keep the "
                f"state's TTL setting, or declare the state under a new name (and set "
                f"restore.allow_non_restored_state=true to drop the old one)"
            )
        if int(stored["version"]) > int(entry["version"]):
            raise StateCompatibilityError(
                f"{where} was written by serializer version {stored['version']}, newer than "
                f"this code's version {entry['version']}"
            )

    def mark_registry_changed(self) -> None:
        self._registry_changed = True

    def undeclared_states(self) -> list[str]:
        """Stored states that the code did not declare (in ``open``) this epoch."""
        return sorted(set(self.registry) - set(self.tables) - set(self.operator_tables))

    def drop_states(self, names: list[str]) -> int:
        """Forget states the code no longer has (allowNonRestoredState) and delete their
        entries, so a later state of the same name starts empty."""
        assert self.db is not None
        sids = {int(self.registry[n]["sid"]) for n in names}
        batch = rocksdict.WriteBatch(raw_mode=True)
        dropped = 0
        it = self.db.iter()
        it.seek_to_first()
        while it.valid():
            key = it.key()
            if (
                isinstance(key, bytes)
                and not key.startswith(META_PREFIX)
                and key[2:4] != TIMER_MARK
            ):
                n = (key[2] << 8) | key[3]
                if len(key) > 4 + n and key[4 + n] in sids:
                    batch.delete(key)
                    dropped += 1
            it.next()
        for name in names:
            del self.registry[name]
            if self._operator_image.pop(name, None) is not None:
                self._operator_changed = True
        self.db.write(batch)
        self._registry_changed = True
        return dropped

    # ------------------------------------------------------------------ reads

    def prefetch(self, tables: list[Table], kkeys: list[bytes]) -> None:
        """Load the state of ``kkeys`` for ``tables`` in one pass: a multi-get when few keys
        are wanted, one sequential scan when the epoch touches a large share of the state
        (a scan costs ~0.5 us per stored entry, a random read ~2 us per key). A scan of a
        state small enough for the warm cache keeps every entry it reads: the tables' caches
        are then complete, and later epochs in this process read nothing from RocksDB (a key
        missing from a complete cache is absent: read it with ``cache.get(k, MISSING)`` or
        ``Table.load``)."""
        assert self.db is not None
        # RocksDB key -> (the table whose cache wants it, its kkey there)
        wanted: dict[bytes, tuple[Table, bytes]] = {}
        for table in tables:
            if table.complete:  # a key not in the cache is absent: nothing to read
                continue
            sid, cache = table.sid_byte, table.cache
            wanted.update([(kk + sid, (table, kk)) for kk in kkeys if kk not in cache])
        if not wanted:
            return
        stored = self.db.property_int_value("rocksdb.estimate-num-keys") or 0
        if len(wanted) < SCAN_FRACTION * stored:
            for table in tables:
                table.prefetch(kkeys)
            return
        if stored <= self.warm_entries:
            self._load_all([t for t in tables if not t.complete])
            return
        it = self.db.iter()
        it.seek_to_first()
        nxt, valid, key_of, value_of = it.next, it.valid, it.key, it.value
        pop: Any = wanted.pop
        while valid():
            key = key_of()
            found = pop(key, None)
            if found is not None:
                table, kk = found
                table.cache[kk] = table.decode(value_of())
            nxt()
        for table, kk in wanted.values():  # not stored: known absent
            table.cache[kk] = MISSING

    def _load_all(self, tables: list[Table]) -> None:
        """Read every stored entry of ``tables`` into their caches (one scan) and mark them
        complete. Entries changed this epoch (dirty) keep their cached value."""
        assert self.db is not None
        by_sid = {t.sid: t for t in tables}
        found: dict[int, tuple[list[bytes], list[bytes]]] = {sid: ([], []) for sid in by_sid}
        get = found.get
        for k, raw in self.db.items():
            key = cast(bytes, k)  # raw mode: keys are bytes
            # kkey | sid: the length field says where the key ends (metadata keys are far
            # shorter than their "length" says; a timer's length field is its mark)
            if len(key) == ((key[2] << 8) | key[3]) + 5 and key[2:4] != TIMER_MARK:
                lists = get(key[-1])
                if lists is not None:
                    lists[0].append(key[:-1])
                    lists[1].append(raw)
        for sid, (kks, raws) in found.items():
            table = by_sid[sid]
            cache, decode = table.cache, table.decoder()  # updated in place: handles hold it
            cache.update(
                [(kk, decode(raw)) for kk, raw in zip(kks, raws, strict=True) if kk not in cache]
            )
            table.complete = True

    # ------------------------------------------------------------------ epochs

    def commit(self, epoch: int, watermark: int) -> int:
        """Write every change of this epoch and the epoch number in one atomic batch."""
        assert self.db is not None and self.timers is not None
        batch = rocksdict.WriteBatch(raw_mode=True)
        written = 0
        cleanup, compact = None, False
        if self.ttl_tables:
            budget = max(t.cleanup_scan for t in self.ttl_tables.values())
            cleanup = scan_expired(
                self.db, self.ttl_tables, self.clock.now_ms, budget, self.ttl_cursor
            )
            for key, value in cleanup.puts:
                if value is None:
                    batch.delete(key)
                else:
                    batch.put(key, value)
            removed = self.ttl_removed or bool(cleanup.puts)
            compact = removed and cleanup.pass_ended
            self.ttl_removed, self.ttl_cursor = removed and not compact, cleanup.cursor
            batch.put(META_TTL_CURSOR, bytes((self.ttl_removed,)) + cleanup.cursor)
        for table in self.tables.values():
            written += table.write_to(batch)
        written += self.timers.write_to(batch)
        written += self._write_operator_state(batch)
        token = os.urandom(16)
        batch.put(META_COMMIT, token)
        batch.put(META_EPOCH, _I64.pack(epoch))
        batch.put(META_WATERMARK, _I64.pack(watermark))
        if self._registry_changed or self.epoch == 0:
            batch.put(META_STATES, json.dumps(self.registry, sort_keys=True).encode())
            info = {"max_parallelism": self.max_parallelism, "operator_uid": self.operator_uid}
            batch.put(META_INFO, json.dumps(info, sort_keys=True).encode())
        self.db.write(batch)
        if cleanup is not None and compact:  # the removed bytes leave the SST files too
            self.db.compact_range(None, None)
        self.epoch, self.watermark, self._registry_changed = epoch, watermark, False
        for optable in self.operator_tables.values():
            optable.changed = False
        self._operator_changed = False
        self.commit_token, self._committed = token.hex(), True
        keep: dict[int, tuple[dict[bytes, Any], bool]] = {}
        for table in self.tables.values():
            if self.warm_entries and not isinstance(table, MapTable):
                table.dirty.clear()  # the cache now equals the committed state
                keep[table.sid] = (table.cache, table.complete)
            else:
                table.reset()
        self.timers.reset()
        if keep:
            warm.give(str(self.path), token, keep, self.warm_entries, self.warm_key)
        return written

    def _write_operator_state(self, batch: rocksdict.WriteBatch) -> int:
        """The non-keyed state's blob, rewritten whole if any of it changed."""
        changed = [t for t in self.operator_tables.values() if t.changed]
        if not changed and not self._operator_changed:
            return 0
        image = {**self._operator_image, **{t.name: t.raw() for t in changed}}
        blob = opstate.encode(image) if image else b""
        opstate.check_size(blob, self.operator_uid, image)
        if blob:
            batch.put(META_OPERATOR_STATE, blob)
        else:
            batch.delete(META_OPERATOR_STATE)
        self._operator_image, self.operator_blob = image, blob
        return 1

    # ------------------------------------------------------------------ snapshots

    def snapshot_to(self, dest: Path) -> list[LocalFile]:
        """A native-checkpoint equivalent: flush, then hard-link the live SST files and copy the
        manifest, so ``dest`` is a consistent, openable copy of the committed state.

        Auto compactions are switched off first and running ones awaited, so no file can be
        deleted between listing the live files and linking them.
        """
        assert self.db is not None
        db = self.db
        db.set_options({"disable_auto_compactions": "true"})
        deadline = time.monotonic() + 600
        while (db.property_int_value("rocksdb.num-running-compactions") or 0) > 0 or (
            db.property_int_value("rocksdb.num-running-flushes") or 0
        ) > 0:
            if time.monotonic() > deadline:
                raise TimeoutError("RocksDB compaction did not finish within 600 s")
            time.sleep(0.005)
        db.flush()
        live = db.live_files()
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        files: list[LocalFile] = []
        for meta in live:
            name = str(meta["name"]).lstrip("/")
            os.link(self.path / name, dest / name)
            files.append(LocalFile(name, int(meta["size"]), True))
        current = (self.path / "CURRENT").read_text().strip()
        private = [current, *ROCKSDB_SMALL_FILES, _latest_options(self.path)]
        for name in private:
            if (self.path / name).exists():
                shutil.copyfile(self.path / name, dest / name)
                files.append(LocalFile(name, (dest / name).stat().st_size, False))
        db.set_options({"disable_auto_compactions": "false"})
        return files


class KeptOpen:
    """Databases a long-running task keeps open between its epochs (``longrun/task.py``):
    opening a subtask's RocksDB and closing it again took about 45% of a keyed task's time
    at 20,000 records/s (py-spy). A database is kept only as its last commit left it, and
    is taken out while an epoch uses it; one that is not at the epoch the next open expects
    is closed and opened again by the usual path (``locality/restore.py``). Without a flush
    per epoch, an epoch is durable on disk once a checkpoint's snapshot flushed it or the
    database is closed: a task that dies leaves older state on disk, which the epoch and
    commit checks of the next open find and restore over."""

    def __init__(self) -> None:
        self._open: dict[Path, rocksdict.Rdict] = {}

    def take(self, path: Path) -> rocksdict.Rdict | None:
        return self._open.pop(path, None)

    def give(self, path: Path, db: rocksdict.Rdict) -> None:
        old = self._open.pop(path, None)
        if old is not None and old is not db:
            old.flush()
            old.close()
        self._open[path] = db

    def close(self) -> None:
        """Flush and close every kept database (the task ends)."""
        while self._open:
            _, db = self._open.popitem()
            db.flush()
            db.close()


def _latest_options(path: Path) -> str:
    options = sorted(path.glob("OPTIONS-*"), key=lambda p: int(p.name.split("-")[1]))
    return options[-1].name if options else ""
