"""The test bed's Kafka broker serves real clients, and Spark's Kafka connector reads from it."""

from __future__ import annotations

import uuid
from typing import Any

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.testbed.kafka import KafkaBroker
from tests.testbed.spark import kafka_connector_jars
from tests.testbed.versions import PINS


def _topic(kafka: KafkaBroker, partitions: int) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    futures = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
    futures[name].result(timeout=30)
    return name


def _produce(kafka: KafkaBroker, topic: str, records: list[tuple[str, str]]) -> None:
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "enable.idempotence": True})
    for key, value in records:
        producer.produce(topic, key=key.encode(), value=value.encode())
    assert producer.flush(30) == 0, "every record is acknowledged"


def test_produce_and_consume(kafka: KafkaBroker) -> None:
    topic = _topic(kafka, partitions=3)
    sent = [(f"k{i % 7}", f"v{i}") for i in range(200)]
    _produce(kafka, topic, sent)

    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "group.id": topic,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    got: list[tuple[str, str, int]] = []
    try:
        while len(got) < len(sent):
            msg = consumer.poll(10)
            assert msg is not None, f"timed out after {len(got)} of {len(sent)} records"
            assert msg.error() is None, msg.error()
            got.append((msg.key().decode(), msg.value().decode(), msg.partition()))
    finally:
        consumer.close()
    assert sorted((k, v) for k, v, _ in got) == sorted(sent)
    # Keyed records keep per-key order within their partition.
    by_key: dict[str, list[int]] = {}
    for key, value, _ in got:
        by_key.setdefault(key, []).append(int(value[1:]))
    assert all(seq == sorted(seq) for seq in by_key.values())
    partitions_of = {k: {p for kk, _, p in got if kk == k} for k in by_key}
    assert all(len(parts) == 1 for parts in partitions_of.values())


def test_spark_reads_kafka_with_the_cached_connector(kafka: KafkaBroker, spark: Any) -> None:
    jars = kafka_connector_jars()
    assert any(j.name == f"spark-sql-kafka-0-10_2.13-{PINS.spark}.jar" for j in jars)
    topic = _topic(kafka, partitions=2)
    _produce(kafka, topic, [(f"k{i}", str(i)) for i in range(50)])

    df = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
    )
    rows = df.selectExpr("CAST(value AS STRING) AS v", "partition").collect()
    assert sorted(int(r.v) for r in rows) == list(range(50))
    assert {r.partition for r in rows} == {0, 1}
