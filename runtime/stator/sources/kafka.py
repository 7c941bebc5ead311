"""Kafka source: one split per partition, positions are offsets, ranges read in parallel by
Spark tasks (each task reads its partition's offset range with its own consumer).

Offsets are planned on the driver from the partitions' high watermarks, so an epoch's input
is fixed before it runs and a restored job re-reads exactly the same offsets. Consumer groups
and committed offsets are not used: the checkpoint is the only record of progress.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import StatorError
from .base import Source, SplitRange


@dataclass(frozen=True)
class KafkaRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int  # ms, as stored by Kafka


def _identity(record: KafkaRecord) -> Any:
    return record


class KafkaSource(Source):
    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        start: str = "earliest",
        bounded: bool = False,
        decode: Callable[[KafkaRecord], Any] = _identity,
        kafka_timestamps: bool = False,
        consumer_config: dict[str, Any] | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        """``bounded``: stop at the end offsets seen when the job first plans (a finite
        backlog); otherwise read forever. ``kafka_timestamps``: use Kafka's record timestamps
        as event time (unless the pipeline gives a timestamp function)."""
        if start not in ("earliest", "latest"):
            raise ValueError(f"KafkaSource start must be 'earliest' or 'latest', got {start!r}")
        self.bootstrap_servers, self.topic, self.start = bootstrap_servers, topic, start
        self.bounded, self.decode = bounded, decode
        self.provides_timestamps = kafka_timestamps
        self.consumer_config = consumer_config or {}
        self.timeout_s = timeout_s
        self._consumer: Any = None
        self._end: dict[str, int] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_consumer": None}

    def _config(self) -> dict[str, Any]:
        return {
            "bootstrap.servers": self.bootstrap_servers,
            "group.id": "stator",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            **self.consumer_config,
        }

    @property
    def consumer(self) -> Any:
        if self._consumer is None:
            from confluent_kafka import Consumer  # noqa: PLC0415

            self._consumer = Consumer(self._config())
        return self._consumer

    def _partition(self, split: str) -> int:
        return int(split.rsplit(":", 1)[1])

    def discover_splits(self) -> list[str]:
        md = self.consumer.list_topics(self.topic, timeout=self.timeout_s)
        topic = md.topics.get(self.topic)
        if topic is None or topic.error is not None or not topic.partitions:
            reason = topic.error if topic is not None and topic.error else "no partitions"
            raise StatorError(
                f"Kafka topic '{self.topic}' at {self.bootstrap_servers} is not "
                f"readable ({reason}); create it first"
            )
        return [f"{self.topic}:{p}" for p in sorted(topic.partitions)]

    def _offsets(self, split: str) -> tuple[int, int]:
        from confluent_kafka import TopicPartition  # noqa: PLC0415

        lo, hi = self.consumer.get_watermark_offsets(
            TopicPartition(self.topic, self._partition(split)), timeout=self.timeout_s, cached=False
        )
        return int(lo), int(hi)

    def initial_position(self, split: str) -> Any:
        lo, hi = self._offsets(split)
        return lo if self.start == "earliest" else hi

    def plan(self, positions: dict[str, Any], budget: int, now_ms: int) -> list[SplitRange]:
        per_split = max(1, budget // max(1, len(positions)))
        order = {s: i for i, s in enumerate(sorted(positions, key=self._partition))}
        ranges = []
        for split, pos in positions.items():
            lo, hi = self._offsets(split)
            start = max(int(pos), lo)  # retention may have deleted what we had not read
            if self.bounded:
                hi = self._end.setdefault(split, hi)
            end = min(hi, start + per_split)
            final = self.bounded and end >= hi
            if end > start or final:
                ranges.append(SplitRange(split, start, end, order[split], final=final))
        return ranges

    def read(self, rng: SplitRange) -> list[Any]:
        from confluent_kafka import Consumer, TopicPartition  # noqa: PLC0415

        start, end = int(rng.start), int(rng.end)
        if end <= start:
            return []
        partition = self._partition(rng.split)
        consumer = Consumer(self._config())
        tp = TopicPartition(self.topic, partition, start)
        consumer.assign([tp])
        out: list[Any] = []
        decode, with_ts = self.decode, self.provides_timestamps
        deadline = time.monotonic() + self.timeout_s
        try:
            while True:
                msgs = consumer.consume(num_messages=10_000, timeout=1.0)
                done = False
                for msg in msgs:
                    if msg.error() is not None:
                        raise StatorError(f"reading {rng.split}: {msg.error()}")
                    offset = msg.offset() or 0
                    if offset >= end:
                        done = True
                        break
                    rec = KafkaRecord(
                        self.topic, partition, offset, msg.key(), msg.value(), msg.timestamp()[1]
                    )
                    out.append((decode(rec), rec.timestamp) if with_ts else decode(rec))
                    done = offset == end - 1
                if done:
                    break
                if msgs:
                    deadline = time.monotonic() + self.timeout_s
                # Offsets may have gaps (compaction, transaction markers): the position tells.
                position = consumer.position([TopicPartition(self.topic, partition)])[0].offset
                if position >= end:
                    break
                if time.monotonic() > deadline:
                    raise StatorError(
                        f"reading {rng.split} offsets [{start}, {end}) stalled at {position} "
                        f"for {self.timeout_s:.0f}s; were the records deleted by retention?"
                    )
        finally:
            consumer.close()
        return out

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
