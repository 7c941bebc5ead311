"""The autoscaler's job (its e2e test and ``python -m bench.autoscale``): Kafka in, a keyed
count whose function costs ``STATOR_COST_MS`` per record (as an enrichment call would: it
waits, it does not compute, so subtasks on a 2-core machine scale like subtasks on
separate cores), Kafka out through the transactional sink. Input comes at rates that step
(``Steps``); every key's committed counts must be 1, 2, ... n exactly once.

Environment: ``STATOR_KAFKA`` (bootstrap), ``STATOR_KAFKA_IN`` / ``STATOR_KAFKA_OUT``
(topics), ``STATOR_COST_MS`` (default 4: 250 records/s per busy subtask) and
``STATOR_COST_MODE`` (``wait``, the default, or ``spin``: the cost is CPU time, so that
subtasks beyond the machine's cores share them: a scale-up that cannot help)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from stator import INT64, Context, KeyedProcessFunction, Pipeline, RuntimeContext
from stator import ValueStateDescriptor as Value
from stator.sinks import KafkaSink
from stator.sources import KafkaRecord, KafkaSource

PARTITIONS = 6
KEYS = 240
# spec.autoscaler of the e2e test and the benchmark: reacting within seconds, for a test bed.
AUTOSCALER: dict[str, Any] = {
    "enabled": True,
    "minReplicas": 1,
    "maxReplicas": 6,
    "targetUtilization": 0.7,
    "catchUpSeconds": 30,
    "metricsWindowSeconds": 20,
    "scaleUpStabilizationSeconds": 0,
    "scaleDownStabilizationSeconds": 60,
    "maxScaleFactor": 8,
    "cooldownSeconds": 15,
}


def _settings() -> tuple[str, str, str]:
    return (
        os.environ["STATOR_KAFKA"],
        os.environ["STATOR_KAFKA_IN"],
        os.environ["STATOR_KAFKA_OUT"],
    )


def decode(record: KafkaRecord) -> dict[str, Any]:
    event: dict[str, Any] = json.loads(record.value or b"{}")
    return event


class SlowCount(KeyedProcessFunction):
    """Counts a key's events; each one costs ``STATOR_COST_MS`` first (waiting, or spinning
    for that much CPU time)."""

    def open(self, ctx: RuntimeContext) -> None:
        self.count = ctx.get_state(Value("count", INT64))
        self.cost_s = float(os.environ.get("STATOR_COST_MS", "4")) / 1000
        self.spin = os.environ.get("STATOR_COST_MODE", "wait") == "spin"

    def process_element(self, value: Any, ctx: Context) -> Iterable[Any]:
        if self.spin:
            until = time.thread_time() + self.cost_s
            while time.thread_time() < until:
                pass
        else:
            time.sleep(self.cost_s)
        n = self.count.value(0) + 1
        self.count.update(n)
        yield {"key": ctx.current_key, "n": n}


def pipeline() -> Pipeline:
    bootstrap, source, out = _settings()
    p = Pipeline("autoscaled-count")
    (
        p.source(KafkaSource(bootstrap, source, decode=decode, group_id="autoscaled"), uid="in")
        .key_by(lambda e: e["key"])
        .process(SlowCount(), uid="count")
        .sink(KafkaSink(bootstrap, out, key=lambda r: r["key"]), uid="out")
    )
    return p


def create_topics(bootstrap: str, *topics: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in topics]).values():
        future.result(30)


@dataclass(frozen=True)
class Steps:
    """Input rates by time: ``(seconds, records/s)`` held in turn."""

    steps: Sequence[tuple[float, float]]

    def rate_at(self, t: float) -> float:
        for seconds, rate in self.steps:
            if t < seconds:
                return rate
            t -= seconds
        return 0.0

    @property
    def seconds(self) -> float:
        return sum(s for s, _ in self.steps)

    @property
    def total(self) -> int:
        return round(sum(s * r for s, r in self.steps))


class Producer(threading.Thread):
    """Writes ``steps`` to the input topic in 100 ms slices, keys round robin; ``sent`` counts
    what the broker acknowledged."""

    def __init__(self, bootstrap: str, topic: str, steps: Steps) -> None:
        super().__init__(daemon=True, name="autoscale-producer")
        self.bootstrap, self.topic, self.steps = bootstrap, topic, steps
        self.sent = 0
        self.started_at = 0.0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._produce()
        except BaseException as exc:  # reported by the test
            self.error = exc

    def _produce(self) -> None:
        from confluent_kafka import Producer as Kafka

        kafka = Kafka({"bootstrap.servers": self.bootstrap, "linger.ms": 20})
        self.started_at = time.monotonic()
        due = 0.0
        i = 0
        while (t := time.monotonic() - self.started_at) < self.steps.seconds:
            due += self.steps.rate_at(t) * 0.1
            while i < int(due):
                key = f"k{i % KEYS}"
                kafka.produce(self.topic, key=key.encode(), value=json.dumps({"key": key}))
                i += 1
            kafka.poll(0)
            time.sleep(max(0.0, self.started_at + t + 0.1 - time.monotonic()))
        if kafka.flush(60):
            raise RuntimeError("some events were not acknowledged by the broker")
        self.sent = i


def expected_counts(total: int) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for i in range(total):
        out[f"k{i % KEYS}"] += 1
    return dict(out)


def committed_counts(bootstrap: str, topic: str) -> tuple[dict[str, list[int]], int]:
    """Each key's committed counts in the order read (``read_committed``), and how many
    records that was."""
    from examples.kafka_to_kafka import committed_records  # the test host's, not the pods'

    records = committed_records(bootstrap, topic)
    seen: dict[str, list[int]] = defaultdict(list)
    for update in records:
        seen[update["key"]].append(int(update["n"]))
    return dict(seen), len(records)


def exactly_once(bootstrap: str, topic: str, total: int) -> str | None:
    """None if every key's committed counts are 1..n exactly once for ``total`` events in,
    else what is wrong."""
    seen, records = committed_counts(bootstrap, topic)
    want = expected_counts(total)
    if records != total:
        return f"{records} committed records for {total} events"
    for key, n in want.items():
        if sorted(seen.get(key, [])) != list(range(1, n + 1)):
            got = sorted(seen.get(key, []))
            return f"key {key}: counts {got[:5]}...{got[-5:]} (want 1..{n})"
    return None
