"""Latency at a fixed input rate (the ``latency`` group of ``python -m bench``).

Stator (:func:`stator_latency`): a rate-limited generator of ``rate`` records/s over ``keys``
keys (record ``i`` is the benchmark formula's, ``bench/cases.py``) -> ``key_by`` -> a user
``KeyedProcessFunction`` with ``ValueState`` (:class:`StampedCount`: one output per record,
stamped with the wall clock when it was processed) -> an exactly-once sink on the driver
(:class:`StampingSink`: stamps each epoch's rows when that epoch's checkpoint commits them).
Record ``i`` became available at its scheduled emission (the generator's schedule, the
same the source's ``plan`` follows). Per record after the warm-up:

- processing latency: processed - available;
- committed latency: committed - available (visible to a reader of the exactly-once output).

The output is checked before a time counts: every index once, and per key the counts
``1, 2, ...`` in index order.

Spark Structured Streaming (:func:`spark_latency`), the peer: its ``rate`` source at the same
rate (record ``value`` keyed by the same formula), ``groupBy(key)`` count with the newest
row's timestamp, RocksDB state store, two shuffle partitions, the default trigger (as fast as
possible), into ``foreachBatch``: per output row, the sink's clock minus the newest row of its
key (the per-key newest-row latency: a lower bound of its records' latency). Checked: the last
count of every key equals the formula's for the rows the query read.
"""

from __future__ import annotations

import itertools
import shutil
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from bench.cases import MULT, SEED, _spark, _workdir, check_counts, stator_spark
from bench.harness import Alternating, Comparison, WrongOutput, latency_percentiles
from stator import (
    INT64,
    EpochResult,
    Job,
    KeyedProcessFunction,
    Pipeline,
    ValueStateDescriptor,
)
from stator.config import load_config
from stator.sinks import CollectSink
from stator.sources import GeneratorSource, KeyedEvents

SPLITS = 2

# Stator's settings for low latency (docs/runtime.md "Latency"): what the "tuned" rows run.
LOW_LATENCY: tuple[str, ...] = (
    "epoch.tasks=long-running",
    "checkpoint.async_upload=false",
    "epoch.max_ms=50",
    "epoch.idle_wait_ms=20",
)
# The same with the checkpoints' uploads in the background (the default): what a store
# slower than local disk needs, at one or two epochs more of committed latency.
LOW_LATENCY_ASYNC: tuple[str, ...] = tuple(
    s for s in LOW_LATENCY if not s.startswith("checkpoint.async_upload")
)


class StampedCount(KeyedProcessFunction):
    """A count per key; each output is (key, count, record index, processed ms)."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", INT64))

    def process_element(self, event: Any, ctx: Any) -> Iterator[tuple[str, int, int, int]]:
        n = self.count.value(0) + 1
        self.count.update(n)
        yield (ctx.current_key, n, event[2], time.time_ns() // 1_000_000)


class StampingSink(CollectSink):
    """The collect sink (exactly-once into the driver's memory: an epoch's rows become
    visible when its checkpoint commits them), noting when each epoch was committed. An
    epoch's rows are kept as one array of ints (key number, count, index, processed ms), not
    as Python objects: a real sink keeps nothing in the driver, and a million rows there
    made the driver's full garbage collections pause it for tens of ms, a tail of the
    latency being measured."""

    def __init__(self) -> None:
        super().__init__()
        self.committed_ms: dict[int, int] = {}
        self.rows: dict[int, np.ndarray] = {}

    def commit(
        self, uid: str, epoch: int, parts: list[dict[str, Any]], payloads: list[Any]
    ) -> None:
        now = time.time_ns() // 1_000_000
        if epoch in self.rows:
            return  # already committed (idempotent)
        values = [v for payload in payloads for v in (payload or [])]
        self.rows[epoch] = np.array(
            [(int(k[1:]), n, i, t) for k, n, i, t in values], dtype=np.int64
        ).reshape(-1, 4)
        self.committed_ms.setdefault(epoch, now)

    def stamped(self) -> list[tuple[str, int, int, int, int]]:
        """Every committed row with its epoch's commit time."""
        return [
            (f"k{k}", int(n), int(i), int(t), self.committed_ms[e])
            for e, rows in self.rows.items()
            for k, n, i, t in rows.tolist()
        ]


def check_stamped(rows: list[tuple[str, int, int, int, int]], events: int, keys: int) -> None:
    """Every index once; per key, counts 1, 2, ... in index order."""
    if len(rows) != events:
        raise WrongOutput(f"Stator: {len(rows)} committed outputs, {events} records in")
    by_index = sorted(rows, key=lambda r: r[2])
    if [r[2] for r in by_index] != list(range(events)):
        raise WrongOutput("Stator: the committed outputs do not cover every index once")
    seen: dict[str, int] = {}
    for key, n, i, _, _ in by_index:
        want = seen.get(key, 0) + 1
        if n != want:
            raise WrongOutput(f"Stator: key {key} record {i}: count {n}, expected {want}")
        seen[key] = n
    check_counts("Stator latency count", seen, events, keys)


def stator_latency(
    rate: int, keys: int, seconds: float, warmup_s: float, settings: list[str]
) -> dict[str, Any]:
    """Stator at ``rate`` records/s for ``warmup_s + seconds`` (bounded: the job ends when the
    last record is committed), a checkpoint every epoch on local disk, ``settings`` on top of
    the defaults."""
    work = _workdir("stator-latency")
    spark = stator_spark(settings)
    events = int(rate * (warmup_s + seconds))
    source = GeneratorSource(
        KeyedEvents(keys, SEED), count=events, splits=SPLITS, rate_per_second=rate
    )
    sink = StampingSink()
    p = Pipeline("bench-latency")
    (
        p.source(source, uid="events")
        .key_by(lambda e: e[0])
        .process(StampedCount(), uid="count")
        .sink(sink, uid="out")
    )
    cfg = load_config(
        None,
        [f"checkpoint.storage=file://{work}/ck", f"state.local_dir={work}/state", *settings],
    )
    job = Job(p, cfg, spark)
    epochs: list[tuple[float, EpochResult]] = []  # (when its listener ran, the epoch)
    job.on_epoch(lambda r: epochs.append((time.time() * 1000, r)) if r.records_in else None)
    status = job.run()
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)
    started = source._started_ms  # when the generator's schedule began (its first plan)
    if started is None:
        raise WrongOutput("Stator: the generator never planned")
    rows = sink.stamped()
    check_stamped(rows, events, keys)
    ms_per_record = 1000 * SPLITS / rate
    index = np.array([r[2] for r in rows], dtype=np.int64)
    available = started + np.round((index // SPLITS) * ms_per_record).astype(np.int64)
    keep = available >= started + warmup_s * 1000
    processed = np.array([r[3] for r in rows], dtype=np.int64)[keep] - available[keep]
    committed = np.array([r[4] for r in rows], dtype=np.int64)[keep] - available[keep]
    return {
        "rate": rate,
        "keys": keys,
        "records": int(keep.sum()),
        "settings": settings,
        **latency_percentiles(processed, "processing"),
        **latency_percentiles(committed, "committed"),
        "epochs": status.epoch,
        "epoch_s": float(np.median([r.duration_s for _, r in epochs])) if epochs else 0.0,
        "timeline_ms": timeline(epochs, started + warmup_s * 1000),
    }


def timeline(epochs: list[tuple[float, EpochResult]], after_ms: float) -> dict[str, float]:
    """The median of each phase of the epochs planned after ``after_ms`` (ms after their
    plan, ``epoch/phases.py``), and ``next_plan``: from one epoch's hand-off to the next
    epoch's plan (the driver's loop, waiting for input included)."""
    timed = [(at - r.phases.handed_off, r.phases) for at, r in epochs if r.phases is not None]
    timed = [(planned, ph) for planned, ph in timed if planned >= after_ms]
    if not timed:
        return {}
    stamps = [ph.as_dict() for _, ph in timed]
    out = {name: float(np.median([st[name] for st in stamps])) for name in stamps[0]}
    gaps = [b[0] - (a[0] + a[1].handed_off) for a, b in itertools.pairwise(timed)]
    out["next_plan"] = float(np.median(gaps)) if gaps else 0.0
    return out


def spark_latency(rate: int, keys: int, seconds: float, warmup_s: float) -> dict[str, Any]:
    """Spark's keyed count on its ``rate`` source at ``rate`` rows/s for ``warmup_s +
    seconds``, micro-batches as fast as they go."""
    from pyspark.sql import functions as F

    work = _workdir("spark-latency")
    spark = _spark(
        {
            "spark.sql.streaming.stateStore.providerClass": (
                "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
            ),
            "spark.sql.shuffle.partitions": "2",
        }
    )

    frame = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", rate)
        .option("numPartitions", SPLITS)
        .load()
        .select(
            F.concat(
                F.lit("k"), (((F.col("value") * MULT + SEED) % 4294967296) % keys).cast("string")
            ).alias("key"),
            F.col("timestamp"),
        )
        .groupBy("key")
        .agg(F.count(F.lit(1)).alias("n"), F.max("timestamp").alias("newest"))
    )
    seen: list[tuple[int, np.ndarray]] = []  # (batch's sink ms, newest-row ms per row)
    latest: dict[str, int] = {}

    def batch(df: Any, batch_id: int) -> None:
        rows = df.select("key", "n", (F.unix_millis("newest")).alias("ms")).collect()
        now = time.time_ns() // 1_000_000
        seen.append((now, np.array([r["ms"] for r in rows], dtype=np.int64)))
        for r in rows:
            latest[r["key"]] = int(r["n"])

    handle = (
        frame.writeStream.outputMode("update")
        .option("checkpointLocation", str(work / "checkpoint"))
        .foreachBatch(batch)
        .start()
    )
    time.sleep(warmup_s + seconds)
    handle.stop()
    progress = handle.recentProgress
    rows_in = sum(p["numInputRows"] for p in progress)
    took = [
        p["durationMs"].get("triggerExecution", 0) / 1000 for p in progress if p["numInputRows"]
    ]
    first = min((t for t, _ in seen), default=0)
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)
    if rows_in <= 0:
        raise WrongOutput("Spark read no rows")
    # The last 100 progress entries only: count the rows from the state the sink saw.
    total = sum(latest.values())
    check_counts("Spark latency count", latest, total, keys)
    after = first + warmup_s * 1000
    ms = np.concatenate([t - newest for t, newest in seen if t >= after] or [np.zeros(0)])
    if len(ms) == 0:
        raise WrongOutput("Spark: no output after the warm-up")
    return {
        "rate": rate,
        "keys": keys,
        "records": total,
        "outputs": len(ms),
        **latency_percentiles(ms.astype(np.int64), "committed"),
        "epoch_s": float(np.median(took)) if took else 0.0,
    }


LATENCY_CASES = {f.__name__: f for f in (stator_latency, spark_latency)}


Case = Callable[..., Callable[[], tuple[float, dict[str, Any]]]]
Row = tuple[str, str, str, str]


def sustained(results: list[tuple[float, dict[str, Any]]]) -> bool:
    """A run kept up with its input: its committed latency did not grow over the window
    (by more than a second) and its p99 stayed under 5 s."""
    return all(d["committed_drift_ms"] < 1000 and d["committed_p99_ms"] < 5000 for _, d in results)


def latency_rows(
    args: Any, case: Case, log: Callable[[str], None]
) -> tuple[list[Row], dict[str, Any]]:
    """The ``latency`` group: per rate, Stator with its defaults and with :data:`LOW_LATENCY`
    against Spark's keyed count; the highest rate Stator sustains (tuned) from a ladder of
    probes; and Kafka to Kafka at ``--lat-kafka-rate``."""
    rows: list[Row] = []
    dumps: dict[str, Any] = {}
    common = dict(keys=args.lat_keys, seconds=args.lat_s, warmup_s=args.lat_warmup_s)
    tuned = list(LOW_LATENCY)
    rates = list(args.lat_rates)
    if args.lat_probe:
        highest = 0
        for rate in args.lat_probe:  # one run each, ascending: stop at the first it loses
            probe = Alternating(1, log)
            probe.measure(
                {
                    "tuned": case(
                        "stator_latency", "committed_p99_ms", rate=rate, **common, settings=tuned
                    )
                }
            )
            dumps[f"latency_probe_{rate}"] = probe.results
            if not sustained(probe.results["tuned"]):
                break
            highest = rate
        log(f"latency: the highest rate sustained (tuned) of {args.lat_probe}: {highest:,}")
        if highest and highest not in rates:
            rates.append(highest)
    for rate in rates:
        runs = Alternating(args.runs, log)
        runs.measure(
            {
                "default": case(
                    "stator_latency", "committed_p99_ms", rate=rate, **common, settings=[]
                ),
                "tuned": case(
                    "stator_latency", "committed_p99_ms", rate=rate, **common, settings=tuned
                ),
                "tuned_async": case(
                    "stator_latency",
                    "committed_p99_ms",
                    rate=rate,
                    **common,
                    settings=list(LOW_LATENCY_ASYNC),
                ),
                "spark": case("spark_latency", "committed_p99_ms", rate=rate, **common),
            }
        )
        dumps[f"latency_{rate}"] = runs.results
        what = (
            f"latency at {rate:,} records/s ({args.lat_keys:,} keys, {args.lat_s:g} s measured "
            f"after {args.lat_warmup_s:g} s of warm-up, local[2]; a checkpoint every epoch on "
            f"local disk, output checked)"
        )
        spark = runs.runs_of("spark", "Spark p99", "ms", "committed_p99_ms")
        asynchronous = f"`{' '.join(LOW_LATENCY_ASYNC)}`"
        for name, label in (
            ("default", "defaults"),
            ("tuned", f"`{' '.join(tuned)}`"),
            ("tuned_async", asynchronous),
        ):
            rows.append(
                Comparison(
                    f"{what}: committed p99, record available -> its output committed by an "
                    f"exactly-once sink; Stator ({label}; a user KeyedProcessFunction with "
                    f"ValueState, one output per record) vs Spark Structured Streaming "
                    f"(rate source, `groupBy(key).count()`, RocksDB state store, default "
                    f"trigger; per-key newest-row latency at `foreachBatch`)",
                    runs.runs_of(name, f"{label} p99", "ms", "committed_p99_ms"),
                    spark,
                    higher_is_better=False,
                    target=">= 20" if rate == 20_000 and name != "default" else "",
                ).row()
            )
        rows.append(
            Comparison(
                f"{what}: Stator's processing p99 (record available -> processed in its "
                f"keyed function), `{' '.join(tuned)}` vs defaults",
                runs.runs_of("tuned", "tuned processing p99", "ms", "processing_p99_ms"),
                runs.runs_of("default", "default processing p99", "ms", "processing_p99_ms"),
                higher_is_better=False,
            ).row()
        )
    if args.lat_kafka_rate:
        from bench.kafka import PARTITIONS, broker

        with broker() as bootstrap:
            lat = dict(
                bootstrap=bootstrap,
                keys=args.lat_keys,
                rate=args.lat_kafka_rate,
                seconds=args.lat_s,
                warmup_s=args.lat_warmup_s,
            )
            runs = Alternating(args.runs, log)
            runs.measure(
                {
                    "tuned": case(
                        "stator_kafka_latency",
                        "p99_ms",
                        **lat,
                        delivery="exactly-once",
                        settings=tuned,
                    ),
                    "spark": case("spark_kafka_latency", "p99_ms", **lat),
                }
            )
            dumps["latency_kafka"] = runs.results
            for pct in ("p50", "p99"):
                rows.append(
                    Comparison(
                        f"Kafka -> keyed count -> Kafka at {args.lat_kafka_rate:,} records/s "
                        f"({args.lat_keys:,} keys, {PARTITIONS} partitions): {pct} from an input "
                        f"record's broker timestamp to a read_committed consumer seeing the "
                        f"first count that includes it; Stator (exactly-once KafkaSink, "
                        f"`{' '.join(tuned)}`) vs Spark (Kafka sink, default trigger)",
                        runs.runs_of("tuned", f"Stator {pct}", "ms", f"{pct}_ms"),
                        runs.runs_of("spark", f"Spark {pct}", "ms", f"{pct}_ms"),
                        higher_is_better=False,
                    ).row()
                )
    return rows, dumps
