"""What the autoscaler reads of a running job: one :class:`Sample` per look at the driver's
``/v1/job`` (its cumulative counters), and :class:`WindowMetrics`, the rates over a window
of them.

Counters, not the driver's per-epoch ratios: a difference of counters over a window weighs
every epoch by its length and cannot miss one between two looks. A sample is timed when
the driver measured its lag (when it planned its latest epoch: ``JobInfo.lag_at_ms``), not
when the operator looked: at one replica under a backlog an epoch takes seconds, and a
look during it reads the lag of its start. Timed at the look, a step in the input read as
a fraction of itself (the e2e test's first scale-up saw 318 of 600 records/s). The capacity is in
*source* records per second of the busiest keyed subtask's busy time, so that it compares
with the input rate and the lag (both in source records) whatever the pipeline filters or
fans out on the way, and already carries the skew between subtasks."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from stator.control.schema import JobInfo

# Less busy time than this over a window says nothing about what a subtask could do.
MIN_BUSY_S = 0.5
# A driver runs its author's code: a sample keeps at most this many subtasks' counters (a
# window holds tens of samples per pipeline in the operator's memory).
MAX_SUBTASKS = 4096
# A sample is timed at most this long before the look (a driver's word is bounded).
MAX_AGE_S = 120.0


@dataclass(frozen=True)
class Sample:
    """The job's counters at ``at_s`` (the operator's wall clock, seconds)."""

    at_s: float
    records_in: int  # source records read since the driver started
    lag_records: int  # the sources' consumer lag now
    # Keyed operators that follow replicas: each subtask's busy time since the driver started.
    busy_ms: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    @classmethod
    def of(cls, job: JobInfo, at_s: float) -> Sample:
        """The job's counters as of its lag's measurement (``at_s``: the look, the latest
        it can be)."""
        scaled = {  # keyed operators (the only nodes with a parallelism) not pinned
            n.label
            for n in (job.graph.nodes if job.graph else ())
            if n.parallelism and not n.pinned
        }
        operators = job.metrics.operators if job.metrics else {}
        busy: dict[str, tuple[int, ...]] = {}
        room = MAX_SUBTASKS
        for uid, op in sorted(operators.items()):
            if uid in scaled and len(op.subtasks) <= room:
                ordered = sorted(op.subtasks, key=lambda s: s.subtask)
                busy[uid] = tuple(s.busy_ms_total for s in ordered)
                room -= len(ordered)
        measured = at_s if job.lag_at_ms is None else job.lag_at_ms / 1000
        timed = min(max(measured, at_s - MAX_AGE_S), at_s)
        return cls(timed, job.records_in, job.lag_records, busy)

    def to_json(self) -> dict[str, Any]:
        return {
            "at_s": round(self.at_s, 3),
            "records_in": self.records_in,
            "lag_records": self.lag_records,
            "busy_ms": {k: list(v) for k, v in self.busy_ms.items()},
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Sample:
        busy = raw.get("busy_ms") or {}
        return cls(
            float(raw["at_s"]),
            int(raw["records_in"]),
            int(raw["lag_records"]),
            {str(k): tuple(int(x) for x in v) for k, v in busy.items()},
        )

    def follows(self, earlier: Sample) -> bool:
        """Whether this sample continues ``earlier``'s counters (not a restarted driver's,
        whose counters began again, nor another set of operators or subtasks)."""
        if self.records_in < earlier.records_in or self.at_s <= earlier.at_s:
            return False
        if self.busy_ms.keys() != earlier.busy_ms.keys():
            return False
        return all(
            len(now) == len(then) and all(a >= b for a, b in zip(now, then, strict=True))
            for now, then in ((self.busy_ms[k], earlier.busy_ms[k]) for k in self.busy_ms)
        )


@dataclass(frozen=True)
class WindowMetrics:
    """The rates over a window of samples (``span_s`` long)."""

    span_s: float
    # Records/s arriving: read, plus the lag's growth (``metrics_over``: the higher of the
    # window's and its latest half's).
    input_rate: float
    processed_rate: float  # records/s read
    lag_records: int  # at the window's end
    # The busiest keyed subtask's busy time over the span (its utilization), and the source
    # records/s the job would read were that subtask busy all the time (None: too idle to
    # tell).
    busiest_busy_s: float
    capacity: float | None
    busiest: str | None  # "<operator uid>/<subtask>"

    @property
    def utilization(self) -> float:
        return self.busiest_busy_s / self.span_s if self.span_s > 0 else 0.0

    @staticmethod
    def arrival_rate(first: Sample, last: Sample) -> float:
        """Records/s arriving between two samples: read, plus the lag's growth."""
        read = last.records_in - first.records_in
        arrived = read + (last.lag_records - first.lag_records)
        return max(0.0, arrived / (last.at_s - first.at_s))

    @classmethod
    def over(cls, first: Sample, last: Sample) -> WindowMetrics:
        span = last.at_s - first.at_s
        read = last.records_in - first.records_in
        busiest_s, busiest = 0.0, None
        for uid, now in last.busy_ms.items():
            then = first.busy_ms.get(uid, ())
            for i, (a, b) in enumerate(zip(now, then, strict=False)):
                if (a - b) / 1000 > busiest_s:
                    busiest_s, busiest = (a - b) / 1000, f"{uid}/{i}"
        return cls(
            span_s=span,
            input_rate=cls.arrival_rate(first, last),
            processed_rate=read / span,
            lag_records=last.lag_records,
            busiest_busy_s=busiest_s,
            capacity=read / busiest_s if busiest_s >= MIN_BUSY_S else None,
            busiest=busiest,
        )

    JSON_KEYS = (
        "inputRate",
        "processedRate",
        "lagRecords",
        "utilization",
        "capacity",
        "busiest",
        "windowSeconds",
    )

    def to_json(self) -> dict[str, Any]:
        return {
            "inputRate": round(self.input_rate, 1),
            "processedRate": round(self.processed_rate, 1),
            "lagRecords": self.lag_records,
            "utilization": round(self.utilization, 3),
            "capacity": None if self.capacity is None else round(self.capacity, 1),
            "busiest": None if self.busiest is None else self.busiest[:200],
            "windowSeconds": round(self.span_s, 1),
        }


@dataclass
class SampleWindow:
    """One deployment's samples, as far back as the longest window needs. A sample that does
    not continue the last (a restarted driver) starts it afresh."""

    deployment: str
    keep_s: float
    samples: deque[Sample] = field(default_factory=deque)

    def add(self, sample: Sample) -> None:
        last = self.samples[-1] if self.samples else None
        if last is not None and sample.at_s <= last.at_s and sample.records_in >= last.records_in:
            return  # nothing measured since: the driver has not planned another epoch
        if last is not None and not sample.follows(last):
            self.samples.clear()
        self.samples.append(sample)
        while len(self.samples) > 2 and self.samples[1].at_s <= sample.at_s - self.keep_s:
            self.samples.popleft()

    def metrics(self, window_s: float) -> WindowMetrics | None:
        """The rates over the last ``window_s``, once the samples span that long (not the
        first seconds of a driver, whose start-up would read as the job's pace)."""
        return metrics_over(self.samples, window_s)


def metrics_over(samples: Iterable[Sample], window_s: float) -> WindowMetrics | None:
    """The rates over the last ``window_s`` of ``samples`` (oldest first): from the newest
    sample at least that old to the newest; None until they span the window."""
    ordered = list(samples)
    if len(ordered) < 2:
        return None
    last = ordered[-1]
    first = next((s for s in reversed(ordered) if s.at_s <= last.at_s - window_s), None)
    if first is None:
        return None
    metrics = WindowMetrics.over(first, last)
    # The input rate is the higher of the window's and its latest half's: a step up in the
    # input shows after half a window, not averaged with what came before it (measured on
    # the e2e test's step: a first scale-up to half what the step needed, then a second).
    middle = next(s for s in reversed(ordered) if s.at_s <= last.at_s - window_s / 2)
    recent = WindowMetrics.arrival_rate(middle, last)
    return replace(metrics, input_rate=max(metrics.input_rate, recent))
