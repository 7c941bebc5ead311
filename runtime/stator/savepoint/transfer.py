"""Moving keyed state by key-group: export a backend's key-groups to savepoint files, import
entries (from savepoint files, or from other subtasks' databases when rescaling a checkpoint)
into a fresh backend, keeping exactly the key-groups of its range."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
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
    read_key_group,
)
from .ingest import SstIngest

Entry = StateEntry | TimerEntry
UPLOAD_WINDOW = 8  # key-group files built ahead of their upload


def state_catalog(registry: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The savepoint's view of an operator's states: everything but the internal state id."""
    return {name: {k: v for k, v in meta.items() if k != "sid"} for name, meta in registry.items()}


# ------------------------------------------------------------------------------------- export


def iter_key_group(db: rocksdict.Rdict, kg: int, sid_to_index: dict[int, int]) -> Iterator[Entry]:
    """The entries of one key-group of a database, in key order."""
    prefix = key_group_prefix(kg)
    for raw_key, raw_value in db.items(from_key=prefix):
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
    for raw_key, raw_value in db.items(from_key=prefix):
        key, value = cast(bytes, raw_key), cast(bytes, raw_value)
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


def import_entries(
    backend: KeyedBackend,
    names: list[str],
    catalog: dict[str, dict[str, Any]],
    entries: Iterable[tuple[int, Entry]],
) -> int:
    """Write ``(key-group, entry)`` pairs into a freshly opened, empty backend; entries outside
    the backend's key-group range are dropped. ``names[i]`` is the state of index ``i``."""
    assert backend.db is not None
    owned = backend.key_groups
    registry = {name: {**catalog[name], "sid": i} for i, name in enumerate(sorted(catalog))}
    sid_of = [bytes((registry[n]["sid"],)) for n in names]
    ingest = SstIngest(
        backend.db, backend.options.build(), backend.path.parent / f".ingest-{backend.path.name}"
    )
    add, header = ingest.add, HEADER.pack
    count = 0
    try:
        for kg, entry in entries:
            if kg not in owned:
                continue
            if len(entry) == 4:  # a StateEntry
                state, key, user_key, value = entry
                add(kg, b"".join((header(kg, len(key)), key, sid_of[state], user_key)), value)
            else:
                domain, timestamp, key = entry
                add(kg, timer_key(header(kg, len(key)) + key, domain, timestamp), b"")
            count += 1
    except BaseException:
        ingest.discard()  # staged files only: the database has not been touched
        raise
    ingest.finish()
    backend.registry = registry
    backend.mark_registry_changed()
    return count


def savepoint_entries(
    store: ObjectStore, key_groups: dict[int, dict[str, Any]], owned: KeyGroupRange
) -> Iterator[tuple[int, Entry]]:
    """Entries of the owned key-groups' files in key-group order, fetched in parallel a few
    files ahead (so memory holds a window of files, not the whole state)."""
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
            for entry in read_key_group(data, where):
                yield kg, entry


def database_entries(
    path: Path, owned: KeyGroupRange, names: list[str]
) -> Iterator[tuple[int, Entry]]:
    """Entries of the owned key-groups in another subtask's (restored) database, with its state
    ids translated to indexes into ``names``."""
    db = rocksdict.Rdict(
        str(path), rocksdict.Options(raw_mode=True), access_type=rocksdict.AccessType.read_only()
    )
    try:
        raw = db.get(META_STATES)
        registry: dict[str, dict[str, Any]] = json.loads(raw) if raw is not None else {}
        sid_to_index = {int(meta["sid"]): names.index(name) for name, meta in registry.items()}
        for kg in owned:
            for entry in iter_key_group(db, kg, sid_to_index):
                yield kg, entry
    finally:
        db.close()
