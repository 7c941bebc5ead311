"""The job's metrics (docs/control-api.md, "Metrics") on real Spark: a small keyed count read
to its end, then asked through ``/metrics`` and ``/v1/job`` while the driver still serves."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from stator import Job, Pipeline
from stator.config import JobConfig
from stator.control.schema import HistoryInfo, JobInfo
from stator.control.server import serving
from stator.sinks import CollectSink
from stator.sources import GeneratorSource, KeyedEvents
from tests.helpers import wait_until, with_overrides
from tests.integration.control_calls import call

EVENTS = 2_000


def test_a_keyed_jobs_metrics_have_plausible_values(
    spark: Any, job_config: JobConfig, tmp_path: Path
) -> None:
    p = Pipeline("metered")
    (
        p.source(GeneratorSource(KeyedEvents(40), count=EVENTS, splits=2), uid="events")
        .key_by(lambda e: e[0])
        .count(uid="count")
        .sink(CollectSink(), uid="out")
    )
    cfg = with_overrides(
        job_config,
        epoch={"max_records": 500, "stop_when_finished": False},  # serves once read
        control={"port": 0},
    )
    driver = Job(p, cfg, spark)
    result: dict[str, Any] = {}

    def run() -> None:
        with serving(driver, cfg.control) as server:
            result["server"] = server
            driver.run()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        wait_until("control API up", lambda: result.get("server"))
        base = f"http://127.0.0.1:{result['server'].port}"
        wait_until(
            "input read and checkpointed",
            lambda: driver.status.records_in == EVENTS and not driver.status.in_flight_checkpoints,
        )
        status, body = call(base, "/v1/job")
        assert status == 200
        job = JobInfo.from_wire(body)
        assert job.metrics is not None
        ops = job.metrics.operators
        assert ops["events"].records_out == EVENTS, "records in == the input"
        count = ops["count"]
        latency = count.processing_latency
        assert latency is not None and latency.count == count.records_in > 0
        assert 0 < latency.p99_ms < 120_000
        assert [s.subtask for s in count.subtasks] == [0, 1]
        for s in count.subtasks:
            assert 0 < s.busy_ratio <= 1 and s.true_rate > 0, s
            assert s.state_bytes > 0 and s.records_in_total > 0
        committed = ops["out"].committed_latency
        assert committed is not None and committed.count >= EVENTS
        assert job.metrics.epoch_duration.count >= EVENTS // 500

        status, text = call(base, "/metrics")
        assert status == 200
        samples = {
            (s.name, s.labels.get("operator"), s.labels.get("subtask")): s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
        }
        assert samples[("stator_operator_records_out_total", "events", None)] == EVENTS
        assert samples[("stator_operator_records_in_total", "count", None)] == count.records_in
        assert (
            samples[("stator_processing_latency_seconds_count", "count", None)] == count.records_in
        )
        for sub in ("0", "1"):
            assert 0 < samples[("stator_subtask_busy_ratio", "count", sub)] <= 1
            assert samples[("stator_subtask_true_rate_records_per_second", "count", sub)] > 0
            assert samples[("stator_subtask_state_bytes", "count", sub)] > 0
        assert samples[("stator_committed_latency_seconds_count", "out", None)] >= EVENTS
        assert samples[("stator_epoch_duration_seconds_count", None, None)] >= EVENTS // 500

        # Where each epoch's time went (epoch/phases.py): every phase stamped, in order.
        status, body = call(base, "/v1/history")
        assert status == 200
        reading = [e for e in HistoryInfo.from_wire(body).epochs if e.records_in]
        assert len(reading) >= EVENTS // 500
        order = (
            "submitted",
            "source_start",
            "source_end",
            "keyed_start",
            "keyed_input",
            "keyed_processed",
            "keyed_end",
            "job_end",
            "handed_off",
        )
        for e in reading:
            stamps = [e.phases[name] for name in order]
            assert stamps == sorted(stamps) and stamps[-1] > 0, e.phases
            assert stamps[-1] <= e.duration_ms + 1000, "within the epoch (plus its planning)"
    finally:
        driver.stop()
        thread.join(120)
