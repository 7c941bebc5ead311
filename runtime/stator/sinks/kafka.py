"""Kafka sink: at-least-once. Records are produced while the epoch runs and flushed before
the task ends; a replayed epoch produces its records again, so consumers may see duplicates
after a failure (use the file sink, or make consumers idempotent by key, for exactly-once)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from .base import Sink, SinkWriter


class _KafkaWriter(SinkWriter):
    def __init__(self, sink: KafkaSink, part: str) -> None:
        from confluent_kafka import Producer  # noqa: PLC0415

        self.sink, self.part, self.count = sink, part, 0
        self.producer = Producer(
            {
                "bootstrap.servers": sink.bootstrap_servers,
                "enable.idempotence": True,
                **sink.producer_config,
            }
        )

    def write(self, values: list[Any]) -> None:
        produce, poll = self.producer.produce, self.producer.poll
        for v in values:
            key = self.sink.key(v)
            produce(
                self.sink.topic,
                value=self.sink.encode(v),
                key=None if key is None else str(key).encode(),
            )
            self.count += 1
            if self.count % 10_000 == 0:
                poll(0)

    def finish(self) -> tuple[dict[str, Any], Any]:
        left = self.producer.flush(60)
        if left:
            raise RuntimeError(
                f"{left} records to Kafka topic {self.sink.topic} were not acknowledged"
            )
        return {"part": self.part, "records": self.count}, None


class KafkaSink(Sink):
    exactly_once = False

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        key: Callable[[Any], Any] = lambda v: None,
        encode: Callable[[Any], bytes] = lambda v: json.dumps(v, default=str).encode(),
        producer_config: dict[str, Any] | None = None,
    ) -> None:
        self.bootstrap_servers, self.topic = bootstrap_servers, topic
        self.key, self.encode = key, encode
        self.producer_config = producer_config or {}

    def writer(self, uid: str, epoch: int, part: str) -> SinkWriter:
        return _KafkaWriter(self, part)
