"""Kafka source: one split per partition of its topics, positions are offsets, ranges read in
parallel by Spark tasks (each task reads its partition's offset range with its own consumer).

Offsets are planned on the driver from the partitions' high watermarks, so an epoch's input
is fixed before it runs and a restored job re-reads exactly the same offsets. The checkpoint
is the only record of progress; with ``group_id`` the offsets of each completed checkpoint
are also committed to the consumer group, for monitoring tools only.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from typing import Any

from ...epoch.availability import Availability, from_times
from ...errors import StatorError
from ..base import Source, SplitLag, SplitRange
from .discovery import TopicSelection, parse_split
from .lag import LagMeter
from .reader import KafkaRecord, ReadOptions, read_range
from .start import GROUP, TIMESTAMP, StartFrom, parse_start, resolve

log = logging.getLogger("stator.kafka")

DEFAULT_DISCOVERY_INTERVAL_MS = 30_000


def _identity(record: KafkaRecord) -> Any:
    return record


def _non_negative(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(
            f"KafkaSource {name} must be an int >= 0 (ms; 0 turns it off), got {value!r}"
        )
    return value


class KafkaSource(Source):
    split_key = staticmethod(parse_split)  # (topic, partition): 't:10' after 't:9'

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str | None = None,
        *,
        topics: Sequence[str] | None = None,
        topic_pattern: str | re.Pattern[str] | None = None,
        start: str | StartFrom = "earliest",
        group_id: str | None = None,
        commit_offsets_on_checkpoint: bool | None = None,
        discovery_interval_ms: int = DEFAULT_DISCOVERY_INTERVAL_MS,
        bounded: bool = False,
        decode: Callable[[KafkaRecord], Any] = _identity,
        dead_letter: str | None = None,
        kafka_timestamps: bool = False,
        consumer_config: dict[str, Any] | None = None,
        producer_config: dict[str, Any] | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        """``topic``, ``topics`` or ``topic_pattern`` (``re.fullmatch`` on names): what to
        read. ``start``: where partitions no checkpoint knows begin (``start.py``).
        ``group_id``: the consumer group whose offsets ``start='group-offsets'`` reads and
        to which each completed checkpoint's offsets are committed (unless
        ``commit_offsets_on_checkpoint=False``). ``discovery_interval_ms``: look for new
        partitions (and, with a pattern, topics) this often while running; 0: only at start.
        ``bounded``: stop at the end offsets seen when the job first plans (a finite
        backlog; no discovery); otherwise read forever. ``dead_letter``: a topic that takes
        records ``decode`` fails on (else the job fails naming the record's offset).
        ``kafka_timestamps``: use Kafka's record timestamps as event time (unless the
        pipeline gives a timestamp function)."""
        self.selection = TopicSelection.of(topic, topics, topic_pattern)
        self.group_id = group_id
        self.start = parse_start(start, group_id)
        self.timestamp_ms = self.start.timestamp_ms or 0
        if commit_offsets_on_checkpoint and not group_id:
            raise ValueError(
                "KafkaSource commit_offsets_on_checkpoint=True needs group_id='<consumer group>'"
            )
        self.commit_offsets = (
            bool(group_id)
            if commit_offsets_on_checkpoint is None
            else bool(commit_offsets_on_checkpoint)
        )
        interval = _non_negative("discovery_interval_ms", discovery_interval_ms)
        self.discovery_interval_ms = 0 if bounded else interval
        if dead_letter is not None and (not isinstance(dead_letter, str) or not dead_letter):
            raise ValueError(f"KafkaSource dead_letter must be a topic name, got {dead_letter!r}")
        if not callable(decode):
            raise ValueError(
                f"KafkaSource decode must be a function of a KafkaRecord, got {decode!r}"
            )
        self.bootstrap_servers, self.bounded, self.decode = bootstrap_servers, bounded, decode
        self.dead_letter = dead_letter
        self.provides_timestamps = kafka_timestamps
        self.consumer_config = consumer_config or {}
        self.producer_config = producer_config or {}
        self.timeout_s = timeout_s
        self._consumer: Any = None
        self._end: dict[str, int] = {}
        self._lag = LagMeter()

    @property
    def topic(self) -> str:
        """The single topic (``topic=`` or a one-element ``topics=``), for older callers."""
        if len(self.selection.topics) != 1:
            raise AttributeError("this KafkaSource reads several topics or a pattern")
        return self.selection.topics[0]

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_consumer": None, "_lag": LagMeter()}

    def _config(self) -> dict[str, Any]:
        return {
            "bootstrap.servers": self.bootstrap_servers,
            "group.id": self.group_id or "stator",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            **self.consumer_config,
            **({"group.id": self.group_id} if self.group_id else {}),
        }

    @property
    def consumer(self) -> Any:
        if self._consumer is None:
            from confluent_kafka import Consumer  # noqa: PLC0415

            self._consumer = Consumer(self._config())
        return self._consumer

    # ------------------------------------------------------------------ driver: discovery

    def discover_splits(self) -> list[str]:
        wanted = None if self.selection.pattern is not None else self.selection.topics
        if wanted is not None and len(wanted) == 1:
            md = self.consumer.list_topics(wanted[0], timeout=self.timeout_s)
        else:
            md = self.consumer.list_topics(timeout=self.timeout_s)
        listed = {
            name: (None if t.error is not None else sorted(t.partitions))
            for name, t in md.topics.items()
        }
        try:
            return self.selection.splits(listed)
        except StatorError as exc:
            raise StatorError(f"{exc} (at {self.bootstrap_servers})") from exc

    def _offsets(self, split: str) -> tuple[int, int]:
        from confluent_kafka import TopicPartition  # noqa: PLC0415

        topic, partition = parse_split(split)
        lo, hi = self.consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=self.timeout_s, cached=False
        )
        return int(lo), int(hi)

    def initial_position(self, split: str) -> Any:
        from confluent_kafka import TopicPartition  # noqa: PLC0415

        lo, hi = self._offsets(split)
        topic, partition = parse_split(split)
        by_time = committed = None
        if self.start.mode == TIMESTAMP:
            tp = TopicPartition(topic, partition, self.timestamp_ms)
            found = self.consumer.offsets_for_times([tp], timeout=self.timeout_s)[0]
            by_time = found.offset if found.offset >= 0 else None
        elif self.start.mode == GROUP:
            tp = TopicPartition(topic, partition)
            found = self.consumer.committed([tp], timeout=self.timeout_s)[0]
            committed = found.offset if found.offset >= 0 else None
        return resolve(self.start, split, lo, hi, by_time, committed)

    def new_split_position(self, split: str) -> Any:
        return self._offsets(split)[0]  # earliest, as Flink does for discovered partitions

    # ------------------------------------------------------------------ driver: planning

    def plan(self, positions: dict[str, Any], budget: int, now_ms: int) -> list[SplitRange]:
        per_split = max(1, budget // max(1, len(positions)))
        order = {s: i for i, s in enumerate(sorted(positions, key=parse_split))}
        ranges = []
        for split, pos in positions.items():
            lo, hi = self._offsets(split)
            start = max(int(pos), lo)  # retention may have deleted what we had not read
            if self.bounded:
                hi = self._end.setdefault(split, hi)
            self._lag.measure(split, start, hi, now_ms, self._peek)
            end = min(hi, start + per_split)
            final = self.bounded and end >= hi
            if end > start or final:
                ranges.append(SplitRange(split, start, end, order[split], final=final))
        self._lag.forget(set(positions))
        return ranges

    def _peek(self, split: str, offset: int) -> int | None:
        """The Kafka timestamp of the record at ``offset`` or the next one after it."""
        from confluent_kafka import TopicPartition  # noqa: PLC0415

        topic, partition = parse_split(split)
        c = self.consumer
        c.assign([TopicPartition(topic, partition, offset)])
        try:
            msgs = c.consume(num_messages=1, timeout=min(1.0, self.timeout_s))
        finally:
            c.unassign()
        good = [m for m in msgs if m.error() is None]
        return int(good[0].timestamp()[1]) if good else None

    def lag(self) -> dict[str, SplitLag]:
        return dict(self._lag.lag)

    def on_checkpoint_complete(self, positions: dict[str, Any]) -> None:
        """Commit the checkpoint's offsets to the consumer group (monitoring only: restore
        reads the checkpoint, never the group)."""
        if not self.commit_offsets or not positions:
            return
        from confluent_kafka import TopicPartition  # noqa: PLC0415

        offsets = [
            TopicPartition(*parse_split(split), int(pos))
            for split, pos in sorted(positions.items())
        ]
        self.consumer.commit(offsets=offsets, asynchronous=False)

    # ------------------------------------------------------------------ executors

    def read_counted(self, rng: SplitRange) -> tuple[list[Any], int]:
        records, rejected, _ = read_range(self._read_options(), rng)
        return records, rejected

    def read_available(
        self, rng: SplitRange, planned_ms: int
    ) -> tuple[list[Any], int, Availability]:
        """Records became available when Kafka stored them (their timestamps: the broker's
        with ``LogAppendTime``, else the producer's)."""
        records, rejected, stamps = read_range(self._read_options(), rng)
        return records, rejected, from_times(stamps)

    def _read_options(self) -> ReadOptions:
        return ReadOptions(
            self._config(),
            self.decode,
            self.provides_timestamps,
            self.timeout_s,
            self.dead_letter,
            {"bootstrap.servers": self.bootstrap_servers, **self.producer_config},
        )

    def read(self, rng: SplitRange) -> list[Any]:
        return self.read_counted(rng)[0]

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
