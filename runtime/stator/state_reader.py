"""The offline state reader: a savepoint or checkpoint as a Spark DataFrame, for inspection
and migration (like Flink's State Processor API or Spark's state data source).

    from stator.state_reader import read_state
    df = read_state(spark, "s3://bucket/savepoints/job/savepoint-0000000042-ab12cd")
    df.where("operator_uid = 'running-total'").show()

Columns: operator_uid, state_name, state_kind (value|list|map|reducing|aggregating|timer|
broadcast|operator_list|union_list), key_group, key, user_key, value (an aggregating state's
accumulator, not its result: the reader has no aggregate function). Keys and values are JSON
text of the decoded Python values (repr for what JSON cannot hold); values of custom
serializers are given as hex of their bytes. Timers appear with state_kind "timer", the
timestamp as value and user_key "event" or "processing".
Values of TTL-enabled states are given without their access stamps; values (list elements,
map entries) expired at ``now_ms`` (default: the wall clock when reading) are left out.
Non-keyed state (broadcast and operator list state) is in no key-group: key_group is -1, key
the subtask that holds it, user_key the broadcast entry's key or the list element's position;
it is read from the metadata (no download).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .checkpoint.metadata import CheckpointMetadata, SubtaskSnapshot
from .checkpoint.transfer import download_snapshot
from .keygroups import KeyGroupRange, decode_key
from .lineage import load_target
from .savepoint.format import StateEntry, TimerEntry, read_key_group
from .savepoint.metadata import SavepointMetadata
from .savepoint.transfer import database_entries, state_catalog
from .state import operator_state as opstate
from .state.backend import KeyedBackend
from .state.options import RocksDBOptions
from .state.serializers import by_name
from .state.tables import decode_list
from .state.ttl import STAMP, STAMP_BYTES
from .storage import ObjectStore, S3Options

COLUMNS = ["operator_uid", "state_name", "state_kind", "key_group", "key", "user_key", "value"]
Row = tuple[str, str, str, int, str, str | None, str]


def _text(value: Any) -> str:
    return json.dumps(value, default=repr, sort_keys=True)


def _value(meta: dict[str, Any], raw: bytes, now_ms: int) -> str | None:
    """The value's text; None if it expired (TTL)."""
    ttl = meta.get("ttl")
    if ttl is not None:
        raw = _unexpired(raw, meta.get("kind") == "list", int(ttl["ttl_ms"]), now_ms)
        if not raw:
            return None
    serializer = by_name(str(meta.get("serializer")))
    if serializer is None:
        return raw.hex()
    if meta.get("kind") == "list":
        return _text(decode_list(raw, serializer))
    return _text(serializer.loads(raw))


def _unexpired(raw: bytes, is_list: bool, ttl_ms: int, now_ms: int) -> bytes:
    """A TTL-enabled value without its stamps (b"" if expired): a list's live elements in
    the layout of a list without TTL (``ttl_tables.TtlListTable``)."""
    if not is_list:
        return raw[STAMP_BYTES:] if STAMP.unpack_from(raw)[0] + ttl_ms > now_ms else b""
    kept, pos = [], 0
    while pos < len(raw):
        n = int.from_bytes(raw[pos : pos + 4], "big")
        if STAMP.unpack_from(raw, pos + 4)[0] + ttl_ms > now_ms:
            kept.append(
                (n - STAMP_BYTES).to_bytes(4, "big") + raw[pos + 4 + STAMP_BYTES : pos + 4 + n]
            )
        pos += 4 + n
    return b"".join(kept)


def _rows(
    uid: str,
    catalog: dict[str, dict[str, Any]],
    entries: Iterator[tuple[int, StateEntry | TimerEntry]],
    now_ms: int,
) -> Iterator[Row]:
    names = sorted(catalog)
    for kg, entry in entries:
        key = _text(decode_key(entry.key))
        if isinstance(entry, TimerEntry):
            domain = "event" if entry.domain == 0 else "processing"
            yield uid, "", "timer", kg, key, domain, str(entry.timestamp)
            continue
        name = names[entry.state]
        meta = catalog[name]
        user_key = None
        if meta.get("kind") == "map":
            uks = by_name(str(meta.get("key_serializer")))
            user_key = _text(uks.loads(entry.user_key)) if uks else entry.user_key.hex()
        value = _value(meta, entry.value, now_ms)
        if value is not None:
            yield uid, name, str(meta.get("kind")), kg, key, user_key, value


def _savepoint_rows(
    store: ObjectStore,
    uid: str,
    catalog: dict[str, dict[str, Any]],
    kg: int,
    file: str,
    now_ms: int,
) -> list[Row]:
    entries = ((kg, e) for e in read_key_group(store.get(file), store.url(file)))
    return list(_rows(uid, catalog, entries, now_ms))


def database_rows(
    db: Path, uid: str, owned: KeyGroupRange, max_parallelism: int, now_ms: int | None = None
) -> list[Row]:
    """The rows of one subtask's RocksDB database at ``db`` (a downloaded checkpoint, or a
    stopped job's local state), restricted to the key-groups it ``owned``."""
    with KeyedBackend(db, RocksDBOptions(), owned, max_parallelism, uid) as probe:
        catalog = state_catalog(probe.registry)
    now = _now(now_ms)
    return list(_rows(uid, catalog, database_entries(db, owned, sorted(catalog)), now))


def _now(now_ms: int | None) -> int:
    return int(time.time() * 1000) if now_ms is None else now_ms


def _checkpoint_rows(
    store: ObjectStore, uid: str, snap: SubtaskSnapshot, max_parallelism: int, now_ms: int
) -> list[Row]:
    work = Path(tempfile.mkdtemp(prefix="stator-reader-"))
    try:
        db = work / "db"
        download_snapshot(store, snap.files, db)
        return database_rows(db, uid, KeyGroupRange(*snap.key_groups), max_parallelism, now_ms)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def operator_state_rows(meta: CheckpointMetadata | SavepointMetadata) -> list[Row]:
    """Every subtask's non-keyed state, from the blobs the metadata carries."""
    by_operator: dict[str, dict[int, str]] = {}
    if isinstance(meta, SavepointMetadata) and not meta.native:
        by_operator = {uid: dict(op.operator_states) for uid, op in meta.operators.items()}
    else:
        for uid, op in meta.operators.items():
            by_operator[uid] = {s.index: s.operator_state for s in op.subtasks}
    rows: list[Row] = []
    for uid, blobs in sorted(by_operator.items()):
        for subtask, text in sorted(blobs.items()):
            where = f"of operator '{uid}' subtask {subtask}"
            image = opstate.decode(opstate.from_text(text, where), where)
            for name, raw in sorted(image.items()):
                rows += _operator_rows(uid, name, subtask, raw)
    return rows


def _operator_rows(uid: str, name: str, subtask: int, raw: opstate.RawState) -> list[Row]:
    serializer, uks = by_name(raw.serializer), by_name(raw.key_serializer)

    def value(data: bytes) -> str:
        return _text(serializer.loads(data)) if serializer else data.hex()

    key, kind, e = _text(subtask), str(raw.kind), raw.elements
    if raw.kind is not opstate.OperatorStateKind.BROADCAST:
        return [(uid, name, kind, -1, key, str(i), value(x)) for i, x in enumerate(e)]
    return [
        (uid, name, kind, -1, key, _text(uks.loads(e[i])) if uks else e[i].hex(), value(e[i + 1]))
        for i in range(0, len(e), 2)
    ]


def read_state(spark: Any, uri: str, s3: S3Options | None = None, now_ms: int | None = None) -> Any:
    """The state in the savepoint or checkpoint at ``uri`` as a DataFrame (read in parallel:
    one Spark task per key-group file or per checkpointed subtask); TTL-enabled values
    expired at ``now_ms`` (default: now) are left out."""
    from pyspark.sql.types import (  # noqa: PLC0415
        IntegerType,
        StringType,
        StructField,
        StructType,
    )

    target = load_target(uri, s3 or S3Options())
    store, meta = target.store, target.meta
    now = _now(now_ms)
    sc = spark.sparkContext
    if isinstance(meta, CheckpointMetadata) or meta.native:  # each subtask's database files
        tasks: list[Any] = [(uid, s) for uid, op in meta.operators.items() for s in op.subtasks]
        mp = meta.max_parallelism
        rdd = sc.parallelize(tasks, max(1, len(tasks))).flatMap(
            lambda t: _checkpoint_rows(store, t[0], t[1], mp, now)
        )
    else:
        tasks = [
            (uid, op.states, kg, info["file"])
            for uid, op in meta.operators.items()
            for kg, info in sorted(op.key_groups.items())
        ]
        rdd = sc.parallelize(tasks, max(1, min(len(tasks), 64))).flatMap(
            lambda t: _savepoint_rows(store, t[0], t[1], t[2], t[3], now)
        )
    rdd = rdd.union(sc.parallelize(operator_state_rows(meta), 1))
    schema = StructType(
        [
            StructField("operator_uid", StringType(), False),
            StructField("state_name", StringType(), False),
            StructField("state_kind", StringType(), False),
            StructField("key_group", IntegerType(), False),
            StructField("key", StringType(), False),
            StructField("user_key", StringType(), True),
            StructField("value", StringType(), False),
        ]
    )
    return spark.createDataFrame(rdd, schema)
