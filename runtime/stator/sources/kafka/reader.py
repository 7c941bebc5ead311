"""Reading one planned offset range of one partition on an executor, and decoding it.

A record the decoder cannot decode either fails the task naming topic, partition and offset,
or (with a dead-letter topic) is produced there with its original key, value and headers
plus ``stator.error``/``stator.topic``/``stator.partition``/``stator.offset`` headers. The
dead-letter topic is at-least-once: a retried task produces its rejects again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...errors import StatorError
from ..base import SplitRange
from .discovery import parse_split

Headers = tuple[tuple[str, bytes | None], ...]


@dataclass(frozen=True)
class KafkaRecord:
    """A record as the decoder sees it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int  # ms, as stored by Kafka
    headers: Headers = ()

    def header(self, name: str) -> bytes | None:
        """The last value of header ``name`` (None if absent)."""
        return next((v for k, v in reversed(self.headers) if k == name), None)


@dataclass(frozen=True)
class ReadOptions:
    config: dict[str, Any]  # consumer config
    decode: Callable[[KafkaRecord], Any]
    with_timestamps: bool
    timeout_s: float
    dead_letter: str | None  # topic, or None: a decode failure fails the task
    producer_config: dict[str, Any]


class DeadLetters:
    """Rejected records of one read, produced when the read ends (flushed, so the task's
    success means they are in the topic)."""

    def __init__(self, topic: str, config: dict[str, Any]) -> None:
        self.topic, self.config = topic, config
        self.producer: Any = None
        self.count = 0

    def add(self, rec: KafkaRecord, error: BaseException) -> None:
        if self.producer is None:
            from confluent_kafka import Producer  # noqa: PLC0415

            self.producer = Producer(self.config)
        headers = [
            *rec.headers,
            ("stator.error", f"{type(error).__name__}: {error}"[:4000].encode()),
            ("stator.topic", rec.topic.encode()),
            ("stator.partition", str(rec.partition).encode()),
            ("stator.offset", str(rec.offset).encode()),
        ]
        self.producer.produce(self.topic, rec.value, rec.key, headers=headers)
        self.producer.poll(0)
        self.count += 1

    def flush(self, timeout_s: float) -> None:
        if self.producer is None:
            return
        left = self.producer.flush(timeout_s)
        if left:
            raise StatorError(
                f"{left} record(s) could not be produced to dead-letter topic '{self.topic}' "
                f"within {timeout_s:.0f}s; is the topic writable?"
            )


def _headers(raw: Any) -> Headers:
    """confluent_kafka gives a list of (name, bytes) pairs, or None."""
    return tuple((str(k), v if v is None else bytes(v)) for k, v in raw or ())


def _decoded(opts: ReadOptions, rec: KafkaRecord, rejects: DeadLetters | None) -> tuple[bool, Any]:
    try:
        return True, opts.decode(rec)
    except Exception as exc:
        if rejects is None:
            raise StatorError(
                f"could not decode the record at {rec.topic} partition {rec.partition} "
                f"offset {rec.offset}: {type(exc).__name__}: {exc} (set "
                f"KafkaSource(dead_letter='<topic>') to divert such records instead)"
            ) from exc
        rejects.add(rec, exc)
        return False, None


def read_range(opts: ReadOptions, rng: SplitRange) -> tuple[list[Any], int, list[int]]:
    """The decoded records of ``rng`` in offset order, how many went to dead letters, and
    each decoded record's Kafka timestamp (when it became available:
    ``epoch/availability.py``)."""
    from confluent_kafka import Consumer, TopicPartition  # noqa: PLC0415

    start, end = int(rng.start), int(rng.end)
    if end <= start:
        return [], 0, []
    topic, partition = parse_split(rng.split)
    consumer = Consumer(opts.config)
    consumer.assign([TopicPartition(topic, partition, start)])
    rejects = DeadLetters(opts.dead_letter, opts.producer_config) if opts.dead_letter else None
    out: list[Any] = []
    stamps: list[int] = []
    deadline = time.monotonic() + opts.timeout_s
    expected = start  # the next offset, if there are no gaps
    try:
        while True:
            # consume() waits for num_messages or its timeout: ask for no more than the range
            # still holds, else every task waits out the timeout (it cost 1 s per task).
            want = max(1, min(10_000, end - expected))
            msgs = consumer.consume(num_messages=want, timeout=0.1)
            done = False
            for msg in msgs:
                if msg.error() is not None:
                    raise StatorError(f"reading {rng.split}: {msg.error()}")
                offset = msg.offset() or 0
                if offset >= end:
                    done = True
                    break
                rec = KafkaRecord(
                    topic,
                    partition,
                    offset,
                    msg.key(),
                    msg.value(),
                    msg.timestamp()[1],
                    _headers(msg.headers()),
                )
                ok, value = _decoded(opts, rec, rejects)
                if ok:
                    out.append((value, rec.timestamp) if opts.with_timestamps else value)
                    stamps.append(rec.timestamp)
                done = offset == end - 1
                expected = offset + 1
            if done:
                break
            if msgs:
                deadline = time.monotonic() + opts.timeout_s
            # Offsets may have gaps (compaction, transaction markers): the position tells.
            position = consumer.position([TopicPartition(topic, partition)])[0].offset
            if position >= end:
                break
            if time.monotonic() > deadline:
                raise StatorError(
                    f"reading {rng.split} offsets [{start}, {end}) stalled at {position} "
                    f"for {opts.timeout_s:.0f}s; were the records deleted by retention?"
                )
        if rejects is not None:
            rejects.flush(opts.timeout_s)
    finally:
        consumer.close()
    return out, rejects.count if rejects is not None else 0, stamps
