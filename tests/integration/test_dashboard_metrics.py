"""No dead panels: every metric the chart's Grafana dashboard queries has samples in what a
running job's driver serves on ``/metrics``, scraped over HTTP with the control token as the
chart's monitors send it.

The job reads the test bed's Kafka (the source that reports lag, and sends an undecodable
record to its dead-letter topic) with event-time watermarks, counts per key (a keyed
operator, two subtasks) into an exactly-once sink, and checkpoints; it runs through the real
driver loop with the in-process epoch runner (``tests/unit/inprocess_job.py``), unbounded, so
that lag and watermarks stay current as they do in production."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from stator.api.pipeline import Pipeline
from stator.api.time import BoundedOutOfOrderness
from stator.control.server import serving
from stator.sinks import CollectSink
from stator.sources import KafkaRecord, KafkaSource
from tests.dashboard import dead_metrics, exposed, load
from tests.integration.control_calls import call
from tests.integration.kafka_jobs import Running, make_topic, produce, running, unique
from tests.testbed.kafka import KafkaBroker

__all__ = ["running"]  # the fixture, shared with the Kafka source's tests

RECORDS = 200


def _decode(r: KafkaRecord) -> tuple[str, int]:
    assert r.value is not None
    return f"k{int(r.value) % 7}", r.timestamp  # "oops" raises: to the dead-letter topic


def test_every_metric_the_dashboard_queries_is_in_a_running_drivers_scrape(
    kafka: KafkaBroker,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    running: list[Running],
) -> None:
    topic = make_topic(kafka, f"dash-{unique()}", 2)
    dead = make_topic(kafka, f"{topic}-dead", 1)
    base = int(time.time() * 1000) - 30_000  # recent: the broker's retention keeps them
    for partition in (0, 1):
        values = [str(i) for i in range(RECORDS // 2)]
        produce(kafka, topic, partition, values, ts=[base + i for i in range(RECORDS // 2)])
    produce(kafka, topic, 0, ["oops"], ts=[base])

    p = Pipeline("dashboard")
    src = KafkaSource(kafka.bootstrap_servers, topic, decode=_decode, dead_letter=dead)
    (
        p.source(src, uid="in", timestamps=lambda e: e[1], watermarks=BoundedOutOfOrderness(10))
        .key_by(lambda e: e[0])
        .count(uid="count")
        .sink(CollectSink(), uid="out")
    )
    token = tmp_path / "token"
    token.write_text("scrape-secret\n")
    job = Running(
        p,
        tmp_path,
        monkeypatch,
        "epoch.max_records=60",
        "checkpoint.every_epochs=1",
        "control.port=0",
        f"control.token_file={token}",
    )
    running.append(job)
    with serving(job.job, job.job.config.control) as server:
        assert server is not None
        base_url = f"http://127.0.0.1:{server.port}"
        st = job.job.status
        job.wait_for(
            "every record read, the bad one sent to dead letters, and checkpointed",
            lambda: (
                st.records_in == RECORDS
                and st.dead_letters == {"in": 1}
                and st.checkpoints >= 2
                and not st.in_flight_checkpoints
            ),
        )
        status, _ = call(base_url, "/metrics")
        assert status == 401, "the monitors send the pipeline's token because it is needed"
        status, scrape = call(
            base_url, "/metrics", headers={"Authorization": "Bearer scrape-secret"}
        )
        assert status == 200
    job.stop()

    dashboard = load()
    assert dead_metrics(dashboard, scrape) == {}
    # The check has teeth: this scrape lacks a name a typo would give.
    assert "stator_records_in" not in exposed(scrape)
