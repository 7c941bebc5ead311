"""Publishing staged epochs to Kafka in fenced transactions, exactly once (driver side).

librdkafka cannot resume a transaction another producer opened, and a Spark task ends with
its epoch while the commit comes later, from the driver. So a task stages its records
(``frames.py``) beside the job's checkpoints, and when the checkpoint covering the epoch
completes the driver publishes them in one Kafka transaction. Publishing epoch E:

1. The producer (``transactional.id`` stable per job and sink) was initialised: that fenced
   every earlier producer of the id (a replaced driver, a previous attempt) and aborted the
   transaction it had open. Failure: the sink cannot commit; the epoch fails and the job
   rewinds to the checkpoint, which lists E's output to publish again.
2. The marker is read: the consumer group named like the transactional id holds, as the
   committed offset of the output topic's partition 0 and its metadata, the ids of the last
   ``HISTORY`` epochs published. E's id (a hash of its staged objects, whose names carry the
   task attempt) is in it: E was published (by this driver before a crash, or by a driver
   that was replaced) and is skipped. Failure: as 1.
3. Begin, produce E's frames, commit the marker with ``send_offsets_to_transaction``, commit.
   The records and the marker become visible together or not at all. Failure before the
   commit: the transaction is aborted (by us, or by the broker at ``transaction.timeout.ms``,
   or by the next producer's step 1) and E stays pending; a fenced producer (another driver
   took over) or a transaction the broker timed out fails loudly naming the fix.
4. E's staged objects are deleted. Failure: they stay (a retry finds E in the marker).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

from ... import failpoints
from ...errors import SinkCommitError
from .frames import Frame

log = logging.getLogger("stator.sinks.kafka")

HISTORY = 64  # epoch ids kept in the marker (a restore from older output publishes again)


def commit_id(uid: str, epoch: int, staged: Iterable[str]) -> str:
    """Names one epoch's output: its staged objects carry the attempt that wrote them, so a
    replayed epoch (different attempts) gets another id and is published again."""
    text = json.dumps([uid, epoch, sorted(staged)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class TransactionalPublisher:
    """One transactional producer per sink in the driver, reused across epochs."""

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        transactional_id: str,
        producer_config: dict[str, Any],
        timeout_s: float,
    ) -> None:
        self.topic, self.transactional_id, self.timeout_s = topic, transactional_id, timeout_s
        self.config = {
            "bootstrap.servers": bootstrap_servers,
            "partitioner": "murmur2_random",  # the Java client's: same key, same partition
            "linger.ms": 5,
            **producer_config,
            "transactional.id": transactional_id,
            "enable.idempotence": True,
        }
        self.txn_timeout_ms = int(self.config.get("transaction.timeout.ms", 60_000))
        self._lock = threading.Lock()
        self._producer: Any = None
        self._consumer: Any = None
        self._published: list[str] = []
        self._sequence = 0

    # -- steps 1 and 2 -------------------------------------------------------------------
    def _open(self) -> None:
        from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: PLC0415

        if self._producer is not None:
            return
        producer = Producer(self.config)
        try:
            producer.init_transactions(self.timeout_s)
        except Exception as exc:
            raise SinkCommitError(
                f"Kafka sink to '{self.topic}': cannot initialise transactional id "
                f"'{self.transactional_id}' at {self.config['bootstrap.servers']}: {exc}"
            ) from exc
        consumer = Consumer(
            {
                "bootstrap.servers": self.config["bootstrap.servers"],
                "group.id": self.transactional_id,
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            }
        )
        got = consumer.committed([TopicPartition(self.topic, 0)], timeout=self.timeout_s)[0]
        self._published, self._sequence = _parse_marker(got.offset, got.metadata)
        self._producer, self._consumer = producer, consumer

    def _reset(self) -> None:
        """After any failure: the next publish starts at step 1 (and aborts what was open)."""
        if self._consumer is not None:
            with contextlib.suppress(Exception):  # being replaced: nothing to save
                self._consumer.close()
        self._producer = self._consumer = None

    def published(self, cid: str) -> bool:
        with self._lock:
            try:
                self._open()
            except Exception:
                self._reset()
                raise
            return cid in self._published

    # -- step 3 --------------------------------------------------------------------------
    def publish(self, cid: str, epoch: int, frames: Iterable[Frame]) -> int:
        """Produce ``frames`` and the marker naming ``cid`` in one transaction; returns the
        records produced (0 if ``cid`` was published already)."""
        from confluent_kafka import KafkaException, TopicPartition  # noqa: PLC0415

        with self._lock:
            began = time.monotonic()
            try:
                self._open()
                if cid in self._published:
                    return 0
                producer, topic = self._producer, self.topic
                producer.begin_transaction()
                n = 0
                produce, poll = producer.produce, producer.poll
                for key, value, ts in frames:
                    stamp = 0 if ts is None else ts  # 0: the producer stamps it
                    while True:
                        try:
                            produce(topic, value=value, key=key, timestamp=stamp)
                            break
                        except BufferError:  # the local queue is full: let it drain
                            poll(0.1)
                    n += 1
                    if n % 20_000 == 0:
                        poll(0)
                producer.flush(self.timeout_s)  # (the commit would wait for it anyway)
                failpoints.reach("kafka-sink.produced")  # in the broker's log, uncommitted
                ids = [*self._published, cid][-HISTORY:]
                marker = TopicPartition(
                    topic, 0, self._sequence + 1, metadata=json.dumps({"v": 1, "ids": ids})
                )
                producer.send_offsets_to_transaction(
                    [marker], self._consumer.consumer_group_metadata(), self.timeout_s
                )
                producer.commit_transaction(self.timeout_s)
                failpoints.reach("kafka-sink.committed")  # visible, not yet recorded here
            except KafkaException as exc:
                elapsed_ms = (time.monotonic() - began) * 1000
                self._abort()
                raise SinkCommitError(self._explain(exc, epoch, elapsed_ms)) from exc
            except Exception:
                self._abort()
                raise
            self._published, self._sequence = ids, self._sequence + 1
            return n

    def _abort(self) -> None:
        producer = self._producer
        if producer is not None:
            with contextlib.suppress(Exception):
                producer.abort_transaction(self.timeout_s)
        self._reset()

    def _explain(self, exc: Exception, epoch: int, elapsed_ms: float) -> str:
        err: Any = exc.args[0] if exc.args else None
        name = err.name() if err is not None and hasattr(err, "name") else ""
        what = f"Kafka sink to '{self.topic}' could not commit epoch {epoch}"
        if elapsed_ms >= self.txn_timeout_ms:
            return (
                f"{what}: its transaction ran {elapsed_ms:.0f} ms, longer than "
                f"transaction.timeout.ms={self.txn_timeout_ms}, and the broker aborted it "
                f"(nothing of it is visible; it is published again after the rewind). Raise "
                f"producer_config['transaction.timeout.ms'] (at most the broker's "
                f"transaction.max.timeout.ms) or lower epoch.max_records"
            )
        if name in ("_FENCED", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH"):
            return (
                f"{what}: transactional id '{self.transactional_id}' was taken over by "
                f"another producer (a newer driver of this job, or another job with the "
                f"same transactional_id_prefix): {exc}"
            )
        return f"{what}: {exc}"

    def close(self) -> None:
        with self._lock:
            self._reset()


def _parse_marker(offset: int, metadata: str | None) -> tuple[list[str], int]:
    """The published ids and sequence a marker holds (none yet: empty, 0)."""
    if offset is None or offset < 0 or not metadata:
        return [], 0
    try:
        data = json.loads(metadata)
        ids = [str(i) for i in data["ids"]]
    except (ValueError, KeyError, TypeError):
        log.warning("marker of a Kafka sink has foreign metadata %r: ignored", metadata[:80])
        return [], max(offset, 0)
    return ids, offset
