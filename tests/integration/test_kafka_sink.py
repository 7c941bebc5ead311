"""The transactional Kafka sink against the test bed's broker: a stop-with-savepoint, then a
restore at another parallelism (a rescale and an upgrade) commits each record once; a
publisher that another one fenced cannot commit; a published epoch is never published twice.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from stator import INT64, Context, Job, KeyedProcessFunction, Pipeline, RuntimeContext
from stator import ValueStateDescriptor as Value
from stator.config import JobConfig
from stator.errors import SinkCommitError
from stator.sinks import KafkaSink
from stator.sinks.kafka.publisher import TransactionalPublisher, commit_id
from stator.sources import GeneratorSource, KeyedEvents
from tests.helpers import stop_with_savepoint_after, with_overrides
from tests.integration.running_sum_runs import read_topic
from tests.testbed.kafka import KafkaBroker

EVENTS, KEYS = 6_000, 40
GEN = KeyedEvents(KEYS, seed=3)


class RunningCount(KeyedProcessFunction):
    def open(self, ctx: RuntimeContext) -> None:
        self.count = ctx.get_state(Value("count", INT64))

    def process_element(self, value: Any, ctx: Context) -> Iterable[Any]:
        n = self.count.value(0) + 1
        self.count.update(n)
        yield [value[0], n]


def _topic(kafka: KafkaBroker, partitions: int = 3) -> str:
    name = f"ks-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
    return name


def pipeline(kafka: KafkaBroker, topic: str) -> Pipeline:
    p = Pipeline("kafka-sink", max_parallelism=32)
    (
        p.source(GeneratorSource(GEN, count=EVENTS), uid="events")
        .key_by(lambda e: e[0])
        .process(RunningCount(), uid="running-count")
        .sink(KafkaSink(kafka.bootstrap_servers, topic, key=lambda r: r[0]), uid="out")
    )
    return p


def test_savepoint_then_rescaled_restore_commits_each_record_once(
    spark: Any, job_config: JobConfig, kafka: KafkaBroker, tmp_path: Path
) -> None:
    topic = _topic(kafka)
    cfg = with_overrides(
        job_config,
        epoch={"max_records": 1_000},
        savepoint={"dir": f"file://{tmp_path}/savepoints"},
        parallelism=2,
    )
    first = stop_with_savepoint_after(Job(pipeline(kafka, topic), cfg, spark), 3).run()
    assert first.state == "STOPPED" and first.stopped_with_savepoint
    # Everything up to the savepoint is committed when the stop returns: 3 epochs of 1,000.
    assert len(read_topic(kafka.bootstrap_servers, topic, "read_committed")) == 3_000
    again = with_overrides(cfg, parallelism=3, restore={"source": first.stopped_with_savepoint})
    second = Job(pipeline(kafka, topic), again, spark).run()
    assert second.state == "FINISHED", second
    committed = read_topic(kafka.bootstrap_servers, topic, "read_committed")
    per_key: dict[str, list[int]] = {}
    for key, n in committed:
        per_key.setdefault(key, []).append(n)
    expected = Counter(e[0] for e in GEN.make(0, EVENTS, 1))
    assert {k: v for k, v in per_key.items()} == {
        k: list(range(1, c + 1)) for k, c in expected.items()
    }
    assert len(read_topic(kafka.bootstrap_servers, topic, "read_uncommitted")) == EVENTS


def _publisher(kafka: KafkaBroker, topic: str, tid: str) -> TransactionalPublisher:
    return TransactionalPublisher(kafka.bootstrap_servers, topic, tid, {}, timeout_s=30)


def test_a_published_epoch_is_skipped_and_a_fenced_publisher_cannot_commit(
    kafka: KafkaBroker,
) -> None:
    topic, tid = _topic(kafka), f"tx-{uuid.uuid4().hex[:6]}"
    frames = [(b"k", b'["k", 1]', None), (b"j", b'["j", 1]', None)]
    cid = commit_id("out", 1, ["staged/a.kfr"])
    old = _publisher(kafka, topic, tid)
    assert old.publish(cid, 1, frames) == 2
    # A new driver (a new producer of the id) finds epoch 1 in the marker: not published again.
    new = _publisher(kafka, topic, tid)
    assert new.published(cid)
    assert new.publish(cid, 1, frames) == 0
    # The new producer fenced the old one: its next epoch fails, naming the take-over.
    with pytest.raises(SinkCommitError, match="taken over"):
        old.publish(commit_id("out", 2, ["staged/b.kfr"]), 2, frames)
    assert new.publish(commit_id("out", 2, ["staged/c.kfr"]), 2, frames[:1]) == 1
    got = read_topic(kafka.bootstrap_servers, topic, "read_committed")
    assert sorted(map(tuple, got)) == [("j", 1), ("k", 1), ("k", 1)]
    new.close()
    old.close()
