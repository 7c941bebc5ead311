"""Kafka in, Kafka out: Stator's keyed count between two Kafka topics against Spark
Structured Streaming's ``groupBy().count()`` reading and writing the same broker.

Both engines read the same input topic (``PARTITIONS`` partitions; record ``i`` has the key
``k<((i * 2654435761 + 1) & 0xFFFFFFFF) % keys>`` of :class:`bench.cases.KeyedEvents`' formula)
and write ``(key, count)`` as Kafka key and value to a fresh output topic of their own. Each
run checks its output before its time counts: a ``read_committed`` consumer reads the whole
output topic, and the newest count per key must equal :func:`bench.cases.expected_counts`.

- Throughput (:func:`stator_kafka_count`, :func:`spark_kafka_count`): a pre-filled backlog,
  read to its end (Stator: a bounded ``KafkaSource``; Spark: ``availableNow``), both with
  ``epoch`` records per epoch/trigger and a checkpoint each.
- Latency (:func:`stator_kafka_latency`, :func:`spark_kafka_latency`): a producer thread
  writes ``rate`` records/s into a fresh topic whose records carry the broker's append time
  (``LogAppendTime``); a ``read_committed`` consumer of the output topic notes when each
  ``(key, count)`` arrives. An input record, the n-th of its key, is seen when the first
  output of its key with a count >= n arrives; its latency is that moment minus its broker
  timestamp. Records of the first ``warmup_s`` do not count (JVM, Python workers).

The exactly-once cases pass ``KafkaSink(..., delivery="exactly-once")``; while the sink does
not take that argument (:func:`exactly_once_missing`), the group leaves them out and says so.
"""

from __future__ import annotations

import contextlib
import inspect
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from bench.cases import (
    MULT,
    ROCKSDB_PROVIDER,
    SEED,
    _cpu,
    _spark,
    _steady,
    _workdir,
    check_counts,
    stator_spark,
)
from bench.harness import Alternating, Comparison, WrongOutput, latency_percentiles

PARTITIONS = 4
CORES = 2  # local[2], both engines
DELIVERIES = ("at-least-once", "exactly-once")
READ_TIMEOUT_S = 60.0  # a topic read that makes no progress this long fails


# ---------------------------------------------------------------- topics


def create_topic(bootstrap: str, prefix: str, log_append_time: bool = False) -> str:
    """A fresh topic of ``PARTITIONS`` partitions; ``log_append_time``: its records carry
    the broker's append time, not the producer's."""
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    config = {"message.timestamp.type": "LogAppendTime"} if log_append_time else {}
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = NewTopic(name, num_partitions=PARTITIONS, replication_factor=1, config=config)
    admin.create_topics([topic])[name].result(timeout=30)
    return name


def _key(i: int, keys: int) -> bytes:
    return b"k%d" % (((i * MULT + SEED) & 0xFFFFFFFF) % keys)


def _producer(bootstrap: str, **config: Any) -> Any:
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, **config})


def fill_backlog(bootstrap: str, topic: str, events: int, keys: int) -> float:
    """Produce records ``0..events-1`` (key by the formula, value the index); returns the
    seconds it took."""
    producer = _producer(bootstrap, **{"linger.ms": 50, "batch.size": 1 << 20})
    t0 = time.perf_counter()
    for i in range(events):
        while True:
            try:
                producer.produce(topic, key=_key(i, keys), value=b"%d" % i)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    left = producer.flush(120)
    if left:
        raise RuntimeError(f"{left} backlog records to {topic} were not acknowledged")
    return time.perf_counter() - t0


def read_topic(bootstrap: str, topic: str) -> list[tuple[int, bytes, bytes, int]]:
    """Every committed record of ``topic`` as ``(partition, key, value, timestamp ms)``, in
    partition order (so a key's records, all in one partition, come in their order)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-check-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        ends = {}
        for p in range(PARTITIONS):
            _, hi = consumer.get_watermark_offsets(
                TopicPartition(topic, p), timeout=30, cached=False
            )
            ends[p] = hi
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        out: list[tuple[int, bytes, bytes, int]] = []
        deadline = time.monotonic() + READ_TIMEOUT_S
        while True:
            msgs = consumer.consume(num_messages=10_000, timeout=0.5)
            for m in msgs:
                key, value, partition = m.key(), m.value(), m.partition()
                if m.error() is not None or key is None or value is None or partition is None:
                    raise WrongOutput(f"reading {topic}: {m.error() or 'a record without key'}")
                out.append((partition, key, value, m.timestamp()[1]))
            if msgs:
                deadline = time.monotonic() + READ_TIMEOUT_S
            # Transaction markers take offsets too: the positions tell when a partition ends.
            positions = consumer.position([TopicPartition(topic, p) for p in range(PARTITIONS)])
            if all(tp.offset >= ends[tp.partition] for tp in positions if ends[tp.partition]):
                break
            if time.monotonic() > deadline:
                at = {tp.partition: tp.offset for tp in positions}
                raise WrongOutput(
                    f"reading {topic} (read_committed) stalled at {at} of {ends} for "
                    f"{READ_TIMEOUT_S:.0f}s: a transaction left open?"
                )
    finally:
        consumer.close()
    out.sort(key=lambda r: r[0])  # stable: keeps each partition's order
    return out


def output_counts(bootstrap: str, topic: str) -> dict[str, int]:
    """The newest count per key that a ``read_committed`` consumer sees in ``topic``."""
    return {k.decode(): int(v) for _, k, v, _ in read_topic(bootstrap, topic)}


# ---------------------------------------------------------------- Stator


def exactly_once_missing() -> str:
    """Why the exactly-once cases cannot run here ("" when they can)."""
    from stator.sinks.kafka import KafkaSink

    if "delivery" in inspect.signature(KafkaSink).parameters:
        return ""
    return (
        "KafkaSink takes no `delivery` argument yet (the transactional sink of issue 41 has "
        "not landed): exactly-once cases skipped"
    )


def _record_key(record: Any) -> str:
    return str(record.key.decode())


def _identity(value: Any) -> Any:
    return value


def _count_key(value: Any) -> Any:
    return value[0]


def _count_value(value: Any) -> bytes:
    return b"%d" % value[1]


def _stator_job(
    bootstrap: str,
    source_topic: str,
    out_topic: str,
    delivery: str,
    work: Path,
    settings: list[str],
    bounded: bool,
) -> Any:
    """KafkaSource -> key_by -> built-in ``.count()`` ((key, count) per changed key and
    epoch) -> KafkaSink keyed by the key, the count as its value; a checkpoint every epoch."""
    from stator import Job, Pipeline
    from stator.config import load_config
    from stator.sinks.kafka import KafkaSink
    from stator.sources import KafkaSource

    if delivery not in DELIVERIES:
        raise ValueError(f"delivery must be one of {DELIVERIES}, not {delivery!r}")
    extra: dict[str, Any] = {}
    if delivery == "exactly-once" or not exactly_once_missing():
        extra["delivery"] = delivery
    sink = KafkaSink(bootstrap, out_topic, key=_count_key, encode=_count_value, **extra)
    p = Pipeline("bench-kafka")
    (
        p.source(
            KafkaSource(bootstrap, source_topic, bounded=bounded, decode=_record_key),
            uid="events",
        )
        .key_by(_identity)
        .count(uid="count")
        .sink(sink, uid="out")
    )
    cfg = load_config(
        None,
        [
            f"checkpoint.storage=file://{work}/ck",
            f"state.local_dir={work}/state",
            *settings,
        ],
    )
    return Job(p, cfg, stator_spark(settings))


def stator_kafka_count(
    bootstrap: str, topic: str, events: int, keys: int, epoch: int, delivery: str
) -> dict[str, Any]:
    """Stator reads the backlog in ``topic`` to its end, counts per key and writes the
    counts to a fresh topic through ``KafkaSink(delivery=delivery)``."""
    out = create_topic(bootstrap, "bench-out-stator")
    work = _workdir("stator-kafka")
    job = _stator_job(bootstrap, topic, out, delivery, work, [f"epoch.max_records={epoch}"], True)
    warm: list[tuple[float, int]] = []
    job.on_epoch(
        lambda r: warm.append((time.time(), r.records_in)) if not warm and r.records_in else None
    )
    c0, t0, wall0 = _cpu(), time.perf_counter(), time.time()
    status = job.run()
    seconds, c1, end = time.perf_counter() - t0, _cpu(), time.time()
    job.spark.stop()
    shutil.rmtree(work, ignore_errors=True)
    check_counts(f"Stator Kafka count ({delivery})", output_counts(bootstrap, out), events, keys)
    return {
        "delivery": delivery,
        "events": events,
        "seconds": seconds,
        "events_per_s": events / seconds,
        **_steady(events, wall0, warm[0], end),
        "epochs": status.epoch,
        "cpu_busy": (c1[0] - c0[0]) / (c1[1] - c0[1]),
    }


# ---------------------------------------------------------------- Spark


def _spark_with_kafka() -> Any:
    """local[2] with the test bed's Kafka connector on the driver's class path (it must be
    there when the JVM starts), RocksDB state store, one shuffle partition per core."""
    from tests.testbed.spark import kafka_connector_jars

    jars = kafka_connector_jars()
    return _spark(
        {
            "spark.jars": ",".join(str(j) for j in jars),
            "spark.driver.extraClassPath": ":".join(str(j) for j in jars),
            "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
            "spark.sql.shuffle.partitions": str(CORES),
        }
    )


def _spark_query(spark: Any, bootstrap: str, topic: str, out: str, work: Path, epoch: int) -> Any:
    """readStream from ``topic`` -> ``groupBy(key).count()`` -> writeStream to ``out`` in
    update mode (Spark's Kafka sink: at-least-once), a checkpoint per micro-batch."""
    from pyspark.sql import functions as F

    stream = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
    )
    if epoch:
        stream = stream.option("maxOffsetsPerTrigger", epoch)
    counts = stream.load().select(F.col("key").cast("string").alias("key")).groupBy("key").count()
    return (
        counts.select("key", F.col("count").cast("string").alias("value"))
        .writeStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", out)
        .outputMode("update")
        .option("checkpointLocation", str(work / "checkpoint"))
    )


def spark_kafka_count(
    bootstrap: str, topic: str, events: int, keys: int, epoch: int
) -> dict[str, Any]:
    """Spark reads the backlog in ``topic`` (``maxOffsetsPerTrigger=epoch``,
    ``availableNow``), counts per key and writes the counts to a fresh topic."""
    out = create_topic(bootstrap, "bench-out-spark")
    work = _workdir("spark-kafka")
    spark = _spark_with_kafka()
    query = _spark_query(spark, bootstrap, topic, out, work, epoch).trigger(availableNow=True)
    c0, t0, wall0 = _cpu(), time.perf_counter(), time.time()
    handle = query.start()
    handle.awaitTermination()
    seconds, c1, end = time.perf_counter() - t0, _cpu(), time.time()
    progress = [p for p in handle.recentProgress if p["numInputRows"] > 0]
    rows = sum(p["numInputRows"] for p in progress)
    from datetime import datetime

    started = datetime.fromisoformat(progress[0]["timestamp"].replace("Z", "+00:00")).timestamp()
    first_end = started + progress[0]["durationMs"]["triggerExecution"] / 1000
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)
    if rows != events:
        raise WrongOutput(f"Spark Kafka count read {rows} of {events} records")
    check_counts("Spark Kafka groupBy().count()", output_counts(bootstrap, out), events, keys)
    return {
        "events": events,
        "seconds": seconds,
        "events_per_s": events / seconds,
        **_steady(events, wall0, (first_end, progress[0]["numInputRows"]), end),
        "batches": len(progress),
        "cpu_busy": (c1[0] - c0[0]) / (c1[1] - c0[1]),
    }


# ---------------------------------------------------------------- latency


class RateProducer(threading.Thread):
    """Produces ``rate`` records/s (in 10 ms ticks) for ``seconds``, record ``i`` keyed by
    the formula; ``started`` is when it began (wall clock, s)."""

    def __init__(self, bootstrap: str, topic: str, keys: int, rate: int, seconds: float) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.keys = bootstrap, topic, keys
        self.rate, self.seconds = rate, seconds
        self.sent, self.started, self.error = 0, 0.0, ""

    def run(self) -> None:
        try:
            producer = _producer(self.bootstrap, **{"linger.ms": 1})
            self.started = time.time()
            t0 = time.monotonic()
            while (elapsed := time.monotonic() - t0) < self.seconds:
                due = int(elapsed * self.rate)
                for i in range(self.sent, due):
                    producer.produce(self.topic, key=_key(i, self.keys), value=b"%d" % i)
                self.sent = max(self.sent, due)
                producer.poll(0)
                time.sleep(0.01)
            if producer.flush(60):
                self.error = "records were not acknowledged"
        except Exception as exc:  # reported by the case, in its own process
            self.error = repr(exc)


class OutputWatcher(threading.Thread):
    """A ``read_committed`` consumer of the output topic that notes when each record
    arrives: ``seen[key]`` is a list of ``(arrival ms, count)``."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.seen: dict[str, list[tuple[int, int]]] = {}
        self.latest: dict[str, int] = {}
        self.halt = threading.Event()
        self.error = ""

    def run(self) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"bench-latency-{uuid.uuid4().hex[:6]}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "fetch.wait.max.ms": 20,
            }
        )
        tps = [TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)]
        consumer.assign(tps)
        try:
            while not self.halt.is_set():
                msgs = consumer.consume(num_messages=10_000, timeout=0.05)
                now = int(time.time() * 1000)
                for m in msgs:
                    raw, value = m.key(), m.value()
                    if m.error() is not None or raw is None or value is None:
                        self.error = str(m.error() or "a record without key or value")
                        return
                    key, count = raw.decode(), int(value)
                    self.seen.setdefault(key, []).append((now, count))
                    self.latest[key] = count
        finally:
            consumer.close()


def latencies(
    inputs: list[tuple[int, bytes, bytes, int]],
    seen: dict[str, list[tuple[int, int]]],
    after_ms: int,
) -> np.ndarray:
    """Per input record produced at or after ``after_ms`` (broker time), in broker time
    order: ms from its broker timestamp to the arrival of the first output of its key whose
    count covers it. A key whose outputs never cover all its records fails the run."""
    stamps: dict[str, list[int]] = {}
    for _, raw, _, stamp in inputs:
        stamps.setdefault(raw.decode(), []).append(stamp)
    out: list[tuple[int, int]] = []  # (broker timestamp, latency)
    for key, ts in stamps.items():
        covered = 0
        for arrived, count in seen.get(key, []):
            for n in range(covered, min(count, len(ts))):
                if ts[n] >= after_ms:
                    out.append((ts[n], arrived - ts[n]))
            covered = max(covered, count)
        if covered < len(ts):
            raise WrongOutput(f"key {key}: {len(ts)} records in, outputs covered {covered}")
    out.sort()
    return np.array([latency for _, latency in out], dtype=np.int64)


def _measure_latency(
    what: str,
    bootstrap: str,
    keys: int,
    rate: int,
    seconds: float,
    warmup_s: float,
    start: Callable[[str, str], Callable[[], dict[str, float]]],
) -> dict[str, Any]:
    """Run a job started by ``start(input topic, output topic)`` under a producer of
    ``rate`` records/s for ``warmup_s + seconds``; ``start`` returns how to stop the job, and
    the stop returns the median duration of its epochs or micro-batches. Waits until the
    output covers every input record; reports percentiles of the records after the warm-up."""
    source = create_topic(bootstrap, "bench-lat-in", log_append_time=True)
    out = create_topic(bootstrap, "bench-lat-out")
    watcher = OutputWatcher(bootstrap, out)
    watcher.start()
    stop = start(source, out)
    producer = RateProducer(bootstrap, source, keys, rate, warmup_s + seconds)
    try:
        producer.start()
        producer.join()
        if producer.error:
            raise RuntimeError(f"the rate producer failed: {producer.error}")
        want: dict[str, int] = {}
        for i in range(producer.sent):
            k = _key(i, keys).decode()
            want[k] = want.get(k, 0) + 1
        deadline = time.monotonic() + READ_TIMEOUT_S
        while dict(watcher.latest) != want:
            if watcher.error or not watcher.is_alive():
                raise WrongOutput(f"{what}: the output consumer failed: {watcher.error}")
            if time.monotonic() > deadline:
                behind = sum(1 for k, n in want.items() if watcher.latest.get(k) != n)
                raise WrongOutput(
                    f"{what}: {behind} of {len(want)} keys' final counts not seen by a "
                    f"read_committed consumer {READ_TIMEOUT_S:.0f}s after the input ended"
                )
            time.sleep(0.1)
    finally:
        pace = stop()
        watcher.halt.set()
        watcher.join(30)
    inputs = read_topic(bootstrap, source)
    if len(inputs) != producer.sent:
        raise WrongOutput(f"{what}: {len(inputs)} input records in the topic, sent {producer.sent}")
    ms = latencies(inputs, watcher.seen, int((producer.started + warmup_s) * 1000))
    if len(ms) == 0:
        raise WrongOutput(f"{what}: no input records after the warm-up")
    return {
        "records": len(ms),
        "rate": producer.sent / (warmup_s + seconds),
        **latency_percentiles(ms),
        "outputs": sum(len(v) for v in watcher.seen.values()),
        **pace,
    }


def stator_kafka_latency(
    bootstrap: str,
    keys: int,
    rate: int,
    seconds: float,
    warmup_s: float,
    delivery: str,
    settings: list[str] | None = None,
) -> dict[str, Any]:
    """Stator's Kafka count (unbounded source, default epochs: whatever arrived, up to
    ``epoch.max_records``), a checkpoint every epoch, under a fixed input rate; ``settings``
    on top of the defaults."""
    work = _workdir("stator-kafka-lat")

    def start(source: str, out: str) -> Callable[[], dict[str, float]]:
        job = _stator_job(bootstrap, source, out, delivery, work, settings or [], False)
        took: list[float] = []  # seconds of each epoch that read records
        job.on_epoch(lambda r: took.append(r.duration_s) if r.records_in else None)
        runner = threading.Thread(target=job.run, daemon=True)
        runner.start()

        def stop() -> dict[str, float]:
            job.stop()
            runner.join(120)
            job.spark.stop()
            return {"batches": len(took), "batch_s": float(np.median(took)) if took else 0.0}

        return stop

    try:
        result = _measure_latency(
            f"Stator ({delivery})", bootstrap, keys, rate, seconds, warmup_s, start
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"delivery": delivery, **result}


def spark_kafka_latency(
    bootstrap: str, keys: int, rate: int, seconds: float, warmup_s: float
) -> dict[str, Any]:
    """Spark's Kafka count, micro-batches as fast as they go (the default trigger), under a
    fixed input rate."""
    work = _workdir("spark-kafka-lat")
    spark = _spark_with_kafka()

    def start(source: str, out: str) -> Callable[[], dict[str, float]]:
        handle = _spark_query(spark, bootstrap, source, out, work, 0).start()

        def stop() -> dict[str, float]:
            took = [
                p["durationMs"]["triggerExecution"] / 1000
                for p in handle.recentProgress  # the last 100 micro-batches
                if p["numInputRows"] > 0
            ]
            handle.stop()
            spark.stop()
            return {"batches": len(took), "batch_s": float(np.median(took)) if took else 0.0}

        return stop

    try:
        return _measure_latency("Spark", bootstrap, keys, rate, seconds, warmup_s, start)
    finally:
        shutil.rmtree(work, ignore_errors=True)


KAFKA_CASES = {
    f.__name__: f
    for f in (stator_kafka_count, spark_kafka_count, stator_kafka_latency, spark_kafka_latency)
}


# ---------------------------------------------------------------- the group


@contextlib.contextmanager
def broker() -> Iterator[str]:
    """The test bed's single-node Kafka broker for the group's duration; its address."""
    from tests.testbed.kafka import KafkaBroker

    with (
        tempfile.TemporaryDirectory(prefix="bench-kafka-") as root,
        KafkaBroker(Path(root)) as running,
    ):
        yield running.bootstrap_servers


Case = Callable[..., Callable[[], tuple[float, dict[str, Any]]]]


def kafka_rows(
    args: Any, case: Case, log: Callable[[str], None]
) -> tuple[list[tuple[str, str, str, str]], dict[str, Any]]:
    """The ``kafka`` group: throughput and latency rows, and every run's details."""
    rows: list[tuple[str, str, str, str]] = []
    dumps: dict[str, Any] = {}
    missing = exactly_once_missing()
    if missing:
        print(f"kafka: {missing}", file=sys.stderr, flush=True)
    deliveries = ["at-least-once"] if missing else list(DELIVERIES)
    events, keys, epoch = args.kafka_events, args.kafka_keys, args.kafka_epoch
    with broker() as bootstrap:
        topic = create_topic(bootstrap, "bench-in")
        log(f"kafka: filling {topic} with {events:,} records over {keys:,} keys")
        log(f"kafka: backlog written in {fill_backlog(bootstrap, topic, events, keys):.1f}s")
        size = dict(bootstrap=bootstrap, topic=topic, events=events, keys=keys, epoch=epoch)
        contenders = {
            d: case("stator_kafka_count", "events_per_s", **size, delivery=d) for d in deliveries
        }
        contenders["spark"] = case("spark_kafka_count", "events_per_s", **size)
        runs = Alternating(args.runs, log)
        runs.measure(contenders)
        dumps["kafka"] = runs.results
        what = (
            f"Kafka -> keyed count -> Kafka ({events:,} records of a backlog in {PARTITIONS} "
            f"partitions, {keys:,} keys, {epoch:,} per epoch/trigger, a checkpoint each on "
            f"local disk, local[2], one broker); output checked by a read_committed consumer "
            f"(newest count per key)"
        )
        spark = runs.runs_of("spark", "Spark `groupBy().count()`, Kafka sink", "events/s")
        alo = runs.runs_of("at-least-once", "`.count()`, at-least-once KafkaSink", "events/s")
        if not missing:
            eo = runs.runs_of("exactly-once", "`.count()`, exactly-once KafkaSink", "events/s")
            rows.append(
                Comparison(
                    f"{what}: Stator with its exactly-once sink vs Spark Structured "
                    f"Streaming (Kafka source, `groupBy(key).count()`, update mode, its "
                    f"at-least-once Kafka sink, RocksDB state store, `availableNow`)",
                    eo,
                    spark,
                    target=">= 1.5",
                ).row()
            )
            rows.append(
                Comparison(
                    "the same Stator job: exactly-once (transactional) KafkaSink vs the "
                    "at-least-once one",
                    eo,
                    alo,
                    target=">= 0.8",
                ).row()
            )
        rows.append(
            Comparison(
                f"{what}: Stator with its at-least-once sink vs Spark (Kafka source, "
                f"`groupBy(key).count()`, update mode, its at-least-once Kafka sink; both "
                f"sinks at-least-once)",
                alo,
                spark,
            ).row()
        )

        lat = dict(
            bootstrap=bootstrap,
            keys=args.kafka_lat_keys,
            rate=args.kafka_rate,
            seconds=args.kafka_lat_s,
            warmup_s=args.kafka_warmup_s,
        )
        contenders = {
            d: case("stator_kafka_latency", "p50_ms", **lat, delivery=d) for d in deliveries
        }
        contenders["spark"] = case("spark_kafka_latency", "p50_ms", **lat)
        runs = Alternating(args.runs, log)
        runs.measure(contenders)
        dumps["kafka_latency"] = runs.results
        what = (
            f"end-to-end latency at {args.kafka_rate:,} records/s ({args.kafka_lat_keys:,} "
            f"keys, {PARTITIONS} partitions; {args.kafka_lat_s:g} s measured after "
            f"{args.kafka_warmup_s:g} s of warm-up), from an input record's broker timestamp "
            f"to a read_committed consumer seeing the first count that includes it; Stator "
            f"(default epochs, a checkpoint each) vs Spark (default trigger)"
        )
        for d in deliveries:
            for pct in ("p50", "p99"):
                rows.append(
                    Comparison(
                        f"{what}: {pct}, Stator's {d} sink",
                        runs.runs_of(d, f"{d} {pct}", "ms", f"{pct}_ms"),
                        runs.runs_of("spark", f"Spark {pct}", "ms", f"{pct}_ms"),
                        higher_is_better=False,
                    ).row()
                )
    return rows, dumps
