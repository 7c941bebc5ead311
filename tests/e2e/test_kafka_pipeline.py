"""A StatefulPipeline that reads and writes Kafka (``examples/kafka_to_kafka.py``), run by
the operator: its lag shows in the status and in ``kubectl get``, falls to zero once it has
read the topic, and its committed output (read_committed) is exact, through a rescale."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from examples import kafka_to_kafka as example
from tests.e2e.cluster import Space
from tests.testbed.kafka import KafkaBroker

FIRST, MORE = 20_000, 10_000


def expected(n: int) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for p in example.payments(n):
        e = out.setdefault(p["user"], {"user": p["user"], "total": 0, "payments": 0})
        e["total"] += p["amount"]
        e["payments"] += 1
    return out


def test_kafka_pipeline_shows_lag_and_commits_exactly_once(
    space: Space, kafka: KafkaBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    tag = uuid.uuid4().hex[:6]
    env = {
        "STATOR_KAFKA": kafka.bootstrap_servers,
        "STATOR_KAFKA_IN": f"payments-{tag}",
        "STATOR_KAFKA_OUT": f"totals-{tag}",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    example.produce(FIRST)
    name = "k2k"
    manifest = space.manifest(
        name,
        entrypoint="examples.kafka_to_kafka:pipeline",
        env=env,
        config={"epoch.max_records": "4000"},
    )
    space.apply(manifest)
    # A backlog of FIRST records: the status reports lag, and it falls to zero.
    space.wait(
        name,
        "caught up (lag 0 after a checkpoint)",
        lambda s: (
            s.get("phase") == "Running"
            and s.get("latestCheckpoint", {}).get("id", 0) >= 2
            and s.get("lagRecords") == 0
        ),
    )
    table = space.kube.kubectl("get", "spl", name, "-n", space.name).stdout
    assert "LAG" in table.upper(), table
    committed_totals(expected(FIRST))

    # More input, then a rescale while it is read: still exactly once.
    example.produce(MORE, start=FIRST)
    space.kube.kubectl("scale", "statefulpipeline", name, "-n", space.name, "--replicas=3")
    space.wait(
        name,
        "rescaled to 3 and caught up",
        lambda s: (
            s.get("replicas") == 3
            and s.get("phase") == "Running"
            and not s.get("operation")
            and s.get("lagRecords") == 0
        ),
        timeout=300,
    )
    committed_totals(expected(FIRST + MORE))


def committed_totals(want: dict[str, dict[str, Any]], timeout: float = 60) -> None:
    """The committed totals reach ``want`` (the last epoch read commits with its checkpoint,
    after the lag that the status shows fell to zero) and never pass it."""
    deadline = time.monotonic() + timeout
    got = example.read_totals()
    while got != want and time.monotonic() < deadline:
        assert all(got[u]["payments"] <= want[u]["payments"] for u in got), "counted twice"
        time.sleep(1)
        got = example.read_totals()
    assert got == want
