"""Moving keyed state by key-group: export a backend's key-groups to savepoint files, import
key-groups' rows (from savepoint files, or from other subtasks' databases when rescaling a
checkpoint) into a fresh backend, keeping exactly the key-groups of its range."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import rocksdict

from ..keygroups import KeyGroupRange
from ..state.backend import KeyedBackend
from ..state.layout import (
    HEADER,
    META_STATES,
    is_timer_key,
    key_group_prefix,
    kkey_bytes,
    split_timer,
    timer_key,
)
from ..storage import TRANSFER_CALLERS, ObjectStore
from .format import (
    LENGTH,
    STATE_ENTRY,
    STATE_HEAD,
    FormatError,
    KeyGroupWriter,
    StateEntry,
    TimerEntry,
    decode_key_group,
)
from .ingest import SstIngest

Entry = StateEntry | TimerEntry
UPLOAD_WINDOW = 8  # key-group files built ahead of their upload


SCAN_READAHEAD_BYTES = 2 * 1024 * 1024


def _scan() -> rocksdict.ReadOptions:
    """Read options for scanning whole key-groups: read ahead (a savepoint's encoding of
    500,000 entries from the page cache: 0.70-0.77 s instead of 0.81-0.87 s). The block
    cache stays filled: without it every key-group's iterator read the tables' index blocks
    again (1.2 s in a fresh process)."""
    options = rocksdict.ReadOptions()
    options.set_readahead_size(SCAN_READAHEAD_BYTES)
    return options


def state_catalog(registry: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The savepoint's view of an operator's states: everything but the internal state id."""
    return {name: {k: v for k, v in meta.items() if k != "sid"} for name, meta in registry.items()}


# ------------------------------------------------------------------------------------- export


def iter_key_group(db: rocksdict.Rdict, kg: int, sid_to_index: dict[int, int]) -> Iterator[Entry]:
    """The entries of one key-group of a database, in key order."""
    prefix = key_group_prefix(kg)
    for raw_key, raw_value in db.items(from_key=prefix, read_opt=_scan()):
        key, value = cast(bytes, raw_key), cast(bytes, raw_value)
        if key[:2] != prefix:
            break
        if is_timer_key(key):
            ts, domain, kkey = split_timer(key)
            yield TimerEntry(domain, ts, kkey_bytes(kkey))
        else:
            n = (key[2] << 8) | key[3]
            index = sid_to_index.get(key[4 + n])
            if index is not None:  # entries of dropped states are left behind
                yield StateEntry(index, key[4 : 4 + n], key[5 + n :], value)


def _encode_key_group(
    db: rocksdict.Rdict, kg: int, sid_to_index: dict[int, int], writer: KeyGroupWriter
) -> None:
    """``iter_key_group`` into ``writer``, with ``encode_state`` inlined: a savepoint spends
    most of its time here, once per entry."""
    prefix = key_group_prefix(kg)
    head, length = STATE_HEAD.pack, LENGTH.pack
    encoded: list[bytes] = []
    append = encoded.append
    # Annotated, not cast per entry: typing.cast is a call, 4% of a savepoint's time.
    items: Iterator[tuple[bytes, bytes]] = db.items(from_key=prefix, read_opt=_scan())  # type: ignore[assignment]
    for key, value in items:
        if key[:2] != prefix:
            break
        if is_timer_key(key):  # after every state entry of the key-group
            writer.encoded(encoded)
            encoded.clear()
            ts, domain, kkey = split_timer(key)
            writer.timer(domain, ts, kkey_bytes(kkey))
            continue
        n = (key[2] << 8) | key[3]
        index = sid_to_index.get(key[4 + n])
        if index is None:  # entries of dropped states are left behind
            continue
        user_key = key[5 + n :]
        append(
            b"".join(
                (
                    head(STATE_ENTRY, index, n),
                    key[4 : 4 + n],
                    length(len(user_key)),
                    user_key,
                    length(len(value)),
                    value,
                )
            )
        )
    writer.encoded(encoded)


def export_key_groups(
    backend: KeyedBackend, store: ObjectStore, prefix: str, compression: str
) -> dict[int, dict[str, Any]]:
    """Write each non-empty key-group of the backend's range to ``prefix/kg-<kg>.bin``."""
    assert backend.db is not None
    names = sorted(backend.registry)
    sid_to_index = {int(backend.registry[n]["sid"]): i for i, n in enumerate(names)}
    written: dict[int, dict[str, Any]] = {}

    def put(item: tuple[int, bytes, int]) -> None:
        kg, data, entries = item
        name = f"{prefix}/kg-{kg:05d}.bin"
        store.put(name, data)
        written[kg] = {"file": name, "bytes": len(data), "entries": entries}

    with ThreadPoolExecutor(TRANSFER_CALLERS) as pool:
        pending: list[Future[None]] = []
        for kg in backend.key_groups:
            writer = KeyGroupWriter()
            _encode_key_group(backend.db, kg, sid_to_index, writer)
            if writer.entries:
                while len(pending) >= UPLOAD_WINDOW:  # bound the bytes held for upload
                    pending.pop(0).result()
                pending.append(pool.submit(put, (kg, writer.finish(compression), writer.entries)))
        for f in pending:
            f.result()
    return written


# ------------------------------------------------------------------------------------- import


Rows = list[tuple[bytes, bytes]]  # database rows of one key-group, in this layout
_SID = [bytes((i,)) for i in range(256)]  # state index -> state id byte (ids are one byte)


def import_rows(
    backend: KeyedBackend, catalog: dict[str, dict[str, Any]], batches: Iterable[tuple[int, Rows]]
) -> int:
    """Write ``(key-group, rows)`` batches into a freshly opened, empty backend; key-groups
    outside its range are dropped. State ids in the rows are indexes into the sorted
    ``catalog``, which becomes the backend's registry."""
    assert backend.db is not None
    owned = backend.key_groups
    registry = {name: {**catalog[name], "sid": i} for i, name in enumerate(sorted(catalog))}
    ingest = SstIngest(
        backend.db, backend.options, backend.path.parent / f".ingest-{backend.path.name}"
    )
    count = 0
    try:
        for kg, rows in batches:
            if kg in owned:
                ingest.add(kg, rows)
                count += len(rows)
    except BaseException:
        ingest.discard()  # staged files only: the database has not been touched
        raise
    ingest.finish()
    backend.registry = registry
    backend.mark_registry_changed()
    return count


def savepoint_rows(
    store: ObjectStore, key_groups: dict[int, dict[str, Any]], owned: KeyGroupRange
) -> Iterator[tuple[int, Rows]]:
    """The owned key-groups' files as database rows, in key-group order, fetched in parallel
    a few files ahead (so memory holds a window of files, not the whole state). A file's
    state index is its state's id: both number the sorted state names."""
    wanted = sorted(kg for kg in key_groups if kg in owned)
    ahead = 8
    with ThreadPoolExecutor(TRANSFER_CALLERS) as pool:
        futures = [pool.submit(store.get, key_groups[kg]["file"]) for kg in wanted[:ahead]]
        for i, kg in enumerate(wanted):
            data = futures[i].result()
            futures[i] = None  # type: ignore[call-overload]
            if i + ahead < len(wanted):
                futures.append(pool.submit(store.get, key_groups[wanted[i + ahead]]["file"]))
            where = store.url(key_groups[kg]["file"])
            expected = key_groups[kg].get("bytes")
            if expected is not None and len(data) != expected:  # caught before any entry
                raise FormatError(
                    f"{where}: {len(data)} bytes, the savepoint's metadata says {expected}; "
                    f"the file is truncated or was replaced; restore from another savepoint or "
                    f"a retained checkpoint (nothing was written to the job's state)"
                )
            yield kg, decode_key_group(data, where, *_row_makers(kg))


def _row_makers(
    kg: int,
) -> tuple[
    Callable[[int, bytes, bytes, bytes], tuple[bytes, bytes]],
    Callable[[int, int, bytes], tuple[bytes, bytes]],
]:
    """How a key-group file's state entries and timers become rows of key-group ``kg``."""
    header = HEADER.pack

    def state(index: int, key: bytes, user_key: bytes, value: bytes) -> tuple[bytes, bytes]:
        return header(kg, len(key)) + key + _SID[index] + user_key, value

    def timer(domain: int, timestamp: int, key: bytes) -> tuple[bytes, bytes]:
        return timer_key(header(kg, len(key)) + key, domain, timestamp), b""

    return state, timer


def database_rows(path: Path, owned: KeyGroupRange, names: list[str]) -> Iterator[tuple[int, Rows]]:
    """The owned key-groups of another subtask's (restored) database as rows, copied as they
    are but for the state id, translated to its index in ``names`` (entries of states not in
    ``names`` are left behind)."""
    with _read_only(path) as (db, registry):
        new_sid = {
            int(meta["sid"]): _SID[names.index(name)]
            for name, meta in registry.items()
            if name in names
        }
        for kg in owned:
            prefix = key_group_prefix(kg)
            rows: Rows = []
            items: Iterator[tuple[bytes, bytes]] = db.items(from_key=prefix, read_opt=_scan())  # type: ignore[assignment]
            for key, value in items:
                if key[:2] != prefix:
                    break
                if is_timer_key(key):
                    rows.append((key, value))
                    continue
                at = 4 + ((key[2] << 8) | key[3])
                sid = new_sid.get(key[at])
                if sid is not None:
                    rows.append((key[:at] + sid + key[at + 1 :], value))
            yield kg, rows


def database_entries(
    path: Path, owned: KeyGroupRange, names: list[str]
) -> Iterator[tuple[int, Entry]]:
    """Entries of the owned key-groups in another subtask's (restored) database, with its state
    ids translated to indexes into ``names``."""
    with _read_only(path) as (db, registry):
        sid_to_index = {int(meta["sid"]): names.index(name) for name, meta in registry.items()}
        for kg in owned:
            for entry in iter_key_group(db, kg, sid_to_index):
                yield kg, entry


@contextmanager
def _read_only(path: Path) -> Iterator[tuple[rocksdict.Rdict, dict[str, dict[str, Any]]]]:
    """A subtask's database opened read-only, and its state registry."""
    db = rocksdict.Rdict(
        str(path), rocksdict.Options(raw_mode=True), access_type=rocksdict.AccessType.read_only()
    )
    try:
        raw = db.get(META_STATES)
        yield db, (json.loads(raw) if raw is not None else {})
    finally:
        db.close()
