"""Kafka jobs for the integration tests on the test bed's broker: topics, producing, and an
unbounded job run on a thread of the test's process (the real driver loop with the
in-process epoch runner, ``tests/unit/inprocess_job.py``: real source and keyed tasks,
without Spark). Shared by the Kafka source's tests and the dashboard's."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from stator import Job
from stator.api.pipeline import Pipeline
from stator.config import load_config
from stator.driver import epoch_loop
from tests.testbed.kafka import KafkaBroker
from tests.unit.inprocess_job import InProcessJob
from tests.unit.inprocess_run import settings


def admin(kafka: KafkaBroker) -> AdminClient:
    return AdminClient({"bootstrap.servers": kafka.bootstrap_servers})


def make_topic(kafka: KafkaBroker, name: str, partitions: int) -> str:
    client = admin(kafka)  # referenced until the result: a destroyed client fails it
    client.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
    return name


def produce(
    kafka: KafkaBroker, topic: str, partition: int, values: list[str], ts: list[int] | None = None
) -> None:
    p = Producer({"bootstrap.servers": kafka.bootstrap_servers, "enable.idempotence": True})
    for i, v in enumerate(values):
        extra = {"timestamp": ts[i]} if ts else {}
        p.produce(topic, v.encode(), f"k{i}".encode(), partition=partition, **extra)
    assert p.flush(30) == 0


def unique() -> str:
    return uuid.uuid4().hex[:6]


class Running:
    """An unbounded job on a thread of this process, stopped at the end of the test."""

    def __init__(self, pipeline: Pipeline, root: Path, monkeypatch: pytest.MonkeyPatch, *cfg: str):
        monkeypatch.setattr(epoch_loop, "run_epoch_job", InProcessJob())
        self.job = Job(pipeline, load_config(None, settings(root, *cfg)))
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        loop = self.job.loops[0]
        try:
            loop.recovery.start(self.job.check_restore_source().get(loop.region))
            loop._loop()
        except BaseException as exc:
            self.error = exc
        finally:
            loop.checkpoints.in_flight.abort_all("the run ended")
            loop.planner.close()

    def wait_for(self, what: str, done: Callable[[], bool], timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            assert self.error is None, self.error
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.05)

    def stop(self) -> None:
        self.job.stop()
        self.thread.join(60)
        assert not self.thread.is_alive()
        assert self.error is None, self.error


@pytest.fixture
def running() -> Iterator[list[Running]]:
    jobs: list[Running] = []
    yield jobs
    for r in jobs:
        if r.thread.is_alive():
            r.job.stop()
            r.thread.join(60)
