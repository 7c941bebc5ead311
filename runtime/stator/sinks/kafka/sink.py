"""Kafka sink: exactly-once through fenced transactions (default with checkpoints), or
at-least-once when asked.

``exactly-once``: each task stages its epoch's records beside the job's checkpoints
(``_sinks/<uid>/epoch=<E>/<part>.<attempt>.kfr``); the driver publishes an epoch's staged
records in one Kafka transaction once the checkpoint covering it completes
(``publisher.py`` has the steps and why). ``read_committed`` consumers see each record once.
``at-least-once``: produced while the epoch runs and flushed before the task ends; a replayed
epoch produces its records again.
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from ... import failpoints
from ...errors import StatorError
from ...storage import ObjectStore, S3Options, open_store
from ..base import Sink, SinkContext, SinkWriter
from .frames import Frame, FrameWriter, read_frames
from .publisher import TransactionalPublisher, commit_id

DELIVERIES = ("exactly-once", "at-least-once")
STAGING_DIR = "_sinks"
# A task's staged records also travel to the driver in its report up to this size, so
# publishing does not read them back from storage (a re-commit after a restart does).
PAYLOAD_MAX_BYTES = 8 * 1024 * 1024
_EPOCH_DIR = re.compile(r"^epoch=(\d+)/")


def _default_encode(value: Any) -> bytes:
    return json.dumps(value, default=str).encode()


def _no_key(value: Any) -> Any:
    return None


def _as_bytes(key: Any) -> bytes | None:
    if key is None or isinstance(key, bytes):
        return key
    return str(key).encode()


class _DirectWriter(SinkWriter):
    """At-least-once: produce while the epoch runs, flush before the task ends."""

    def __init__(self, sink: KafkaSink, part: str) -> None:
        from confluent_kafka import Producer  # noqa: PLC0415

        self.sink, self.part, self.count = sink, part, 0
        self.producer = Producer(
            {
                "bootstrap.servers": sink.bootstrap_servers,
                "partitioner": "murmur2_random",
                "enable.idempotence": True,
                **sink.producer_config,
            }
        )

    def write(self, values: list[Any]) -> None:
        produce, poll, sink = self.producer.produce, self.producer.poll, self.sink
        key, encode, stamp = sink.key, sink.encode, sink.timestamp
        for v in values:
            ts = 0 if stamp is None else int(stamp(v))
            while True:
                try:
                    produce(sink.topic, value=encode(v), key=_as_bytes(key(v)), timestamp=ts)
                    break
                except BufferError:
                    poll(0.1)
            self.count += 1
            if self.count % 10_000 == 0:
                poll(0)

    def finish(self) -> tuple[dict[str, Any], Any]:
        left = self.producer.flush(self.sink.timeout_s)
        if left:
            raise StatorError(
                f"{left} records to Kafka topic {self.sink.topic} were not acknowledged "
                f"within {self.sink.timeout_s:.0f}s"
            )
        return {"part": self.part, "records": self.count}, None


class _StagingWriter(SinkWriter):
    """Exactly-once, on the executor: the epoch's records as one staged object."""

    def __init__(self, sink: KafkaSink, epoch: int, part: str) -> None:
        self.sink, self.epoch, self.part = sink, epoch, part
        self.frames = FrameWriter()

    def write(self, values: list[Any]) -> None:
        add, sink = self.frames.add, self.sink
        key, encode, stamp = sink.key, sink.encode, sink.timestamp
        for v in values:
            add(_as_bytes(key(v)), encode(v), None if stamp is None else int(stamp(v)))

    def finish(self) -> tuple[dict[str, Any], Any]:
        if not self.frames.count:
            return {"part": self.part, "records": 0}, None
        blob = self.frames.close()
        store = self.sink.staging_store
        key = f"epoch={self.epoch:010d}/{self.part}.{uuid.uuid4().hex[:12]}.kfr"
        store.put(key, blob)
        failpoints.reach("kafka-sink.staged")  # a task (its Python worker) dies after staging
        descriptor = {
            "part": self.part,
            "records": self.frames.count,
            "bytes": len(blob),
            "staging": store.uri,
            "staged": key,
        }
        return descriptor, blob if len(blob) <= PAYLOAD_MAX_BYTES else None


class KafkaSink(Sink):
    """Records to one Kafka topic. ``key``/``encode``/``timestamp`` turn a record into the
    Kafka record's key, value and timestamp (ms; None: the producer's clock).

    ``delivery``: ``exactly-once`` (the default when checkpoints are on) or
    ``at-least-once`` (the default without checkpoints, and a named downgrade otherwise).
    ``transactional_id_prefix``: the transactional id is ``<prefix>-<sink uid>``; default
    ``stator-<job>``. It must be unique among the jobs that share a Kafka cluster: a job
    that takes another's id fences it. ``staging``: where staged epochs go (default: beside
    the job's checkpoints; ``s3``: how to reach it if it is on S3).
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        key: Callable[[Any], Any] = _no_key,
        encode: Callable[[Any], bytes] = _default_encode,
        timestamp: Callable[[Any], int] | None = None,
        delivery: str | None = None,
        transactional_id_prefix: str | None = None,
        staging: str | None = None,
        s3: S3Options | None = None,
        producer_config: dict[str, Any] | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        if delivery is not None and delivery not in DELIVERIES:
            raise ValueError(
                f"KafkaSink delivery must be one of {', '.join(DELIVERIES)}, got {delivery!r}"
            )
        if not topic:
            raise ValueError("KafkaSink topic must be a topic name, got an empty string")
        if timeout_s <= 0:
            raise ValueError(f"KafkaSink timeout_s must be > 0 (seconds), got {timeout_s}")
        config = dict(producer_config or {})
        owned = {
            "transactional.id": "transactional_id_prefix",
            "bootstrap.servers": "bootstrap_servers",
        }
        for name, argument in owned.items():
            if name in config:
                raise ValueError(
                    f"KafkaSink producer_config must not set '{name}': pass {argument}= instead"
                )
        self.bootstrap_servers, self.topic = bootstrap_servers, topic
        self.key, self.encode, self.timestamp = key, encode, timestamp
        self.delivery = delivery
        self.transactional_id_prefix = transactional_id_prefix
        self.staging, self.s3 = staging, s3
        self.producer_config, self.timeout_s = config, timeout_s
        self.uid = ""
        self._delivery: str | None = None  # resolved by bind()
        self._prefix: str | None = None
        self._staging_store: ObjectStore | None = None
        self._publisher: TransactionalPublisher | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_publisher": None}

    # -- where it runs -------------------------------------------------------------------
    @property
    def exactly_once(self) -> bool:  # type: ignore[override]
        return (self._delivery or self.delivery) != "at-least-once"

    def bind(self, context: SinkContext) -> None:
        """Resolves the defaults that depend on the job; the arguments stay as given, so a
        sink bound again (another run, other settings) resolves them afresh."""
        self.uid = context.uid
        checkpointed = "exactly-once" if context.checkpoints else "at-least-once"
        self._delivery = self.delivery or checkpointed
        self._prefix = self.transactional_id_prefix or f"stator-{context.job}"
        if self.staging is None:
            self._staging_store = context.store.child(f"{STAGING_DIR}/{context.uid}")
        if self._publisher is not None:  # a fresh producer for the new run
            self._publisher.close()
            self._publisher = None

    @property
    def staging_store(self) -> ObjectStore:
        if self._staging_store is None:
            if self.staging is None:
                raise StatorError(
                    f"KafkaSink to '{self.topic}' (exactly-once) has no staging location: "
                    f"run it in a job (it stages beside the checkpoints) or pass staging="
                )
            self._staging_store = open_store(self.staging, self.s3)
        return self._staging_store

    @property
    def transactional_id(self) -> str:
        prefix = self._prefix or self.transactional_id_prefix or "stator"
        return f"{prefix}-{self.uid or self.topic}"

    def connect(self) -> None:
        if self.exactly_once:
            self.staging_store.connect()

    def writer(self, uid: str, epoch: int, part: str) -> SinkWriter:
        if self.exactly_once:
            return _StagingWriter(self, epoch, part)
        return _DirectWriter(self, part)

    # -- commits (driver) ----------------------------------------------------------------
    @property
    def publisher(self) -> TransactionalPublisher:
        if self._publisher is None:
            self._publisher = TransactionalPublisher(
                self.bootstrap_servers,
                self.topic,
                self.transactional_id,
                self.producer_config,
                self.timeout_s,
            )
        return self._publisher

    def commit(
        self, uid: str, epoch: int, parts: list[dict[str, Any]], payloads: list[Any]
    ) -> None:
        if not self.exactly_once:
            return  # produced during the epoch
        staged = sorted(
            (p["part"], p["staging"], p["staged"], payloads[i] if i < len(payloads) else None)
            for i, p in enumerate(parts)
            if p.get("records")
        )
        if not staged:
            return
        cid = commit_id(uid, epoch, (f"{s[1]}/{s[2]}" for s in staged))
        publisher = self.publisher
        if not publisher.published(cid):
            publisher.publish(cid, epoch, self._frames(staged))
        self._delete_staged(staged)

    def _frames(self, staged: list[tuple[str, str, str, Any]]) -> Iterator[Frame]:
        for _, staging, key, payload in staged:
            store = self._store_for(staging)
            blob = payload if payload is not None else store.get(key)
            yield from read_frames(blob, store.url(key))

    def _store_for(self, uri: str) -> ObjectStore:
        """The store a part was staged in: this run's, or (a restored commit of a run that
        staged elsewhere) the one its descriptor names."""
        store = self.staging_store
        return store if store.uri == uri else open_store(uri, getattr(store, "options", None))

    def _delete_staged(self, staged: list[tuple[str, str, str, Any]]) -> None:
        by_store: dict[str, list[str]] = {}
        for _, staging, key, _ in staged:
            by_store.setdefault(staging, []).append(key)
        for uri, keys in by_store.items():
            with contextlib.suppress(Exception):
                self._store_for(uri).delete(keys)

    def discard_after(self, uid: str, epoch: int) -> None:
        if not self.exactly_once:
            return
        store = self.staging_store
        stale = []
        for key, _ in store.listing():
            m = _EPOCH_DIR.match(key)
            if m and int(m.group(1)) > epoch:
                stale.append(key)
        store.delete(stale)
