"""Interval join of two streams: Stator's ``interval_join`` vs Spark Structured Streaming's
stream-stream join with watermarks and an event-time range condition (RocksDB state store).

Both sides read the same events: record ``i`` is ``(key, BASE_MS + i * ms_per_record, i)``
with the key of :class:`bench.cases.KeyedEvents`' formula (``keys`` keys). A pair joins when
the keys are equal and the timestamps at most ``bound_ms`` apart, both engines with
watermarks that allow no out-of-orderness (the input is in order). Each case checks its
number of output pairs against :func:`expected_pairs`, computed from the formula alone,
before its time counts.
"""

from __future__ import annotations

import shutil
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.cases import CORES, MULT, ROCKSDB_PROVIDER, SEED, _cpu, _spark, _workdir
from bench.harness import WrongOutput
from stator import BoundedOutOfOrderness, Job, Pipeline
from stator.config import load_config
from stator.sinks.base import Sink, SinkWriter
from stator.sources import GeneratorSource


def _keys(events: int, keys: int) -> np.ndarray:
    i = np.arange(events, dtype=np.uint64)
    ids = ((i * np.uint64(MULT) + np.uint64(SEED)) & np.uint64(0xFFFFFFFF)) % np.uint64(keys)
    return ids.astype(np.int64)


def expected_pairs(events: int, keys: int, ms_per_record: int, bound_ms: int) -> int:
    """Ordered pairs (left, right) of the same key with timestamps at most ``bound_ms`` apart,
    both sides being the same events (so each record pairs with itself too)."""
    ids = _keys(events, keys)
    order = np.lexsort((np.arange(events), ids))  # by key, then by index (= by time)
    k, t = ids[order], np.arange(events, dtype=np.int64)[order] * ms_per_record
    total = 0
    start = 0
    for end in [*np.flatnonzero(np.diff(k)).tolist(), events - 1]:
        ts = t[start : end + 1]
        # for each element, how many of the key's timestamps lie within +-bound of it
        hi = np.searchsorted(ts, ts + bound_ms, side="right")
        lo = np.searchsorted(ts, ts - bound_ms, side="left")
        total += int((hi - lo).sum())
        start = end + 1
    return total


# Event time starts here (Spark dropped a row at 1970-01-01 00:00:00.000, the watermark's
# initial value: 99,999 pairs of 100,000).
BASE_MS = 1_700_000_000_000


@dataclass(frozen=True)
class JoinEvents:
    keys: int
    ms_per_record: int

    def make(self, start: int, stop: int, step: int) -> list[Any]:
        n, ms = self.keys, self.ms_per_record
        return [
            (f"k{((i * MULT + SEED) & 0xFFFFFFFF) % n}", BASE_MS + i * ms, i)
            for i in range(start, stop, step)
        ]


class _Count(SinkWriter):
    def __init__(self, part: str) -> None:
        self.part, self.n = part, 0

    def write(self, values: list[Any]) -> None:
        self.n += len(values)

    def finish(self) -> tuple[dict[str, Any], Any]:
        return {"part": self.part, "records": self.n}, None


class TotalSink(Sink):
    """Counts the records each epoch committed (on the driver), and drops them."""

    def __init__(self) -> None:
        self.total, self.epochs, self._lock = 0, set[int](), threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.total, self.epochs, self._lock = 0, set(), threading.Lock()

    def writer(self, uid: str, epoch: int, part: str) -> SinkWriter:
        return _Count(part)

    def commit(self, uid: str, epoch: int, parts: list[Any], payloads: list[Any]) -> None:
        with self._lock:
            if epoch not in self.epochs:
                self.epochs.add(epoch)
                self.total += sum(int(p["records"]) for p in parts)


def _pair_ids(left: Any, right: Any) -> tuple[int, int]:
    return (left[2], right[2])


def stator_interval_join(
    events: int, keys: int, epoch: int, bound_ms: int, ms_per_record: int
) -> dict[str, Any]:
    """Stator: two generated sources (``epoch`` records each per epoch), ``interval_join``
    with ``-bound_ms..bound_ms``, checkpoint every epoch on local disk, pairs counted."""
    work = _workdir("stator-join")
    spark = _spark()
    p = Pipeline("bench-join")
    sides = [
        p.source(
            GeneratorSource(JoinEvents(keys, ms_per_record), count=events, splits=CORES),
            uid=uid,
            timestamps=lambda r: r[1],
            watermarks=BoundedOutOfOrderness(0),
        ).key_by(lambda r: r[0])
        for uid in ("left", "right")
    ]
    sink = TotalSink()
    sides[0].interval_join(sides[1], -bound_ms, bound_ms, uid="join", join=_pair_ids).sink(
        sink, uid="out"
    )
    cfg = load_config(
        None,
        [
            f"checkpoint.storage=file://{work}/ck",
            f"state.local_dir={work}/state",
            f"epoch.max_records={2 * epoch}",
        ],
    )
    driver = Job(p, cfg, spark)
    c0, t0 = _cpu(), time.perf_counter()
    status = driver.run()
    seconds, c1 = time.perf_counter() - t0, _cpu()
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)
    want = expected_pairs(events, keys, ms_per_record, bound_ms)
    if sink.total != want:
        raise WrongOutput(f"Stator interval join: {sink.total} pairs, {want} expected")
    return {
        "events": 2 * events,
        "pairs": sink.total,
        "seconds": seconds,
        "events_per_s": 2 * events / seconds,
        "epochs": status.epoch,
        "cpu_busy": (c1[0] - c0[0]) / (c1[1] - c0[1]),
    }


def spark_interval_join(
    events: int, keys: int, epoch: int, bound_ms: int, ms_per_record: int
) -> dict[str, Any]:
    """Spark: the same events as parquet (``epoch`` rows per trigger and side), two streams
    with ``withWatermark(ts, 0)``, an inner join on key and ``r.ts BETWEEN l.ts - bound AND
    l.ts + bound``, RocksDB state store, a checkpoint per micro-batch; pairs counted per
    micro-batch (``foreachBatch``)."""
    from pyspark.sql import functions as F

    work = _workdir("spark-join")
    spark = _spark(
        {
            "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
            "spark.sql.shuffle.partitions": str(CORES),
        }
    )
    frame = spark.range(0, events).select(
        F.concat(
            F.lit("k"), (((F.col("id") * MULT + SEED) % 4294967296) % keys).cast("string")
        ).alias("key"),
        F.timestamp_millis(F.col("id") * ms_per_record + BASE_MS).alias("ts"),
        F.col("id").alias("i"),
    )
    path = work / "input"
    for start in range(0, events, epoch):
        batch = frame.where((F.col("i") >= start) & (F.col("i") < start + epoch))
        batch.repartition(CORES).write.parquet(str(path / f"batch-{start // epoch:06d}"))
        time.sleep(0.01)

    def side(prefix: str) -> Any:
        stream = (
            spark.readStream.schema(frame.schema)
            .option("maxFilesPerTrigger", CORES)
            .parquet(str(path) + "/batch-*/*.parquet")
        )
        return stream.withWatermark("ts", WATERMARK_DELAY).select(
            *(F.col(c).alias(prefix + c) for c in ("key", "ts", "i"))
        )

    left, right = side("l_"), side("r_")
    bound = f"INTERVAL {bound_ms} MILLISECONDS"
    joined = left.join(
        right,
        F.expr(f"l_key = r_key AND r_ts >= l_ts - {bound} AND r_ts <= l_ts + {bound}"),
    )
    pairs: list[int] = []
    query = (
        joined.writeStream.foreachBatch(lambda df, _: pairs.append(df.count()))
        .option("checkpointLocation", str(work / "checkpoint"))
        .trigger(availableNow=True)
    )
    c0, t0 = _cpu(), time.perf_counter()
    handle = query.start()
    handle.awaitTermination()
    seconds, c1 = time.perf_counter() - t0, _cpu()
    batches = len([p for p in handle.recentProgress if p["numInputRows"] > 0])
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)
    want = expected_pairs(events, keys, ms_per_record, bound_ms)
    if sum(pairs) != want:
        raise WrongOutput(f"Spark stream-stream join: {sum(pairs)} pairs, {want} expected")
    return {
        "events": 2 * events,
        "pairs": sum(pairs),
        "seconds": seconds,
        "events_per_s": 2 * events / seconds,
        "batches": batches,
        "cpu_busy": (c1[0] - c0[0]) / (c1[1] - c0[1]),
    }


WATERMARK_DELAY = "0 seconds"

JOIN_CASES = {f.__name__: f for f in (stator_interval_join, spark_interval_join)}
