"""Benchmark cases. Each runs in a fresh Python process with its own local[2] Spark (see
``bench.__main__``), so no case inherits another's warm JVM, and returns a JSON-able dict.

Every case generates the same events: ``KeyedEvents(num_keys, seed=1)``, i.e. record ``i`` is
``("k" + str(((i * 2654435761 + 1) & 0xFFFFFFFF) % num_keys), 1, i)``. Every counting case
checks its result before it returns a time: the per-key counts in its final state (Stator:
the subtasks' RocksDB databases, read after the job ended; Spark: its state store, through
Spark's state data source) must equal :func:`expected_counts`, computed from the formula
above without Stator or Spark. A wrong result raises ``WrongOutput``; the run never counts.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness import WrongOutput
from stator import (
    INT64,
    EpochResult,
    Job,
    KeyedBroadcastProcessFunction,
    KeyedProcessFunction,
    MapStateDescriptor,
    Pipeline,
    ValueStateDescriptor,
)
from stator.checkpoint.metadata import CheckpointMetadata
from stator.config import LONG_RUNNING, SparkConfig, load_config
from stator.driver.spark_session import create_session
from stator.keygroups import SubtaskId, range_for_subtask
from stator.longrun.driver import session_config
from stator.sinks.base import Sink, SinkWriter
from stator.sources import GeneratorSource, KeyedEvents, SweepEvents
from stator.sources.generator import list_source

SEED, MULT = 1, 2654435761
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


class _CountingWriter(SinkWriter):
    def __init__(self) -> None:
        self.n = 0

    def write(self, values: list[Any]) -> None:
        self.n += len(values)

    def finish(self) -> tuple[dict[str, Any], Any]:
        return {"part": "bench", "records": self.n}, None


class NoopSink(Sink):
    """Counts records and drops them: the peer of Spark's ``noop`` format."""

    def writer(self, uid: str, epoch: int, part: str) -> SinkWriter:
        return _CountingWriter()


def _cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    total = sum(fields) / os.sysconf("SC_CLK_TCK")
    idle = (fields[3] + fields[4]) / os.sysconf("SC_CLK_TCK")
    return total - idle, total


def _workdir(name: str) -> Path:
    """A fresh directory; its name is unique, so checkpoint paths derived from it never
    collide with an earlier run's (which the job would otherwise restore from)."""
    path = Path(tempfile.gettempdir()) / "stator-bench" / f"{name}-{uuid.uuid4().hex[:8]}"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def _spark(extra: dict[str, str] | None = None) -> Any:
    return create_session(SparkConfig(master="local[2]", conf=extra or {}), "stator-bench")


def stator_spark(settings: Sequence[str]) -> Any:
    """The bench's session for a Stator job with ``settings``: ``local[2]``, with a task slot
    per task if they ask for long-running tasks (as ``Job`` does for its own session)."""
    if load_config(None, list(settings)).epoch.tasks != LONG_RUNNING:
        return _spark()
    return create_session(session_config(SparkConfig(master="local[2]")), "stator-bench")


def expected_counts(events: int, keys: int) -> dict[str, int]:
    """Per-key counts of ``KeyedEvents(keys, seed=1)``'s first ``events`` records, from the
    generator's formula alone (vectorized: no Stator, no Spark)."""
    i = np.arange(events, dtype=np.uint64)
    ids = ((i * np.uint64(MULT) + np.uint64(SEED)) & np.uint64(0xFFFFFFFF)) % np.uint64(keys)
    counts = np.bincount(ids.astype(np.int64), minlength=keys)
    return {f"k{k}": int(n) for k, n in enumerate(counts) if n}


def check_counts(what: str, got: dict[str, int], events: int, keys: int) -> None:
    expected = expected_counts(events, keys)
    if got != expected:
        wrong = [k for k in expected if got.get(k) != expected[k]][:3]
        extra = [k for k in got if k not in expected][:3]
        raise WrongOutput(
            f"{what}: {len(got)} keys in the final state, {len(expected)} expected; "
            f"first wrong: {[(k, got.get(k), expected[k]) for k in wrong]}, extra: {extra}"
        )


def _stator_counts(state_dir: Path, uid: str, max_parallelism: int) -> dict[str, int]:
    """The counts in the final state of operator ``uid``: every subtask's local database,
    read after the job ended (with or without checkpoints, the same files)."""
    import json

    from stator.state_reader import database_rows

    counts: dict[str, int] = {}
    for db in sorted(state_dir.glob(f"*/{uid}/*-of-*/db")):
        index, parallelism = (int(x) for x in db.parent.name.split("-of-"))
        owned = range_for_subtask(index, parallelism, max_parallelism)
        for row in database_rows(db, uid, owned, max_parallelism):
            if row[2] != "timer":
                counts[json.loads(row[4])] = int(json.loads(row[6]))
    return counts


class RunningCount(KeyedProcessFunction):
    """The README's example style: a ``ValueState`` per key, one output record per event."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", INT64))

    def process_element(self, event: Any, ctx: Any) -> Any:
        n = self.count.value(0) + 1
        self.count.update(n)
        yield (ctx.current_key, n)


RULES = MapStateDescriptor("rules")


class EnrichedCount(KeyedBroadcastProcessFunction):
    """:class:`RunningCount` enriched from broadcast state: every event reads the rule of its
    key's bucket (rules arrive on a broadcast stream), as a rule-driven job does."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", INT64))

    def process_element(self, event: Any, ctx: Any) -> Any:
        n = self.count.value(0) + 1
        self.count.update(n)
        rule = ctx.get_broadcast_state(RULES).get(len(event[0]) % BUCKETS, 0)
        yield (ctx.current_key, n, rule)

    def process_broadcast_element(self, rule: Any, ctx: Any) -> None:
        ctx.get_broadcast_state(RULES).put(rule[0], rule[1])


BUCKETS = 16


def stator_count(
    events: int,
    keys: int,
    epoch: int,
    checkpoint: bool = True,
    storage: str = "",
    function: str = "builtin",
    sync_upload: bool = False,
    s3_endpoint: str = "",
    inline_max_bytes: int | None = None,
    settings: Sequence[str] = (),
) -> dict[str, Any]:
    """Stator's keyed count, exactly-once checkpoints every epoch (or none): the built-in
    ``.count()`` (pre-combined before the shuffle, one update per key and epoch) or a user
    ``KeyedProcessFunction`` (:class:`RunningCount`, one output per event), or the same
    enriched from broadcast state (:class:`EnrichedCount`). ``sync_upload``:
    tasks upload their checkpoint files before they return (``checkpoint.async_upload``
    off). A run ends when its last checkpoint is complete, either way. ``s3_endpoint``: reach
    the store there (e.g. through a bandwidth-capped link) instead of the environment's.
    ``inline_max_bytes``: ``checkpoint.inline_max_bytes`` (None: the default); ``settings``:
    job config lines on top (e.g. ``epoch.tasks=long-running``)."""
    work = _workdir("stator-count")
    spark = stator_spark(settings)
    p = Pipeline("bench-count")
    keyed = p.source(
        GeneratorSource(KeyedEvents(keys, SEED), count=events, splits=2), uid="events"
    ).key_by(lambda e: e[0])
    if function == "builtin":
        counted = keyed.count(uid="count")
    elif function == "kpf":
        counted = keyed.process(RunningCount(), uid="count")
    elif function == "broadcast":
        rules = p.source(list_source([(b, b + 1) for b in range(BUCKETS)]), uid="rules")
        counted = keyed.connect(rules.broadcast(RULES)).process(EnrichedCount(), uid="count")
    else:
        raise ValueError(f"function must be builtin, kpf or broadcast, not {function!r}")
    counted.sink(NoopSink(), uid="out")
    cfg = load_config(
        None,
        [
            f"checkpoint.storage={(storage + '/' + work.name) if storage else f'file://{work}/ck'}",
            f"state.local_dir={work}/state",
            f"epoch.max_records={epoch}",
            f"checkpoint.enabled={'true' if checkpoint else 'false'}",
            f"checkpoint.async_upload={'false' if sync_upload else 'true'}",
            *([f"s3.endpoint_url={s3_endpoint}"] if s3_endpoint else []),
            *(
                [f"checkpoint.inline_max_bytes={inline_max_bytes}"]
                if inline_max_bytes is not None
                else []
            ),
            *settings,
        ],
    )
    driver = Job(p, cfg, spark)
    warm: list[tuple[float, int]] = []  # when the first epoch ended, and its records
    driver.on_epoch(
        lambda r: warm.append((time.time(), r.records_in)) if not warm and r.records_in else None
    )
    c0, t0, wall0 = _cpu(), time.perf_counter(), time.time()
    status = driver.run()
    seconds, c1, end = time.perf_counter() - t0, _cpu(), time.time()
    spark.stop()
    counts = _stator_counts(work / "state", "count", driver.parallelism.max_parallelism)
    shutil.rmtree(work, ignore_errors=True)
    check_counts(f"Stator {function} count", counts, events, keys)
    last = status.last_checkpoint
    return {
        "function": function,
        "events": events,
        "keys": keys,
        "seconds": seconds,
        "events_per_s": events / seconds,
        **_steady(events, wall0, warm[0], end),
        "epochs": status.epoch,
        "checkpoints": status.checkpoints,
        "state_bytes": last.state_bytes if last else 0,
        # What the checkpoints sent to the store, all of them.
        "uploaded_bytes": sum(h.incremental_bytes for h in driver.history.items()),
        "cpu_busy": (c1[0] - c0[0]) / (c1[1] - c0[1]),
    }


CORES = 2  # local[2]: Stator's generator has 2 splits, the peer reads 2 files per trigger


def _events_frame(spark: Any, events: int, keys: int, epoch: int, work: Path) -> Any:
    """The same events as KeyedEvents, as parquet: ``epoch`` rows per trigger, in ``CORES``
    files each (so the peer's scan and partial aggregation use every core). The batches
    are written in order: the file source takes the oldest files first."""
    from pyspark.sql import functions as F

    df = spark.range(0, events).select(
        F.concat(
            F.lit("k"), (((F.col("id") * MULT + SEED) % 4294967296) % keys).cast("string")
        ).alias("key"),
        F.lit(1).alias("value"),
        F.col("id").alias("ts"),
    )
    path = work / "input"
    for start in range(0, events, epoch):
        batch = df.where((F.col("ts") >= start) & (F.col("ts") < start + epoch))
        batch.repartition(CORES).write.parquet(str(path / f"batch-{start // epoch:06d}"))
        time.sleep(0.01)  # distinct modification times, batch after batch
    return df.schema, str(path)


def _peer_stream(name: str, events: int, keys: int, epoch: int) -> tuple[Any, Any, Path]:
    """The events as a stream for Spark's own stateful operators: one parquet batch per
    trigger, RocksDB state store, two shuffle partitions (one per core)."""
    work = _workdir(name)
    spark = _spark(
        {
            "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
            "spark.sql.shuffle.partitions": "2",
        }
    )
    schema, path = _events_frame(spark, events, keys, epoch, work)
    stream = (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", CORES)
        .parquet(path + "/batch-*/*.parquet")
    )
    return spark, stream, work


def _steady(events: int, start: float, first: tuple[float, int], end: float) -> dict[str, float]:
    """Throughput after the first epoch or trigger (``first``: when it ended and its records)
    to the end of the run (wall clock, all three): without the start-up both engines pay in
    their first job (the JVM's classes and JIT, Python workers), which dominates short runs."""
    ended, records = first
    return {
        "first_s": ended - start,  # from the run's start to the end of its first epoch
        "steady_s": end - ended,
        "steady_events_per_s": (events - records) / (end - ended),
    }


def _run_peer(
    spark: Any,
    frame: Any,
    work: Path,
    what: str,
    events: int,
    keys: int,
    state_options: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run ``frame`` to the end of its input into a noop sink (update mode, a checkpoint per
    micro-batch, as Spark always does), time it, then check the counts in its state store
    (Spark's state data source, ``state_options`` naming the state of a stateful
    processor)."""
    query = (
        frame.writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", str(work / "checkpoint"))
        .trigger(availableNow=True)
    )
    c0, t0, wall0 = _cpu(), time.perf_counter(), time.time()
    handle = query.start()
    handle.awaitTermination()
    seconds, c1, end = time.perf_counter() - t0, _cpu(), time.time()
    progress = [p for p in handle.recentProgress if p["numInputRows"] > 0]
    batches = len(progress)
    rows = sum(p["numInputRows"] for p in handle.recentProgress)
    started = datetime.fromisoformat(progress[0]["timestamp"].replace("Z", "+00:00")).timestamp()
    first_end = started + progress[0]["durationMs"]["triggerExecution"] / 1000
    reader = spark.read.format("statestore")
    for k, v in (state_options or {}).items():
        reader = reader.option(k, v)
    state = reader.load(str(work / "checkpoint")).selectExpr("key.key AS k", "value.count AS n")
    counts = {r["k"]: int(r["n"]) for r in state.collect()}
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)
    if rows != events:
        raise WrongOutput(f"{what} read {rows} of {events} rows")
    check_counts(what, counts, events, keys)
    return {
        "events": events,
        "seconds": seconds,
        "events_per_s": events / seconds,
        **_steady(events, wall0, (first_end, progress[0]["numInputRows"]), end),
        "batches": batches,
        "cpu_busy": (c1[0] - c0[0]) / (c1[1] - c0[1]),
    }


def native_count(events: int, keys: int, epoch: int) -> dict[str, Any]:
    """Spark's own streaming groupBy().count()."""
    spark, stream, work = _peer_stream("native-count", events, keys, epoch)
    frame = stream.groupBy("key").count()
    result = _run_peer(spark, frame, work, "native groupBy().count()", events, keys)
    return {**result, "keys": keys}


def tws_pandas_count(events: int, keys: int, epoch: int) -> dict[str, Any]:
    """Spark's Python stateful API: transformWithStateInPandas with a ValueState count."""
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import (
        StatefulProcessor,
        StatefulProcessorHandle,
    )
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    class Count(StatefulProcessor):
        def init(self, handle: StatefulProcessorHandle) -> None:
            self.count = handle.getValueState(
                "count", StructType([StructField("count", LongType(), True)])
            )

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
            # RunningCount's work: per event, count + 1 and one output (vectorized).
            n = sum(len(df) for df in rows)
            stored = self.count.get() if self.count.exists() else None
            before = stored[0] if stored else 0
            self.count.update((before + n,))
            yield pd.DataFrame({"key": [key[0]] * n, "count": range(before + 1, before + n + 1)})

        def close(self) -> None:
            pass

    spark, stream, work = _peer_stream("tws-count", events, keys, epoch)
    out = StructType([StructField("key", StringType()), StructField("count", LongType())])
    frame = stream.groupBy("key").transformWithStateInPandas(
        statefulProcessor=Count(), outputStructType=out, outputMode="Update", timeMode="None"
    )
    result = _run_peer(
        spark, frame, work, "transformWithStateInPandas", events, keys, {"stateVarName": "count"}
    )
    return {**result, "keys": keys}


def incremental_bytes(
    keys: int, churn: float, checkpoints: int, incremental: bool, storage: str = ""
) -> dict[str, Any]:
    """Load ``keys`` keys, then take ``checkpoints`` checkpoints each after an epoch that
    changes a ``churn`` share of the keys; report bytes uploaded per checkpoint."""
    work = _workdir(f"churn-{'inc' if incremental else 'full'}")
    spark = _spark()
    step = max(1, int(keys * churn))

    def job(count: int, epoch: int) -> Job:
        p = Pipeline("bench-churn")
        (
            p.source(GeneratorSource(SweepEvents(keys), count=count, splits=2), uid="events")
            .key_by(lambda e: e[0])
            .count(uid="count")
            .sink(NoopSink(), uid="out")
        )
        cfg = load_config(
            None,
            [
                f"checkpoint.storage={(storage + '/' + work.name) if storage else f'file://{work}/ck'}",
                f"state.local_dir={work}/state",
                f"epoch.max_records={epoch}",
                f"checkpoint.incremental={'true' if incremental else 'false'}",
                f"checkpoint.retained={checkpoints + 2}",
            ],
        )
        return Job(p, cfg, spark)

    job(keys, keys).run()  # the initial state: every key once, one checkpoint
    churn_job = job(keys + checkpoints * step, step)
    uploads: list[int] = []
    sizes: list[int] = []

    def record(meta: CheckpointMetadata) -> None:
        uploads.append(meta.incremental_bytes)
        sizes.append(meta.state_bytes)

    churn_job.on_checkpoint(record)
    churn_job.run()
    spark.stop()
    return {
        "keys": keys,
        "churn": churn,
        "checkpoints": len(uploads),
        "mean_uploaded": sum(uploads) / max(1, len(uploads)),
        "max_uploaded": max(uploads),
        "mean_size": sum(sizes) / max(1, len(sizes)),
        "incremental": incremental,
    }


CASES: dict[str, Callable[..., dict[str, Any]]] = {
    f.__name__: f for f in (stator_count, native_count, tws_pandas_count, incremental_bytes)
}


class _Payloads:
    """``(key, payload)`` with incompressible payloads: one distinct key per record."""

    def __init__(self, size: int) -> None:
        self.size = size

    def make(self, start: int, stop: int, step: int) -> list[Any]:
        return [(f"k{i}", os.urandom(self.size)) for i in range(start, stop, step)]


def raw_bandwidth(total_bytes: int, files: int = 8) -> dict[str, Any]:
    """Raw MinIO upload and download throughput with the same client settings Stator uses
    (boto3, multipart, 4 threads), for ``total_bytes`` in ``files`` objects."""
    from concurrent.futures import ThreadPoolExecutor

    from stator.storage import S3Options, open_store

    store = open_store(f"s3://bench/raw-{uuid.uuid4().hex[:8]}", S3Options())
    work = _workdir("raw")
    size = total_bytes // files
    paths = []
    for i in range(files):
        path = work / f"f{i}"
        path.write_bytes(os.urandom(size))
        paths.append(path)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda p: store.put_file(p.name, p), paths))
    up = time.perf_counter() - t0
    t0 = time.perf_counter()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda p: store.get_file(p.name, work / (p.name + ".back")), paths))
    down = time.perf_counter() - t0
    shutil.rmtree(work, ignore_errors=True)
    return {
        "bytes": size * files,
        "upload_mb_s": size * files / up / 1e6,
        "download_mb_s": size * files / down / 1e6,
    }


def savepoint_rescale(
    keys: int,
    value_bytes: int,
    storage: str,
    p_from: int = 2,
    p_to: int = 3,
    restore_epoch: int = 1_000,
    format_type: str = "canonical",
) -> dict[str, Any]:
    """Build ``keys * value_bytes`` of keyed state, stop it with a savepoint on MinIO, and
    restore it at ``p_to`` on fresh local disks (a new pod's); time each step. Savepoint
    settings are the defaults (zlib, which stores the random values raw) but for
    ``format_type``. The restored databases must hold every key, checked after the run."""
    from stator import BYTES, KeyedProcessFunction, ValueStateDescriptor

    class Keep(KeyedProcessFunction):
        def open(self, ctx: Any) -> None:
            self.payload = ctx.get_state(ValueStateDescriptor("payload", BYTES))

        def process_element(self, value: Any, ctx: Any) -> Any:
            self.payload.update(value[1])
            return None

    work = _workdir("savepoint")
    spark = _spark()
    sp_dir = f"{storage}/savepoints-{work.name}"

    def job(
        parallelism: int,
        restore: str,
        count: int,
        checkpoint_every: int = 1,
        epoch: int = 50_000,
        local_dir: Path | None = None,
    ) -> Job:
        p = Pipeline("bench-savepoint")
        (
            p.source(GeneratorSource(_Payloads(value_bytes), count=count, splits=2), uid="gen")
            .key_by(lambda e: e[0])
            .process(Keep(), uid="keep")
            .filter(lambda _: False)
            .sink(NoopSink(), uid="out")
        )
        cfg = load_config(
            None,
            [
                f"checkpoint.storage={storage}/{work.name}",
                f"state.local_dir={local_dir or work / 'state'}",
                f"epoch.max_records={epoch}",
                f"checkpoint.every_epochs={checkpoint_every}",
                f"parallelism={parallelism}",
                f"restore.source={restore}",
                f"savepoint.dir={sp_dir}",
                f"savepoint.format_type={format_type}",
                "state.warm_cache_entries=0",
            ],
        )
        return Job(p, cfg, spark)

    # Twice as many records as keys: the job is stopped with a savepoint when half the input
    # (every key once) is read, so the savepoint epoch itself reads nothing.
    build = job(p_from, "latest", 2 * keys)

    def stop_at_half(result: EpochResult) -> None:
        positions = build.loops[0].planner.positions["gen"].values()
        if not result.savepoint and all(st.position >= keys // 2 for st in positions):
            build.request_savepoint(stop=True)

    build.on_epoch(stop_at_half)
    status = build.run()
    request = next(r for r in build.savepoints.all() if r.stop)
    assert request.started_ms is not None and request.completed_ms is not None
    timings: dict[str, float] = {"savepoint_s": (request.completed_ms - request.started_ms) / 1000}
    location = str(status.stopped_with_savepoint)
    from stator.savepoint.metadata import SavepointMetadata
    from stator.storage import open_store

    meta = SavepointMetadata.from_json(open_store(location).get("_savepoint.json"))
    state_bytes = meta.state_bytes
    if meta.format_type != format_type:
        raise AssertionError(f"a {meta.format_type} savepoint, {format_type} was asked for")
    saved = sum(int(k["entries"]) for op in meta.operators.values() for k in op.key_groups.values())
    if not meta.native and saved != keys:  # every key was written once before the savepoint
        raise AssertionError(f"the savepoint holds {saved} entries, the job wrote {keys} keys")

    # Restore time is until the job processes again: its first epoch, of ``restore_epoch``
    # records (with the build's 50,000 it also wrote 50 MB of new state, which is not restoring).
    # The restored job's first checkpoint (a full upload of the new subtasks' files, as after
    # any restore) is not part of it.
    restore = job(
        p_to,
        location,
        2 * keys,
        checkpoint_every=1_000_000,
        epoch=restore_epoch,
        local_dir=work / "restored",
    )
    first: dict[str, float] = {}

    def first_epoch(result: EpochResult) -> None:
        first.setdefault("restore_epoch_s", result.duration_s)
        first.setdefault("records", result.records_in)
        restore.stop()  # the first epoch restores every subtask: that is what is measured

    restore.on_epoch(first_epoch)
    t0 = time.perf_counter()
    restored = restore.run().restores
    timings["restored_job_s"] = time.perf_counter() - t0
    if (restored.remote, restored.remote_bytes) != (p_to, state_bytes):  # every file, checked
        raise AssertionError(
            f"the restore read {restored.remote_bytes} bytes in {restored.remote} subtasks, "
            f"the savepoint has {state_bytes} bytes for {p_to}"
        )
    held = _entries(work / "restored", "keep", p_to, meta.max_parallelism)
    if held != keys + first["records"]:  # the savepoint's keys and the first epoch's new ones
        raise AssertionError(f"restored state holds {held} keys, not {keys} + {first['records']}")
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)
    restore_s = first["restore_epoch_s"]
    return {
        "state_bytes": state_bytes,
        "keys": keys,
        "savepoint_s": timings["savepoint_s"],
        "restore_s": restore_s,
        "downtime_s": timings["savepoint_s"] + restore_s,
        "savepoint_mb_s": state_bytes / timings["savepoint_s"] / 1e6,
        "restore_mb_s": state_bytes / restore_s / 1e6,
        "p_from": p_from,
        "p_to": p_to,
        "format_type": format_type,
    }


def _entries(
    local_dir: Path,
    uid: str,
    parallelism: int,
    max_parallelism: int,
    states: tuple[str, ...] = ("payload",),
) -> int:
    """Entries in a stopped job's local databases of operator ``uid``, whose keyed states
    are ``states``."""
    from stator.epoch.spec import state_root
    from stator.keygroups import range_for_subtask
    from stator.savepoint.transfer import database_entries

    total = 0
    for db in sorted(state_root(str(local_dir)).glob(f"*/{uid}/*-of-{parallelism}/db")):
        subtask = int(db.parent.name.split("-of-")[0])
        owned = range_for_subtask(subtask, parallelism, max_parallelism)
        total += sum(1 for _ in database_entries(db, owned, list(states)))
    return total


def local_restore(total_bytes: int, storage: str, value_bytes: int = 4096) -> dict[str, Any]:
    """One keyed subtask with ``total_bytes`` of incompressible state and one checkpoint in
    ``storage``; then the two restores of issue 9 side by side, each timed until the
    database is open at the checkpoint's epoch: from the executor's local copy, and from the
    object store (the copy removed, as on another executor). No Spark: the task functions."""
    import dataclasses

    from stator.epoch.spec import CheckpointTask, EpochSpec, RestoreTask
    from stator.keygroups import range_for_subtask
    from stator.locality.restore import open_state
    from stator.locality.snapshot import take_snapshot
    from stator.state.options import RocksDBOptions
    from stator.storage import S3Options, open_store

    work = _workdir("local-restore")
    store = open_store(f"{storage}/{work.name}", S3Options())
    kg = range_for_subtask(0, 1, 16)
    base = EpochSpec(
        job="bench",
        epoch=1,
        base_epoch=0,
        processing_time_ms=0,
        pipeline=Pipeline("bench"),
        parallelism={"op": 1},
        max_parallelism=16,
        local_dir=str(work / "state"),
        rocksdb=RocksDBOptions(),
        warm_entries=0,
        ranges={},
        split_max_ts={},
    )
    first = dataclasses.replace(base, checkpoint=CheckpointTask(1, store, True, {}))
    backend, _ = open_state(first, "op", 0, kg)
    assert backend.db is not None
    for i in range(total_bytes // value_bytes):
        backend.db[b"\x00\x00" + i.to_bytes(8, "big")] = os.urandom(value_bytes)
    backend.commit(1, 0)
    snap, _ = take_snapshot(first, "op", 0, kg, backend)
    backend.close()
    last = backend.commit_token  # what the driver learns from the task's report
    for e in (2, 3):  # epochs after the checkpoint: a restore is needed to go back to it
        b, _ = open_state(
            dataclasses.replace(
                base,
                epoch=e,
                base_epoch=e - 1,
                completed_checkpoint=1,
                commits={SubtaskId("op", 0): last},
            ),
            "op",
            0,
            kg,
        )
        b.commit(e, 0)
        last = b.commit_token
        b.close()
    restore = RestoreTask(store, 1, 1, snapshots={SubtaskId("op", 0): snap}, local_copies=True)
    again = dataclasses.replace(
        base, epoch=2, base_epoch=1, restore=restore, completed_checkpoint=1
    )
    results: dict[str, Any] = {"state_bytes": snap.state_bytes}
    for source in ("local", "remote"):
        if source == "remote":
            shutil.rmtree(work / "state" / "bench" / "op" / "0-of-1")
        t0 = time.perf_counter()
        b, report = open_state(again, "op", 0, kg)
        results[f"{source}_s"] = time.perf_counter() - t0
        b.close()
        assert report.source == source, report
        results[f"{source}_remote_bytes"] = report.remote_bytes
    results["speedup"] = results["remote_s"] / results["local_s"]
    shutil.rmtree(work, ignore_errors=True)
    return results


def spark_start(master: str, class_sharing: bool) -> dict[str, Any]:
    """A session and its first job, a shuffle through Python workers (what a driver, a
    rescale's new driver or a replacement executor pays before it processes): with this
    installation's class-data archives (``stator.cluster.cds``, the default) or with the
    JDK's own archive only (what a JVM maps without Stator's: the user's
    ``-XX:SharedArchiveFile`` comes last and wins)."""
    import pyspark

    from stator.cluster import cds

    if class_sharing and not cds.java_option(cds.DRIVER):
        raise WrongOutput(f"no class-data archives in {cds.archive_dir()}: make install")
    conf: dict[str, str] = {}
    if not class_sharing:
        base = f"-XX:SharedArchiveFile={cds.jdk_archive()}"
        conf = {"spark.driver.extraJavaOptions": base, "spark.executor.extraJavaOptions": base}
    started = time.monotonic()
    spark = create_session(SparkConfig(master=master, conf=conf), "stator-bench")
    try:
        pairs = spark.sparkContext.parallelize(range(20_000), 4).map(lambda x: (x % 97, 1))
        counts = dict(pairs.reduceByKey(lambda a, b: a + b, 4).collect())
        elapsed = time.monotonic() - started
        expected = {k: len(range(k, 20_000, 97)) for k in range(97)}
        if counts != expected:
            raise WrongOutput(f"per-key counts differ from the formula's: {counts}")
        options = spark.sparkContext.getConf().get("spark.driver.extraJavaOptions", "")
    finally:
        spark.stop()
    return {"start_s": elapsed, "driver_options": options, "spark": pyspark.__version__}


CASES.update(
    {f.__name__: f for f in (raw_bandwidth, savepoint_rescale, local_restore, spark_start)}
)


def standby_recovery(
    total_bytes: int, storage: str, local: bool, value_bytes: int = 4096, rate: int = 100
) -> dict[str, Any]:
    """Issue 9's recovery with a standby executor on the same node: ``local-cluster[2,1,1024]``
    runs two executor JVMs that share this machine's disk, as two executors of one node
    would share a node-local volume. One keyed subtask holds ``total_bytes`` of state on one
    executor, the other executor is idle; a checkpoint every epoch on ``storage``. Mid-epoch
    the subtask's executor and its Python workers are SIGKILLed; the time counts from the
    kill to the end of the first epoch whose keyed task ran on another executor (processing
    again; the second epoch's end is in the details).

    ``local``: task-local recovery as built (the state directory is still on the node).
    Otherwise the peer of issue 9: local recovery off and the killed executor's state
    directory gone with it (renamed away at the kill, as an emptyDir goes with its pod), so
    the standby restores the checkpoint from the object store. A run counts only if the
    restores read what they should from the store (nothing, or the whole state) and the
    final state holds every key."""
    import threading

    from pyspark.sql import SparkSession

    from bench.pipelines import payload_state
    from stator.epoch.spec import state_root
    from tests.helpers import executor_process

    keys = total_bytes // value_bytes
    work = _workdir("standby")
    spark = create_session(SparkConfig(master="local-cluster[2,1,1024]"), "stator-bench")
    assert isinstance(spark, SparkSession)
    sc = spark.sparkContext
    p = payload_state("standby", keys, value_bytes, rate, NoopSink())
    cfg = load_config(
        None,
        [
            f"checkpoint.storage={storage}/{work.name}",
            f"state.local_dir={work}/state",
            f"epoch.max_records={keys}",
            "parallelism=1",
            f"local_recovery.enabled={'true' if local else 'false'}",
        ],
    )
    root = Path(__file__).resolve().parent.parent
    job = Job(p, cfg, spark, python_path=[str(root)])
    marks: dict[str, Any] = {}
    killing = threading.Event()

    def kill(victim: str, subtask_dir: Path) -> None:
        time.sleep(0.2)  # into the next epoch: its task and map outputs are lost too
        jvm = executor_process(sc.applicationId, victim)
        procs = [jvm, *jvm.children(recursive=True)]
        marks["restores_before"] = job.status.restores.to_json()
        marks["t0"] = time.monotonic()
        for proc in procs:
            os.kill(proc.pid, signal.SIGKILL)
        if not local:
            subtask_dir.rename(work / "lost-with-the-executor")

    def after(result: EpochResult) -> None:
        last = job.status.last_checkpoint
        if "t0" in marks:
            at = time.monotonic() - marks["t0"]
            ran_on = {st.executor for st in result.states if st.uid == "payload"}
            marks.setdefault("epochs", []).append((result.epoch, round(at, 2), sorted(ran_on)))
            # Processing again: the first epoch whose keyed task ran on another executor
            # (one the victim finished before it died would not count).
            if "seconds" not in marks and ran_on and marks["victim"] not in ran_on:
                marks["seconds"] = at
            elif "seconds" in marks:
                marks["second_epoch_s"] = at
                job.stop()
            return
        if killing.is_set() or last is None or last.state_bytes < 0.9 * keys * value_bytes:
            return
        assert job.placement is not None
        marks["victim"] = job.placement.to_json()["payload"][0]["executor"]
        [subtask_dir] = state_root(str(work / "state")).glob("*/payload/0-of-1")
        marks["state_bytes"] = last.state_bytes
        marks["epoch_before_s"] = result.duration_s
        killing.set()
        threading.Thread(target=kill, args=(marks["victim"], subtask_dir), daemon=True).start()

    job.on_epoch(after)
    job.run()
    restores = job.status.restores.to_json()
    spark.stop()
    # Payload keeps a count and a payload per key.
    entries = _entries(work / "state", "payload", 1, 64, ("count", "payload"))
    shutil.rmtree(work, ignore_errors=True)
    if "seconds" not in marks:
        raise WrongOutput(f"the job stopped before it processed again after the kill: {marks}")
    read = restores["remote_bytes"] - marks["restores_before"]["remote_bytes"]
    if local and read:
        raise WrongOutput(f"task-local recovery read {read} bytes from the object store")
    if not local and read < 0.9 * marks["state_bytes"]:
        raise WrongOutput(f"read {read} bytes from the object store, the state is {marks}")
    if entries != 2 * keys:
        raise WrongOutput(f"the state holds {entries} entries after recovery, not 2 x {keys}")
    return {
        "seconds": marks["seconds"],
        "state_bytes": marks["state_bytes"],
        "remote_bytes": read,
        "restores": restores,
        "second_epoch_s": marks.get("second_epoch_s"),
        # (epoch, seconds after the kill it completed, where its keyed task ran)
        "epochs_after": marks["epochs"],
        "epoch_before_s": marks["epoch_before_s"],
    }


CASES[standby_recovery.__name__] = standby_recovery


def epoch_access(
    total_bytes: int, partitioned: bool, value_bytes: int = 4096, epochs: int = 5
) -> dict[str, Any]:
    """What a keyed task pays for its state in an epoch that changes little, once one epoch
    wrote ``total_bytes`` at once (a first load, a backfill: one write batch, so one large
    SST): open the database, the timer check over the subtask's 64 key-groups in both
    domains, 300 point lookups, close. ``partitioned``: the default index and filters
    (``state.rocksdb.partitioned_index``) or the monolithic ones of before. No Spark: the
    state backend itself, median of ``epochs`` epochs in one process (the block cache warm,
    as in a reused Python worker). Each lookup must return the value written."""
    import random
    import statistics

    import rocksdict

    from stator.api.time import MAX_TIMESTAMP
    from stator.state.backend import KeyedBackend
    from stator.state.layout import EVENT_TIME, PROCESSING_TIME, kkey_of
    from stator.state.options import RocksDBOptions

    work = _workdir("epoch-access")
    options = RocksDBOptions(partitioned_index=partitioned)
    kg = range_for_subtask(0, 1, 64)
    rng = random.Random(SEED)  # noqa: S311 - which keys to look up, not secrets
    keys = [kkey_of(f"k{i}".encode(), i % 64) + b"\x01" for i in range(total_bytes // value_bytes)]

    def value(key: bytes) -> bytes:
        return random.Random(key).randbytes(value_bytes)  # noqa: S311 - reproducible bytes

    backend = KeyedBackend(work / "db", options, kg, 64, "op").open()
    assert backend.db is not None
    batch = rocksdict.WriteBatch(raw_mode=True)
    for key in keys:
        batch.put(key, value(key))
    backend.db.write(batch)
    backend.commit(1, 0)
    backend.close()
    seconds = []
    groups = range(kg.start, kg.end)
    for _ in range(epochs):
        wanted: list[Any] = rng.sample(keys, 300)
        t0 = time.perf_counter()
        b = KeyedBackend(work / "db", options, kg, 64, "op").open()
        assert b.db is not None and b.timers is not None
        fired = b.timers.pop_due(EVENT_TIME, MAX_TIMESTAMP, groups)
        fired += b.timers.pop_due(PROCESSING_TIME, MAX_TIMESTAMP, groups)
        got = b.db.get(wanted)
        b.close()
        seconds.append(time.perf_counter() - t0)
        if fired or got != [value(k) for k in wanted]:
            raise WrongOutput(f"lookups returned other values, or timers fired: {fired[:3]}")
    shutil.rmtree(work, ignore_errors=True)
    return {"seconds": statistics.median(seconds), "all": seconds, "keys": len(keys)}


CASES[epoch_access.__name__] = epoch_access
