"""A running job's metrics (docs/control-api.md, "Metrics"): records in and out per operator,
epoch duration, latency from available to processed (keyed operators) and to committed
(exactly-once sinks), and per keyed subtask its watermark, busy ratio, true processing rate
and state bytes.

Tasks aggregate per batch and report through the epoch's accumulator (``epoch/reports.py``);
this adds the reports up. One object serves every failover region of a job: each region's
loop writes from its own thread, the control API reads at scrape time, so every access holds
the lock and readers get a copy (:meth:`JobMetrics.view`).
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass, field
from typing import Any

from ..api.time import MAX_TIMESTAMP
from ..checkpoint.metadata import CheckpointMetadata
from ..epoch.availability import Availability, merge
from ..epoch.histogram import Histogram
from ..epoch.reports import Report, SinkReport, SplitReport, StateReport

SOURCE, KEYED, SINK = "source", "keyed", "sink"
# Epochs whose availability waits for their sinks' commit, per job: beyond it the oldest is
# dropped (its committed latency is then not measured; a checkpoint covers far fewer).
MAX_UNCOMMITTED_EPOCHS = 4096


@dataclass(frozen=True)
class SubtaskEpoch:
    """A keyed subtask's latest epoch. ``busy_s``: its task's wall time, less a restore of
    its state; ``epoch_s``: the epoch's wall time on the driver (its Spark job started to
    its reports in)."""

    epoch: int
    records_in: int
    records_out: int
    busy_s: float
    epoch_s: float
    watermark: int  # MIN_TIMESTAMP..MAX_TIMESTAMP: none yet, or every input ended
    ended_ms: int  # when the driver had its report
    # Records it took in per second busy, in the latest epoch that gave it input (an epoch
    # without, e.g. a savepoint's, says nothing of its rate): what it could sustain if never
    # idle.
    true_rate: float = 0.0

    @property
    def busy_ratio(self) -> float:
        """Time in its task over the epoch's wall time, at most 1 (the task's clock is the
        executor's, the epoch's the driver's)."""
        return min(1.0, self.busy_s / self.epoch_s) if self.epoch_s > 0 else 0.0


@dataclass
class SubtaskTotals:
    """A keyed subtask's counters since the driver started (replayed epochs count again)."""

    records_in: int = 0
    records_out: int = 0
    busy_s: float = 0.0


@dataclass
class OperatorMetrics:
    kind: str  # SOURCE, KEYED or SINK
    records_in: int = 0  # keyed: records its subtasks took in; a sink: records written
    records_out: int = 0  # a source: records read; keyed: records its function emitted
    latency: Histogram = field(default_factory=Histogram)  # keyed: available -> processed
    committed: Histogram = field(default_factory=Histogram)  # a sink: available -> committed
    latest: dict[int, SubtaskEpoch] = field(default_factory=dict)  # keyed, per subtask
    totals: dict[int, SubtaskTotals] = field(default_factory=dict)  # keyed, per subtask
    state_bytes: dict[int, int] = field(default_factory=dict)  # latest checkpoint, per subtask

    @property
    def watermark(self) -> int | None:
        """The smallest of its subtasks' watermarks, if that is a time (epoch ms)."""
        marks = [s.watermark for s in self.latest.values()]
        low = min(marks, default=None)
        return low if low is not None and 0 <= low < MAX_TIMESTAMP else None

    @property
    def event_time_delay_ms(self) -> int | None:
        """When its latest epoch ended minus its watermark (None without a watermark)."""
        mark = self.watermark
        if mark is None:
            return None
        ended = max(s.ended_ms for s in self.latest.values())
        return max(0, ended - mark)


@dataclass
class MetricsView:
    """A copy of the metrics at one moment (what the control API and /metrics read)."""

    epochs: Histogram
    operators: dict[str, OperatorMetrics]

    def busiest(self) -> tuple[str, int, SubtaskEpoch] | None:
        """The keyed subtask with the highest busy ratio in its latest epoch."""
        found = [(u, i, s) for u, op in self.operators.items() for i, s in op.latest.items()]
        return max(found, key=lambda f: f[2].busy_ratio, default=None)

    def latency(self, committed: bool = False) -> Histogram:
        """Processing (or committed) latency over every operator."""
        total = Histogram()
        for op in self.operators.values():
            total.merge(op.committed if committed else op.latency)
        return total


class JobMetrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._epochs = Histogram()
        self._operators: dict[str, OperatorMetrics] = {}
        # (region, epoch) -> when the epoch's source records became available
        self._available: dict[tuple[str | None, int], Availability] = {}

    def __getstate__(self) -> dict[str, Any]:
        """A job's final status may be pickled (``Pipeline.run`` returns it): not the lock."""
        with self._lock:
            return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _op(self, uid: str, kind: str) -> OperatorMetrics:
        op = self._operators.get(uid)
        if op is None:
            op = self._operators[uid] = OperatorMetrics(kind)
        return op

    def epoch_done(
        self,
        region: str | None,
        epoch: int,
        reports: list[Report],
        duration_s: float,
        ended_ms: int,
    ) -> None:
        """Add one epoch's reports (a report Spark delivered twice, for a task it re-ran,
        counts once: the later stands, as ``PendingOutput.add`` keeps it)."""
        reads = {(r.uid, r.split): r for r in reports if isinstance(r, SplitReport)}
        states = {(r.uid, r.subtask): r for r in reports if isinstance(r, StateReport)}
        parts = {(r.uid, r.part): r for r in reports if isinstance(r, SinkReport)}
        with self._lock:
            self._epochs.observe(duration_s * 1000)
            for read in reads.values():
                self._op(read.uid, SOURCE).records_out += read.records
            for s in states.values():
                self._subtask_done(s, duration_s, ended_ms)
            for part in parts.values():
                self._op(part.uid, SINK).records_in += part.records
            available = merge(r.available for r in reads.values())
            if available:
                self._available[(region, epoch)] = available
                while len(self._available) > MAX_UNCOMMITTED_EPOCHS:
                    del self._available[next(iter(self._available))]

    def _subtask_done(self, s: StateReport, duration_s: float, ended_ms: int) -> None:
        op = self._op(s.uid, KEYED)
        busy_s = s.busy_ns / 1e9
        op.records_in += s.records_in
        op.records_out += s.records_out
        if s.latency is not None:
            op.latency.merge(s.latency)
        before = op.latest.get(s.subtask)
        rate = (
            s.records_in / busy_s
            if s.records_in and busy_s > 0
            else (before.true_rate if before else 0.0)
        )
        op.latest[s.subtask] = SubtaskEpoch(
            s.epoch, s.records_in, s.records_out, busy_s, duration_s, s.watermark, ended_ms, rate
        )
        totals = op.totals.setdefault(s.subtask, SubtaskTotals())
        totals.records_in += s.records_in
        totals.records_out += s.records_out
        totals.busy_s += busy_s

    def committed(self, region: str | None, sink: str, epoch: int, at_ms: int) -> None:
        """An exactly-once sink committed ``epoch`` of ``region`` at ``at_ms``: the epoch's
        source records reached its readers then."""
        with self._lock:
            hist = self._op(sink, SINK).committed
            for available_ms, n in self._available.get((region, epoch), ()):
                hist.observe(at_ms - available_ms, n)

    def checkpointed(self, meta: CheckpointMetadata) -> None:
        """A checkpoint completed: its operators' state bytes per subtask (a region's
        checkpoint holds that region's operators only)."""
        with self._lock:
            for uid, snap in meta.operators.items():
                self._op(uid, KEYED).state_bytes = {s.index: s.state_bytes for s in snap.subtasks}

    def view(self) -> MetricsView:
        with self._lock:
            return MetricsView(self._epochs.copy(), copy.deepcopy(self._operators))
