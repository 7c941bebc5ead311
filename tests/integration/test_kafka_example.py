"""``examples/kafka_to_kafka.py`` as its README section runs it: produce payments, run the job
(bounded, in-process), read the committed totals: each user's total and count are exact."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from examples import kafka_to_kafka as example
from stator import Job
from stator.config import JobConfig
from tests.helpers import with_overrides
from tests.testbed.kafka import KafkaBroker


def test_kafka_to_kafka_example(
    spark: Any, job_config: JobConfig, kafka: KafkaBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    tag = uuid.uuid4().hex[:6]
    monkeypatch.setenv("STATOR_KAFKA", kafka.bootstrap_servers)
    monkeypatch.setenv("STATOR_KAFKA_IN", f"payments-{tag}")
    monkeypatch.setenv("STATOR_KAFKA_OUT", f"totals-{tag}")
    monkeypatch.setenv("STATOR_KAFKA_BOUNDED", "1")
    example.produce(3_000)
    status = Job(
        example.pipeline(), with_overrides(job_config, epoch={"max_records": 800}), spark
    ).run()
    assert status.state == "FINISHED", status
    expected: dict[str, dict[str, Any]] = {}
    for p in example.payments(3_000):
        e = expected.setdefault(p["user"], {"user": p["user"], "total": 0, "payments": 0})
        e["total"] += p["amount"]
        e["payments"] += 1
    assert example.read_totals() == expected
