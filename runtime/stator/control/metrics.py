"""Prometheus metrics of a running job, read from the driver at scrape time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from ..driver.job_metrics import KEYED, SINK, SOURCE, MetricsView
from ..driver.status import JobState, JobStatus
from ..epoch.histogram import BOUNDS_MS, Histogram
from .view import JobView


class DriverCollector(Collector):
    def __init__(self, driver: JobView) -> None:
        self.driver = driver

    def collect(self) -> Iterator[Any]:
        d, st = self.driver, self.driver.status
        labels = ["job"]
        job = [d.job]

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            m = CounterMetricFamily(name, doc, labels=labels)
            m.add_metric(job, value)
            return m

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            m = GaugeMetricFamily(name, doc, labels=labels)
            m.add_metric(job, value)
            return m

        yield counter("stator_epochs", "Epochs completed", st.epoch)
        yield counter("stator_records_in", "Records read from sources", st.records_in)
        yield counter("stator_records_out", "Records written to sinks", st.records_out)
        yield counter("stator_checkpoints", "Checkpoints completed", st.checkpoints)
        yield counter("stator_checkpoints_failed", "Checkpoints that failed", st.failed_checkpoints)
        yield gauge(
            "stator_checkpoints_in_flight",
            "Checkpoints whose uploads are not confirmed yet",
            len(st.in_flight_checkpoints),
        )
        yield counter("stator_restarts", "Job restarts after failures", st.restarts)
        yield gauge(
            "stator_running", "1 while the job runs", 1 if st.state is JobState.RUNNING else 0
        )
        r = st.restores
        restores = CounterMetricFamily(
            "stator_restores", "Keyed subtask restores, by source", labels=["job", "source"]
        )
        restores.add_metric([d.job, "local"], r.local)
        restores.add_metric([d.job, "remote"], r.remote)
        yield restores
        yield counter(
            "stator_restore_local_bytes", "Bytes of state restored from local copies", r.local_bytes
        )
        yield counter(
            "stator_restore_remote_bytes",
            "Bytes of state restored from the object store",
            r.remote_bytes,
        )
        standby = st.standby_copies.to_json()
        yield counter(
            "stator_standby_copies",
            "Standby copies that read from the object store (local_recovery.standby)",
            standby["copies"],
        )
        yield counter(
            "stator_standby_copy_bytes",
            "Bytes standby copies read from the object store",
            standby["bytes"],
        )
        yield counter(
            "stator_standby_copies_failed",
            "Standby copies that failed (the next checkpoint's orders try again)",
            standby["failed"],
        )
        yield counter(
            "stator_keyed_tasks_local",
            "Keyed tasks that ran on the executor holding their local state",
            st.keyed_tasks_local,
        )
        yield counter(
            "stator_keyed_tasks",
            "Keyed tasks placed on executors (several executors only)",
            st.keyed_tasks_total,
        )
        latest = st.last_checkpoint
        if latest is not None:
            yield gauge(
                "stator_state_bytes", "State size in the latest checkpoint", latest.state_bytes
            )
            yield gauge(
                "stator_checkpoint_incremental_bytes",
                "Bytes the latest checkpoint uploaded",
                latest.incremental_bytes,
            )
            yield gauge(
                "stator_checkpoint_duration_seconds",
                "Duration of the latest checkpointed epoch",
                latest.duration_ms / 1000,
            )
            yield gauge("stator_checkpoint_id", "Id of the latest checkpoint", latest.checkpoint_id)
        region = ["job", "region"]
        restarts = CounterMetricFamily(
            "stator_region_restarts", "Restarts of each failover region", labels=region
        )
        epochs = CounterMetricFamily(
            "stator_region_epochs", "Epochs each failover region completed", labels=region
        )
        running = GaugeMetricFamily(
            "stator_region_running", "1 while the failover region runs", labels=region
        )
        for view in d.region_views():
            restarts.add_metric([d.job, view["id"]], view["restarts"])
            epochs.add_metric([d.job, view["id"]], view["epoch"])
            running.add_metric([d.job, view["id"]], 1 if view["state"] is JobState.RUNNING else 0)
        yield restarts
        yield epochs
        yield running
        yield from _source_metrics(d.job, st)
        yield _parallelism(d)
        yield from _job_metrics(d.job, st.metrics.view())


def _parallelism(d: JobView) -> GaugeMetricFamily:
    parallelism = GaugeMetricFamily(
        "stator_operator_parallelism", "Subtasks per operator", labels=["job", "operator"]
    )
    for uid, p in d.parallelism.operators.items():
        parallelism.add_metric([d.job, uid], p)
    return parallelism


def _job_metrics(job: str, view: MetricsView) -> Iterator[Any]:
    """Per operator and keyed subtask (``driver/job_metrics.py``; docs/control-api.md's
    table)."""
    op_labels, sub_labels = ["job", "operator"], ["job", "operator", "subtask"]
    epochs = HistogramMetricFamily(
        "stator_epoch_duration_seconds",
        "Wall time of each epoch on the driver, its Spark job started to its reports in",
        labels=["job"],
    )
    _histogram(epochs, [job], view.epochs)
    yield epochs
    records_in = CounterMetricFamily(
        "stator_operator_records_in",
        "Records an operator took in: a keyed operator's subtasks (pre-combined entries for "
        "count and reduce), a sink's writes",
        labels=op_labels,
    )
    records_out = CounterMetricFamily(
        "stator_operator_records_out",
        "Records an operator put out: a source's reads, a keyed operator's function's output",
        labels=op_labels,
    )
    latency = HistogramMetricFamily(
        "stator_processing_latency_seconds",
        "Per record, from available (docs/control-api.md) to processed by a keyed operator",
        labels=op_labels,
    )
    committed = HistogramMetricFamily(
        "stator_committed_latency_seconds",
        "Per source record, from available to its epoch's output committed by an exactly-once sink",
        labels=op_labels,
    )
    watermark = GaugeMetricFamily(
        "stator_operator_watermark_timestamp_seconds",
        "A keyed operator's watermark (event time, Unix seconds): its subtasks' smallest",
        labels=op_labels,
    )
    delay = GaugeMetricFamily(
        "stator_operator_event_time_delay_seconds",
        "When a keyed operator's latest epoch ended minus its watermark",
        labels=op_labels,
    )
    state = GaugeMetricFamily(
        "stator_operator_state_bytes",
        "A keyed operator's state in the latest checkpoint",
        labels=op_labels,
    )
    for uid, op in sorted(view.operators.items()):
        where = [job, uid]
        if op.kind != SOURCE:
            records_in.add_metric(where, op.records_in)
        if op.kind != SINK:
            records_out.add_metric(where, op.records_out)
        if op.kind == KEYED:
            _histogram(latency, where, op.latency)
            state.add_metric(where, sum(op.state_bytes.values()))
        if op.committed.count:
            _histogram(committed, where, op.committed)
        mark, late = op.watermark, op.event_time_delay_ms
        if mark is not None and late is not None:
            watermark.add_metric(where, mark / 1000)
            delay.add_metric(where, late / 1000)
    yield from (records_in, records_out, latency, committed, watermark, delay, state)
    yield from _subtask_metrics(job, view, sub_labels)


def _subtask_metrics(job: str, view: MetricsView, labels: list[str]) -> Iterator[Any]:
    ratio = GaugeMetricFamily(
        "stator_subtask_busy_ratio",
        "Time in a keyed subtask's task (less a state restore) over its epoch's wall time, "
        "latest epoch",
        labels=labels,
    )
    rate = GaugeMetricFamily(
        "stator_subtask_true_rate_records_per_second",
        "Records a keyed subtask took in per second busy, latest epoch with input",
        labels=labels,
    )
    busy = CounterMetricFamily(
        "stator_subtask_busy_seconds", "Time keyed subtasks spent in their tasks", labels=labels
    )
    records = CounterMetricFamily(
        "stator_subtask_records_in", "Records a keyed subtask took in", labels=labels
    )
    state = GaugeMetricFamily(
        "stator_subtask_state_bytes",
        "A keyed subtask's state in the latest checkpoint",
        labels=labels,
    )
    for uid, op in sorted(view.operators.items()):
        for i, latest in sorted(op.latest.items()):
            ratio.add_metric([job, uid, str(i)], latest.busy_ratio)
            rate.add_metric([job, uid, str(i)], latest.true_rate)
        for i, totals in sorted(op.totals.items()):
            busy.add_metric([job, uid, str(i)], totals.busy_s)
            records.add_metric([job, uid, str(i)], totals.records_in)
        for i, size in sorted(op.state_bytes.items()):
            state.add_metric([job, uid, str(i)], size)
    yield from (ratio, rate, busy, records, state)


def _histogram(family: HistogramMetricFamily, labels: list[str], h: Histogram) -> None:
    """``h`` (ms buckets) as a Prometheus histogram in seconds."""
    cumulative = h.cumulative()
    buckets = [(_le(b / 1000), n) for b, n in zip(BOUNDS_MS, cumulative, strict=False)]
    family.add_metric(labels, [*buckets, ("+Inf", cumulative[-1])], h.sum_ms / 1000)


def _le(seconds: float) -> str:
    return repr(float(seconds))


def _source_metrics(job: str, st: JobStatus) -> Iterator[Any]:
    """Consumer lag per source split, as measured when the latest epoch was planned, and
    records sent to dead letters per source."""
    labels = ["job", "source", "split"]
    records = GaugeMetricFamily(
        "stator_source_lag_records", "Records in the source not yet read, per split", labels=labels
    )
    seconds = GaugeMetricFamily(
        "stator_source_lag_seconds",
        "Age of the next unread record of the split (0: caught up)",
        labels=labels,
    )
    for uid, splits in sorted(st.source_lag.items()):
        for split, lag in sorted(splits.items()):
            records.add_metric([job, uid, split], lag.records)
            seconds.add_metric([job, uid, split], lag.seconds)
    yield records
    yield seconds
    letters = CounterMetricFamily(
        "stator_source_dead_letters",
        "Records the source could not decode and sent to its dead-letter topic",
        labels=["job", "source"],
    )
    for uid, count in sorted(st.dead_letters.items()):
        letters.add_metric([job, uid], count)
    yield letters


def render_metrics(driver: JobView) -> tuple[bytes, str]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DriverCollector(driver))
    return generate_latest(registry), CONTENT_TYPE_LATEST
