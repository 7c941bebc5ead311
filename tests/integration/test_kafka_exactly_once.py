"""Exactly-once Kafka to Kafka, proven: the Kafka -> keyed running sum job of
``test_exactly_once.py`` writes through the transactional Kafka sink, is killed (SIGKILL) at
each step of the commit protocol, driver and Python worker alike, and restarted from its
checkpoints; a ``read_committed`` consumer must then read every expected record exactly once
(per user, the running count and sum after each of its events, in order). A
``read_uncommitted`` consumer shows what was aborted, so the check can fail.

The steps are hit with failpoints (``stator.failpoints``): the moments inside a transaction
are too short to hit from outside.
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.running_sum_runs import (
    OUT_PARTITIONS,
    Run,
    expected_output,
    fill_topic,
    kill_all,
    per_user,
    read_topic,
    run_env,
)
from tests.testbed.kafka import KafkaBroker
from tests.testbed.minio import S3Endpoint


class KafkaRun(Run):
    """A ``stator run`` of the job writing to its own output topic."""

    bootstrap: str = ""
    out_topic: str = ""

    def committed(self) -> list[dict[str, Any]]:
        return read_topic(self.bootstrap, self.out_topic, "read_committed")

    def uncommitted(self) -> list[dict[str, Any]]:
        return read_topic(self.bootstrap, self.out_topic, "read_uncommitted")

    def arm(self, failpoint: str) -> None:
        once = self.workdir / "failpoints"
        once.mkdir(exist_ok=True)
        self.env = {**self.env, "STATOR_FAILPOINTS": failpoint, "STATOR_FAILPOINTS_ONCE": str(once)}

    def disarm(self) -> None:
        self.env = {k: v for k, v in self.env.items() if not k.startswith("STATOR_FAILPOINTS")}


@pytest.fixture(scope="module")
def topic(kafka: KafkaBroker) -> str:
    return fill_topic(kafka)


@pytest.fixture
def kafka_run(
    s3: S3Endpoint,
    kafka: KafkaBroker,
    topic: str,
    tmp_path: Path,
) -> Iterator[Any]:
    runs: list[KafkaRun] = []

    def make(*settings: str) -> KafkaRun:
        bucket = f"keo-{uuid.uuid4().hex[:10]}"
        s3.client().create_bucket(Bucket=bucket)
        out_topic = f"keo-out-{uuid.uuid4().hex[:6]}"
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
        admin.create_topics([NewTopic(out_topic, OUT_PARTITIONS, 1)])[out_topic].result(30)
        env = run_env(s3, kafka, topic, EO_OUT_TOPIC=out_topic)
        run = KafkaRun(s3, bucket, tmp_path / bucket, env, settings=settings)
        run.bootstrap, run.out_topic = kafka.bootstrap_servers, out_topic
        run.workdir.mkdir()
        runs.append(run)
        return run

    yield make
    kill_all(runs)


# Each step of the commit protocol, in the order one run meets them again and again: the
# driver dies at the first three (and is restarted from its latest checkpoint, as the operator
# would), a Python worker dies at the last (Spark retries its task; the driver goes on).
STEPS = [
    "kafka-sink.produced@2",  # inside the open transaction of a publish
    "kafka-sink.committed@2",  # the transaction committed, the driver has not recorded it
    "driver.epoch-ran@2",  # an epoch's output staged, its checkpoint not yet taken
    "kafka-sink.staged@3",  # a task died after staging its output (Python worker)
]


@pytest.mark.parametrize("tasks", ["per-epoch", "long-running"])
def test_killed_at_each_commit_step(kafka_run: Any, tasks: str) -> None:
    run = kafka_run(f"epoch.tasks={tasks}")
    for step in STEPS:
        run.disarm()
        run.arm(step)
        run.start()
        code = run.wait()
        fired = (run.workdir / "failpoints" / step.split("@", maxsplit=1)[0]).exists()
        assert fired, f"failpoint {step} was never reached\n{run.log_tail()}"
        if step.startswith("kafka-sink.staged"):
            assert code == 0, run.log_tail()  # the driver outlived its worker
            break
        assert code == -signal.SIGKILL, f"the driver was to die at {step}: exit {code}"
        run.kill_driver()
    committed = run.committed()
    assert per_user(committed) == expected_output(), "committed output is not exactly once"
    # What the driver produced in the transaction it died in is in the log, aborted: a
    # read_uncommitted consumer sees it (and nothing else extra), a read_committed one not.
    aborted = len(run.uncommitted()) - len(committed)
    assert aborted > 0, "the killed transaction left nothing to abort: the kill missed"
