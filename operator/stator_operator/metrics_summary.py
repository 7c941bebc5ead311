"""``status.metrics``: what a person looks at first of a running job's metrics, out of the
driver's ``/v1/job`` answer (already read through ``from_wire``, which refuses wrong types,
negative and non-finite numbers). A driver runs the user's code: the busy ratio is clamped
to [0, 1] and rounded, so a bogus value cannot pass for a real one, and every value is a
plain number or a short string (``untrusted.bounded_fields`` cuts strings further)."""

from __future__ import annotations

from stator.control.schema import JobInfo, MetricsInfo, mirror
from stator.control.wire import Json

SUMMARY_FIELDS = (
    "processing_latency_p99_ms",
    "committed_latency_p99_ms",
    "busiest_subtask",
    "event_time_delay_ms",
)


def metrics_summary(job: JobInfo) -> dict[str, Json]:
    """``{"metrics": {...}}`` for the status, or nothing from a driver that sends none."""
    metrics: MetricsInfo | None = job.metrics
    if metrics is None:
        return {}
    epochs = metrics.epoch_duration
    return {
        "metrics": {
            **mirror(metrics, *SUMMARY_FIELDS),
            "maxBusyRatio": round(min(1.0, max(0.0, metrics.max_busy_ratio)), 3),
            "epochDurationP99Ms": epochs.p99_ms,
        }
    }
