"""The job's metrics (issue 42): histograms filled per batch and merged by adding, latency
attributed from when records became available, busy ratio and true processing rate, and a
whole keyed job run in this process with the real tasks and driver loop, read back as
``/v1/job``'s ``metrics``, as Prometheus text and as the operator's status summary."""

from __future__ import annotations

import math
import pickle
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from stator import Job
from stator.api.pipeline import Pipeline
from stator.api.time import BoundedOutOfOrderness
from stator.control.answers import job_info
from stator.control.metrics import render_metrics
from stator.control.schema import JobInfo
from stator.control.wire import WireError, from_wire
from stator.driver.job_metrics import JobMetrics, SubtaskEpoch
from stator.epoch.availability import MAX_ENTRIES, at, attribute, from_times, spread, summarize
from stator.epoch.histogram import BOUNDS_MS, Histogram
from stator.epoch.reports import SinkReport, SplitReport, StateReport
from stator.sinks.collect import CollectSink
from stator.sources.base import SplitRange
from stator.sources.generator import GeneratorSource, KeyedEvents
from stator.tasks.keyed import processing_latency
from stator_operator.metrics_summary import metrics_summary
from tests.unit.inprocess_run import run_in_process

# ------------------------------------------------------------------ histograms


def test_a_value_on_a_bound_falls_in_its_bucket_and_merging_adds() -> None:
    h = Histogram()
    h.observe(10, 3)  # on the bound 10 ms: le="0.01"
    h.observe(11)
    h.observe(-5)  # clocks that disagree: 0
    h.observe(10**9)  # above the last bound
    assert h.count == 6 and h.sum_ms == 30 + 11 + 10**9
    assert h.counts[BOUNDS_MS.index(10)] == 3 and h.counts[BOUNDS_MS.index(25)] == 1
    assert h.counts[0] == 1 and h.counts[-1] == 1
    other = Histogram()
    other.observe(10, 2)
    h.merge(other)
    assert h.counts[BOUNDS_MS.index(10)] == 5 and h.count == 8
    assert h.cumulative()[-1] == 8 and h.cumulative() == sorted(h.cumulative())


def test_quantiles_interpolate_inside_the_bucket() -> None:
    h = Histogram()
    assert h.quantile(0.99) == 0.0
    h.observe(600, 100)  # all in (500, 1000]
    assert h.quantile(0.5) == pytest.approx(750)
    assert h.quantile(0.99) == pytest.approx(995)
    h.observe(10**8)
    assert h.quantile(1.0) == BOUNDS_MS[-1], "above the last bound: the last bound"


# ------------------------------------------------------------------ availability


def test_a_summary_keeps_every_record_in_at_most_max_entries() -> None:
    times = [1_000 + (i * 7919) % 5_000 for i in range(10_000)]
    s = from_times(times)
    assert len(s) == MAX_ENTRIES and sum(n for _, n in s) == len(times)
    assert [t for t, _ in s] == sorted(t for t, _ in s)
    mean = sum(times) / len(times)
    assert sum(t * n for t, n in s) / len(times) == pytest.approx(mean, rel=1e-3)
    assert summarize([(5, 2), (5, 3), (1, 0)]) == ((5, 5),), "equal times merged, zeros gone"
    assert at(7, 0) == () and at(7, 3) == ((7, 3),)


def test_a_batch_is_attributed_in_proportion_in_whole_records() -> None:
    avail = ((100, 1), (200, 1), (300, 1))
    assert attribute(avail, 3) == [(100, 1), (200, 1), (300, 1)]
    got = attribute(avail, 7)
    assert sum(n for _, n in got) == 7 and max(n for _, n in got) - min(n for _, n in got) <= 1
    assert attribute(((100, 10),), 4) == [(100, 4)]
    assert attribute((), 4) == [] and attribute(avail, 0) == []


def test_spread_is_an_even_schedule() -> None:
    s = spread(0, 999, 1000)
    assert sum(n for _, n in s) == 1000 and s[0][0] < 100 and s[-1][0] > 900
    assert spread(5, 5, 1) == ((5, 1),)


def test_a_rate_limited_generator_schedules_each_record() -> None:
    src = GeneratorSource(KeyedEvents(10), count=None, splits=2, rate_per_second=100)
    src.plan({"gen-0": 0, "gen-1": 0}, 1000, now_ms=1_000_000)  # starts its clock
    # 50 records/s per split: position p is due at 1_000_000 + 20 ms * p.
    avail = src.availability(SplitRange("gen-0", 50, 100, 0), 50, planned_ms=9)
    assert sum(n for _, n in avail) == 50
    assert avail[0][0] == pytest.approx(1_000_000 + 20 * 53, abs=25)
    assert avail[-1][0] == pytest.approx(1_000_000 + 20 * 96, abs=25)
    plain = GeneratorSource(KeyedEvents(10), count=10)
    assert plain.availability(SplitRange("gen-0", 0, 5, 0), 5, planned_ms=9) == ((9, 5),)


# ------------------------------------------------------------------ attribution in a subtask


def _header(values: int, available: Any) -> Any:
    return ((1, 0), 0, 0, ([b"k"] * values, [1] * values, [0] * values), available)


def test_a_subtask_measures_each_batch_from_its_availability() -> None:
    headers = [
        _header(4, ((1_000, 10), (2_000, 10))),  # half its read at 1 s, half at 2 s
        _header(2, ((2_500, 1),)),
        _header(0, ((0, 5),)),  # an empty batch: only a watermark
    ]
    latency, sent = processing_latency(headers, processed_ms=3_000, planned_ms=1)
    assert latency.count == 6, "one observation per record taken in"
    assert latency.sum_ms == 2 * 2_000 + 2 * 1_000 + 2 * 500
    assert sum(n for _, n in sent) == 6 and sent[0][0] == 1_000, "what it sends on"
    empty, sent = processing_latency([_header(0, ())], processed_ms=3_000, planned_ms=1)
    assert empty.count == 0 and sent == ((1, 1),), "timer output counts from the planning"


# ------------------------------------------------------------------ the driver's sums


def test_busy_ratio_is_clamped_and_true_rate_holds_over_an_epoch_without_input() -> None:
    s = SubtaskEpoch(3, 1_000, 10, busy_s=0.5, epoch_s=2.0, watermark=0, ended_ms=0)
    assert s.busy_ratio == 0.25
    skewed = SubtaskEpoch(3, 10, 0, busy_s=2.1, epoch_s=2.0, watermark=0, ended_ms=0)
    assert skewed.busy_ratio == 1.0, "executor and driver clocks: at most 1"
    idle = SubtaskEpoch(3, 0, 0, busy_s=0.0, epoch_s=0.0, watermark=0, ended_ms=0)
    assert idle.busy_ratio == 0.0
    m = JobMetrics()
    m.epoch_done(None, 1, [_state(0, 1_000, 500_000_000)], 2.0, 0)
    assert m.view().operators["count"].latest[0].true_rate == 2_000
    m.epoch_done(None, 2, [_state(0, 0, 100_000_000, epoch=2)], 1.0, 0)  # e.g. a savepoint's
    latest = m.view().operators["count"].latest[0]
    assert latest.epoch == 2 and latest.busy_ratio == pytest.approx(0.1)
    assert latest.true_rate == 2_000, "the rate of the latest epoch with input"


def _state(subtask: int, records: int, busy_ns: int, epoch: int = 1) -> StateReport:
    h = Histogram()
    h.observe(100, records)
    return StateReport("count", subtask, epoch, 5_000, records, 1, busy_ns=busy_ns, latency=h)


def test_an_epochs_reports_add_up_once_each() -> None:
    m = JobMetrics()
    read = SplitReport("in", "s0", 1, 0, 30, available=((1_000, 30),))
    part = SinkReport("out", 1, {"part": "p0", "records": 2}, None)
    reports = [read, read, _state(0, 10, 500_000_000), _state(1, 20, 250_000_000), part, part]
    m.epoch_done(None, 1, reports, duration_s=1.0, ended_ms=6_000)
    m.committed(None, "out", 1, at_ms=4_000)
    v = m.view()
    assert v.operators["in"].records_out == 30, "a report Spark delivered twice counts once"
    assert v.operators["out"].records_in == 2
    count = v.operators["count"]
    assert (count.records_in, count.records_out, count.latency.count) == (30, 2, 30)
    assert count.latest[0].busy_ratio == 0.5 and count.latest[1].true_rate == 80
    assert count.watermark == 5_000 and count.event_time_delay_ms == 1_000
    committed = v.operators["out"].committed
    assert committed.count == 30 and committed.sum_ms == 30 * 3_000
    busiest = v.busiest()
    assert busiest is not None and busiest[:2] == ("count", 0)
    m.epoch_done(None, 2, [_state(0, 5, 100_000_000, epoch=2)], 0.5, 7_000)
    v2 = m.view()
    assert v2.operators["count"].totals[0].records_in == 15
    assert v2.epochs.count == 2 and v.epochs.count == 1, "a view is a copy"
    again = pickle.loads(pickle.dumps(m))  # noqa: S301 - a final status may be pickled
    assert again.view().operators["count"].totals[0].records_in == 15


# ------------------------------------------------------------------ the operator's summary


def test_the_status_summary_is_bounded_and_validated() -> None:
    answer: dict[str, Any] = {
        "epoch": 3,
        "metrics": {
            "processing_latency_p99_ms": 120,
            "max_busy_ratio": 0.51234,
            "busiest_subtask": "count/1",
            "epoch_duration": {"p99_ms": 900},
        },
    }
    summary = metrics_summary(JobInfo.from_wire(answer))
    assert summary == {
        "metrics": {
            "processingLatencyP99Ms": 120,
            "committedLatencyP99Ms": 0,
            "busiestSubtask": "count/1",
            "eventTimeDelayMs": None,
            "maxBusyRatio": 0.512,
            "epochDurationP99Ms": 900,
        }
    }
    assert metrics_summary(JobInfo.from_wire({"epoch": 3})) == {}, "an older driver: none"
    for bad in (-1.0, math.inf, math.nan, "0.5", True):
        with pytest.raises(WireError, match="max_busy_ratio"):
            from_wire(JobInfo, {"epoch": 1, "metrics": {"max_busy_ratio": bad}})
    huge = JobInfo.from_wire({"epoch": 1, "metrics": {"max_busy_ratio": 1e12}})
    assert metrics_summary(huge)["metrics"]["maxBusyRatio"] == 1.0  # type: ignore[index]


# ------------------------------------------------------------------ a whole job


def _families(text: bytes) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text.decode())}


def test_a_keyed_job_reports_its_metrics_everywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = 3_000
    p = Pipeline("metrics")
    (
        p.source(GeneratorSource(KeyedEvents(50), count=events, splits=2), uid="events")
        .key_by(lambda e: e[0])
        .count(uid="count")
        .sink(CollectSink(), uid="out")
    )
    job = run_in_process(p, tmp_path, monkeypatch, "epoch.max_records=1000", "parallelism=2")
    info = job_info(job, job.status)
    metrics = info.metrics
    assert metrics is not None
    assert JobInfo.from_wire(info.to_wire()) == info, "the answer reads back"
    ops = metrics.operators
    assert ops["events"].kind == "source" and ops["events"].records_out == events
    count = ops["count"]
    assert count.kind == "keyed" and count.records_in > 0
    assert count.processing_latency is not None
    assert count.processing_latency.count == count.records_in, "one latency per record in"
    assert len(count.subtasks) == 2
    for s in count.subtasks:
        assert 0 < s.busy_ratio <= 1 and s.true_rate > 0 and s.state_bytes > 0
        assert s.records_in_total > 0 and s.busy_ms_total > 0
    assert count.state_bytes == sum(s.state_bytes for s in count.subtasks)
    assert count.watermark_ms is None, "no watermark strategy: no event-time metrics"
    out = ops["out"]
    assert out.kind == "sink" and out.records_in == count.records_out
    assert out.committed_latency is not None and out.committed_latency.count >= events
    assert metrics.epoch_duration.count == job.status.epoch
    assert 0 < metrics.max_busy_ratio <= 1 and metrics.busiest_subtask in ("count/0", "count/1")

    families = _families(render_metrics(job)[0])
    where = {"job": "metrics", "operator": "count"}

    def value(name: str, **labels: str) -> float:
        family = families[name.removesuffix("_total").removesuffix("_count")]
        return next(
            s.value for s in family.samples if s.name == name and s.labels == {**where, **labels}
        )

    assert value("stator_operator_records_in_total") == count.records_in
    assert value("stator_operator_records_out_total", operator="events") == events
    assert value("stator_processing_latency_seconds_count") == count.records_in
    for sub in ("0", "1"):
        assert 0 < value("stator_subtask_busy_ratio", subtask=sub) <= 1
        assert value("stator_subtask_true_rate_records_per_second", subtask=sub) > 0
        assert value("stator_subtask_state_bytes", subtask=sub) > 0
        assert value("stator_subtask_busy_seconds_total", subtask=sub) > 0
    assert value("stator_committed_latency_seconds_count", operator="out") >= events
    assert families["stator_epoch_duration_seconds"].type == "histogram"


def test_an_event_time_job_shows_its_watermark_and_delay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = int(time.time() * 1000) - 60_000  # every event a minute old
    p = Pipeline("event-time")
    (
        p.source(
            GeneratorSource(KeyedEvents(20), count=2_000, splits=2),
            uid="events",
            timestamps=lambda e: base + e[2],
            watermarks=BoundedOutOfOrderness(100),
        )
        .key_by(lambda e: e[0])
        .count(uid="count")
        .sink(CollectSink(), uid="out")
    )
    seen: list[tuple[JobInfo, bytes]] = []
    original = Job.__init__

    def init(self: Job, *args: Any, **kw: Any) -> None:
        original(self, *args, **kw)
        self.on_epoch(
            lambda r: (
                seen.append((job_info(self, self.status), render_metrics(self)[0]))
                if r.epoch == 1
                else None
            )
        )

    monkeypatch.setattr(Job, "__init__", init)
    run_in_process(p, tmp_path, monkeypatch, "epoch.max_records=1000")
    info, text = seen[0]
    assert info.metrics is not None
    count = info.metrics.operators["count"]
    # Epoch 1 read indices 0..999: the splits' largest timestamps are base + 998 and + 999.
    assert count.watermark_ms == base + 998 - 100
    assert count.event_time_delay_ms is not None and 55_000 < count.event_time_delay_ms < 90_000
    assert info.metrics.event_time_delay_ms == count.event_time_delay_ms
    assert all(s.watermark_ms == count.watermark_ms for s in count.subtasks)
    gauges = _families(text)["stator_operator_watermark_timestamp_seconds"].samples
    assert [(s.labels["operator"], s.value) for s in gauges] == [("count", (base + 898) / 1000)]
    delay = _families(text)["stator_operator_event_time_delay_seconds"].samples
    assert delay[0].value == count.event_time_delay_ms / 1000
