"""The Kafka source against the test bed's real broker: several topics and a pattern,
partitions and topics added while the job runs, start by timestamp and by group offsets,
offsets committed to the group after checkpoints, an idle partition that does not hold back
event-time windows, decode failures (failing, or to a dead-letter topic), and lag.

Jobs run through the real driver loop with the in-process epoch runner
(``tests/unit/inprocess_job.py``: the real source and keyed tasks, without Spark).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import NewPartitions

from stator import Job
from stator.api.pipeline import Pipeline
from stator.api.time import BoundedOutOfOrderness
from stator.api.windows import Count, Tumbling
from stator.control.answers import job_info
from stator.control.metrics import render_metrics
from stator.sinks import CollectSink
from stator.sources import KafkaRecord, KafkaSource, StartFrom
from tests.integration.kafka_jobs import Running, admin, make_topic, produce, running, unique
from tests.testbed.kafka import KafkaBroker
from tests.unit.inprocess_run import run_in_process

__all__ = ["running"]  # the fixture (kafka_jobs.py), shared with the dashboard's tests


def as_tuple(rec: KafkaRecord) -> tuple[str, int, int, str]:
    assert rec.value is not None
    return (rec.topic, rec.partition, rec.offset, rec.value.decode())


def test_topics_a_pattern_and_partitions_and_topics_added_while_running(
    kafka: KafkaBroker,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    running: list[Running],
) -> None:
    prefix = f"multi-{unique()}"
    a, b = make_topic(kafka, f"{prefix}-a", 2), make_topic(kafka, f"{prefix}-b", 1)
    make_topic(kafka, f"other-{unique()}", 1)  # the pattern does not match it
    produce(kafka, a, 0, ["a0-0", "a0-1"])
    produce(kafka, a, 1, ["a1-0"])
    produce(kafka, b, 0, ["b0-0"])

    # topics=[...]: a bounded run reads every partition of both, in (topic, partition) order
    p = Pipeline("kafka-topics")
    out = CollectSink()
    src = KafkaSource(kafka.bootstrap_servers, topics=[b, a], bounded=True, decode=as_tuple)
    p.source(src, uid="in").sink(out, uid="out")
    run_in_process(p, tmp_path / "bounded", monkeypatch)
    assert sorted(out.results) == [
        (a, 0, 0, "a0-0"),
        (a, 0, 1, "a0-1"),
        (a, 1, 0, "a1-0"),
        (b, 0, 0, "b0-0"),
    ]

    # topic_pattern=: running, it picks up a partition and a topic created after it started
    p = Pipeline("kafka-pattern")
    out = CollectSink()
    src = KafkaSource(
        kafka.bootstrap_servers,
        topic_pattern=f"{prefix}-.*",
        decode=as_tuple,
        discovery_interval_ms=300,
    )
    p.source(src, uid="in").sink(out, uid="out")
    job = Running(p, tmp_path / "pattern", monkeypatch, "epoch.max_records=1000")
    running.append(job)
    job.wait_for("the first records", lambda: len(out.results) == 4)
    client = admin(kafka)
    client.create_partitions([NewPartitions(a, 3)])[a].result(30)
    produce(kafka, a, 2, ["a2-0", "a2-1"])
    c = make_topic(kafka, f"{prefix}-c", 1)
    produce(kafka, c, 0, ["c0-0"])
    job.wait_for("the new partition and topic", lambda: len(out.results) == 7)
    job.stop()
    assert sorted(out.results) == [
        (a, 0, 0, "a0-0"),
        (a, 0, 1, "a0-1"),
        (a, 1, 0, "a1-0"),
        (a, 2, 0, "a2-0"),
        (a, 2, 1, "a2-1"),
        (b, 0, 0, "b0-0"),
        (c, 0, 0, "c0-0"),
    ]
    assert list(job.job.loops[0].planner.positions["in"]) == [
        f"{a}:0",
        f"{a}:1",
        f"{a}:2",
        f"{b}:0",
        f"{c}:0",
    ]


def test_start_by_timestamp_and_by_group_offsets_and_offsets_committed_after_checkpoints(
    kafka: KafkaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = make_topic(kafka, f"start-{unique()}", 1)
    base = (int(time.time()) - 600) * 1000  # recent: retention deletes records stamped long ago
    produce(kafka, topic, 0, [f"v{i}" for i in range(10)], ts=[base + 1_000 * i for i in range(10)])

    p = Pipeline("kafka-by-time")
    out = CollectSink()
    src = KafkaSource(
        kafka.bootstrap_servers,
        topic,
        start=StartFrom.timestamp(base + 4_500),
        bounded=True,
        decode=as_tuple,
    )
    p.source(src, uid="in").sink(out, uid="out")
    run_in_process(p, tmp_path / "time", monkeypatch)
    assert [r[3] for r in out.results] == ["v5", "v6", "v7", "v8", "v9"]  # at/after base+5000

    group = f"g-{unique()}"
    c = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": group})
    c.commit(offsets=[TopicPartition(topic, 0, 4)], asynchronous=False)
    c.close()
    p = Pipeline("kafka-by-group")
    out = CollectSink()
    src = KafkaSource(
        kafka.bootstrap_servers,
        topic,
        start="group-offsets",
        group_id=group,
        bounded=True,
        decode=as_tuple,
    )
    p.source(src, uid="in").sink(out, uid="out")
    run_in_process(p, tmp_path / "group", monkeypatch, "epoch.max_records=3")
    assert [r[2] for r in out.results] == [4, 5, 6, 7, 8, 9]

    # Each completed checkpoint committed its offsets to the group: the last one, the end.
    c = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": group})
    (committed,) = c.committed([TopicPartition(topic, 0)], timeout=30)
    c.close()
    assert committed.offset == 10

    # A group without offsets starts at the fallback.
    p = Pipeline("kafka-new-group")
    out = CollectSink()
    src = KafkaSource(
        kafka.bootstrap_servers,
        topic,
        start=StartFrom.group_offsets(fallback="latest"),
        group_id=f"g-{unique()}",
        commit_offsets_on_checkpoint=False,
        bounded=True,
        decode=as_tuple,
    )
    p.source(src, uid="in").sink(out, uid="out")
    run_in_process(p, tmp_path / "fallback", monkeypatch)
    assert out.results == []


def window_pipeline(kafka: KafkaBroker, topic: str, idleness_ms: int, out: CollectSink) -> Pipeline:
    p = Pipeline("kafka-idle")
    src = KafkaSource(
        kafka.bootstrap_servers,
        topic,
        decode=lambda r: r.value.decode(),
        kafka_timestamps=True,
        discovery_interval_ms=0,
    )
    watermarks = BoundedOutOfOrderness(0, idleness_ms)
    (
        p.source(src, uid="in", watermarks=watermarks)
        .key_by(lambda v: v.split("-")[0])
        .window(Tumbling(1_000), Count(), uid="w")
        .map(lambda w: (w.key, w.start, w.value))
        .sink(out, uid="out")
    )
    return p


def test_an_idle_partition_does_not_hold_back_event_time_windows(
    kafka: KafkaBroker,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    running: list[Running],
) -> None:
    topic = make_topic(kafka, f"idle-{unique()}", 2)  # partition 1 never gets a record
    values = ["x-1", "x-2", "x-3", "x-4"]
    # Recent timestamps (the broker's retention deletes records stamped long ago).
    base = (int(time.time()) - 600) * 1000
    produce(kafka, topic, 0, values, ts=[base + t for t in (0, 500, 1_100, 2_200)])
    cfg = ("epoch.max_records=2", "checkpoint.every_epochs=1")

    # Without idleness the empty partition's watermark (none yet) holds every window back.
    out = CollectSink()
    job = Running(window_pipeline(kafka, topic, 0, out), tmp_path / "held", monkeypatch, *cfg)
    running.append(job)
    job.wait_for("the records read", lambda: job.job.status.records_in == 4)
    time.sleep(1.0)  # time enough for idleness, had it been on
    job.stop()
    assert out.results == []

    # With idleness the empty partition stops counting: windows up to the watermark fire.
    out = CollectSink()
    job = Running(window_pipeline(kafka, topic, 300, out), tmp_path / "idle", monkeypatch, *cfg)
    running.append(job)
    job.wait_for("two windows", lambda: len(out.results) == 2)
    job.stop()
    # The third window waits: the watermark is its last record's timestamp.
    assert out.results == [("x", base, 2), ("x", base + 1_000, 1)]


def test_a_record_that_fails_to_decode_fails_the_job_naming_its_offset(
    kafka: KafkaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = make_topic(kafka, f"bad-{unique()}", 1)
    produce(kafka, topic, 0, ["1", "2", "3", "oops", "5"])

    def decode(r: KafkaRecord) -> int:
        assert r.value is not None
        return int(r.value)

    p = Pipeline("kafka-bad")
    src = KafkaSource(kafka.bootstrap_servers, topic, bounded=True, decode=decode)
    p.source(src, uid="in").sink(CollectSink(), uid="out")
    with pytest.raises(Exception) as err:
        run_in_process(p, tmp_path, monkeypatch, "restart.strategy=none")
    text = str(err.value)
    assert f"at {topic} partition 0 offset 3: ValueError" in text, text
    assert "dead_letter=" in text


def test_a_record_that_fails_to_decode_goes_to_the_dead_letter_topic(
    kafka: KafkaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = make_topic(kafka, f"dl-{unique()}", 1)
    dead = make_topic(kafka, f"{topic}-dead", 1)
    p = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for i, v in enumerate(["1", "2", "oops", "4"]):
        p.produce(topic, v.encode(), f"k{i}".encode(), headers=[("trace", b"t%d" % i)])
    assert p.flush(30) == 0

    def decode(r: KafkaRecord) -> tuple[int, bytes | None]:
        assert r.value is not None
        return int(r.value), r.header("trace")

    pipeline = Pipeline("kafka-dead-letter")
    out = CollectSink()
    src = KafkaSource(kafka.bootstrap_servers, topic, bounded=True, decode=decode, dead_letter=dead)
    pipeline.source(src, uid="in").sink(out, uid="out")
    job = run_in_process(pipeline, tmp_path, monkeypatch)
    assert out.results == [(1, b"t0"), (2, b"t1"), (4, b"t3")]
    assert job.status.dead_letters == {"in": 1}
    metrics = render_metrics(job)[0].decode()
    assert 'stator_source_dead_letters_total{job="kafka-dead-letter",source="in"} 1.0' in metrics

    c = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "group.id": f"g-{unique()}",
            "auto.offset.reset": "earliest",
        }
    )
    c.assign([TopicPartition(dead, 0, 0)])
    msgs = [m for m in c.consume(10, timeout=10) if m.error() is None]
    c.close()
    assert len(msgs) == 1
    (m,) = msgs
    headers = dict(m.headers() or [])
    assert (m.key(), m.value()) == (b"k2", b"oops")
    assert headers["trace"] == b"t2"
    assert headers["stator.topic"] == topic.encode()
    assert (headers["stator.partition"], headers["stator.offset"]) == (b"0", b"2")
    assert headers["stator.error"].startswith(b"ValueError: invalid literal for int()")


def test_lag_in_records_and_seconds_is_in_the_metrics_and_the_job_answer(
    kafka: KafkaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = make_topic(kafka, f"lag-{unique()}", 2)
    old = int(time.time() * 1000) - 60_000  # every record a minute old
    produce(kafka, topic, 0, [str(i) for i in range(300)], ts=[old] * 300)
    produce(kafka, topic, 1, ["x"], ts=[old])

    pipeline = Pipeline("kafka-lag")
    src = KafkaSource(kafka.bootstrap_servers, topic, bounded=True, decode=as_tuple)
    pipeline.source(src, uid="in").sink(CollectSink(), uid="out")
    seen: list[tuple[int, str, Any]] = []
    harness_job: list[Job] = []

    def look(result: Any) -> None:
        (job,) = harness_job
        text = render_metrics(job)[0].decode()
        lines = sorted(line for line in text.splitlines() if line.startswith("stator_source_lag"))
        seen.append((result.epoch, "\n".join(lines), job_info(job, job.status)))

    original = Job.__init__

    def init(self: Job, *args: Any, **kw: Any) -> None:
        original(self, *args, **kw)
        harness_job.append(self)
        self.on_epoch(look)

    monkeypatch.setattr(Job, "__init__", init)
    run_in_process(pipeline, tmp_path, monkeypatch, "epoch.max_records=200")

    # Epoch 1 was planned at offsets 0/0: 300 and 1 records behind, the next ones 60 s old.
    epoch, text, info = seen[0]
    assert epoch == 1
    expected = [
        f'stator_source_lag_records{{job="kafka-lag",source="in",split="{topic}:0"}} 300.0',
        f'stator_source_lag_records{{job="kafka-lag",source="in",split="{topic}:1"}} 1.0',
    ]
    assert [line for line in text.splitlines() if "lag_records{" in line] == expected
    ages = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if "seconds{" in line]
    assert len(ages) == 2 and all(60 <= a < 90 for a in ages), ages
    assert info.lag_records == 301 and 60_000 <= info.lag_ms < 90_000
    # Measured when the epoch was planned (the autoscaler times its samples by it).
    planned_at = info.lag_at_ms
    assert planned_at is not None and old + 60_000 <= planned_at <= time.time() * 1000
    assert info.sources is not None
    assert {s: x.records for s, x in (info.sources["in"].splits or {}).items()} == {
        f"{topic}:0": 300,
        f"{topic}:1": 1,
    }
    # Epoch 2 was planned after 100 + 1 records: 200 left on partition 0; partition 1 is
    # finished (bounded), so it has no lag any more.
    epoch, text, info = seen[1]
    assert [line for line in text.splitlines() if "lag_records{" in line] == [
        expected[0][:-5] + "200.0"
    ]
    assert info.lag_records == 200
    assert info.lag_at_ms is not None and info.lag_at_ms > planned_at
    # A Kafka record became available when Kafka stored it (its timestamp): a minute before
    # its epoch's output was committed (docs/control-api.md, "Metrics").
    (job,) = harness_job
    metrics = job_info(job, job.status).metrics
    assert metrics is not None
    committed = metrics.operators["out"].committed_latency
    assert committed is not None and committed.count == 301
    assert 60_000 <= committed.sum_ms / committed.count < 90_000, committed
    assert metrics.operators["in"].records_out == 301
