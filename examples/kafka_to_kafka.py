"""Kafka in, Kafka out, exactly once: per-user running totals of payments.

Reads JSON payments (``{"user": ..., "amount": ..., "ts": ...}``) from ``STATOR_KAFKA_IN``
(default ``payments``), keeps a running total per user in keyed state, and writes
``{"user", "total", "payments"}`` keyed by user to ``STATOR_KAFKA_OUT`` (default ``totals``)
through the transactional Kafka sink: a ``read_committed`` consumer sees each update once,
whatever fails (records become visible when the checkpoint covering them completes).

Against the test bed's broker (``python -m tests.testbed up`` prints its address)::

    export STATOR_KAFKA=127.0.0.1:<port>
    python examples/kafka_to_kafka.py produce 10000        # create the topics, write payments
    stator run examples/kafka_to_kafka.py:pipeline --set checkpoint.storage=file:///tmp/k2k
    python examples/kafka_to_kafka.py read                 # the committed totals, per user

``STATOR_KAFKA_BOUNDED=1`` makes the job stop once it has read what the topic held when it
started (as its test does); otherwise it runs until stopped.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Iterable
from typing import Any

from stator import INT64, Context, KeyedProcessFunction, Pipeline, RuntimeContext
from stator import ValueStateDescriptor as Value
from stator.sinks import KafkaSink
from stator.sources import KafkaRecord, KafkaSource

PARTITIONS = 4


def _settings() -> tuple[str, str, str]:
    return (
        os.environ.get("STATOR_KAFKA", "127.0.0.1:9092"),
        os.environ.get("STATOR_KAFKA_IN", "payments"),
        os.environ.get("STATOR_KAFKA_OUT", "totals"),
    )


def decode(record: KafkaRecord) -> dict[str, Any]:
    payment: dict[str, Any] = json.loads(record.value or b"{}")
    return payment


class RunningTotal(KeyedProcessFunction):
    def open(self, ctx: RuntimeContext) -> None:
        self.total = ctx.get_state(Value("total", INT64))
        self.count = ctx.get_state(Value("payments", INT64))

    def process_element(self, value: Any, ctx: Context) -> Iterable[Any]:
        total = self.total.value(0) + int(value["amount"])
        count = self.count.value(0) + 1
        self.total.update(total)
        self.count.update(count)
        yield {"user": ctx.current_key, "total": total, "payments": count}


def pipeline() -> Pipeline:
    bootstrap, source, out = _settings()
    bounded = os.environ.get("STATOR_KAFKA_BOUNDED", "") == "1"
    p = Pipeline("kafka-to-kafka", max_parallelism=64)
    (
        p.source(
            KafkaSource(
                bootstrap,
                source,
                bounded=bounded,
                decode=decode,
                group_id="kafka-to-kafka",  # offsets committed per checkpoint: lag tools see it
            ),
            uid="payments",
        )
        .key_by(lambda e: e["user"])
        .process(RunningTotal(), uid="running-total")
        .sink(KafkaSink(bootstrap, out, key=lambda r: r["user"]), uid="totals")
    )
    return p


def payments(n: int, start: int = 0) -> list[dict[str, Any]]:
    """Deterministic input: payments ``start`` to ``start + n`` of 50 users."""
    return [
        {"user": f"u{i % 50}", "amount": (i * 7) % 13 + 1, "ts": i} for i in range(start, start + n)
    ]


def produce(n: int, start: int = 0) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    bootstrap, source, out = _settings()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = admin.list_topics(timeout=30).topics
    new = [NewTopic(t, PARTITIONS, 1) for t in (source, out) if t not in existing]
    for future in admin.create_topics(new).values() if new else []:
        future.result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for payment in payments(n, start):
        producer.produce(source, key=payment["user"].encode(), value=json.dumps(payment).encode())
        producer.poll(0)
    if producer.flush(60):
        raise SystemExit("some payments were not acknowledged by the broker")
    print(f"{n} payments in '{source}'; output goes to '{out}'")


def read_totals() -> dict[str, dict[str, Any]]:
    """The newest committed total per user (what a read_committed consumer sees)."""
    bootstrap, _, out = _settings()
    return {update["user"]: update for update in committed_records(bootstrap, out)}


def committed_records(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    """Every committed JSON record of ``topic``, in each partition's order (what a
    ``read_committed`` consumer reads from the start to the end)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"k2k-read-{uuid.uuid4().hex[:6]}",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    parts = consumer.list_topics(topic, timeout=30).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in parts])
    records: list[dict[str, Any]] = []
    done: set[int] = set()
    try:
        while len(done) < len(parts):
            msg = consumer.poll(10)
            if msg is None:
                break
            if msg.error() is not None:
                done.add(msg.partition() or 0)
                continue
            records.append(json.loads(msg.value() or b"{}"))
    finally:
        consumer.close()
    return records


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "produce":
        produce(int(sys.argv[2]) if len(sys.argv) > 2 else 10_000)
    elif len(sys.argv) >= 2 and sys.argv[1] == "read":
        for user, update in sorted(read_totals().items()):
            print(user, update["total"], update["payments"])
    else:
        raise SystemExit(__doc__)
