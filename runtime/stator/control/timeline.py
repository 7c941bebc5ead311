"""The driver's recent history as time series (``GET /v1/history``, drawn by the console):
bounded ring buffers, so a driver that runs for months holds the same few hundred KiB.

Two kinds of sample:

- every ``INTERVAL_S`` the control server's loop reads the job's status once and appends one
  value per :data:`SERIES` (``SAMPLES`` of them: an hour at one a second);
- every epoch (a listener of ``Job.on_epoch``) appends its duration and records
  (``EPOCHS`` of them);
- a status sample whose ``restarts`` went up appends a failover: when it was seen, the
  restarts then and the job's last error (``FAILOVERS`` of them).

A series is one line of :data:`SERIES`: a name, a unit, the plot it is drawn in (``group``)
and how to read it from a :class:`~stator.driver.status.JobStatus`. A ``rate`` series reads a
counter and is shown per second over the last ``RATE_WINDOW`` samples (an epoch often takes
longer than a sample's second: the rate between two samples alone would swing between 0 and
twice the throughput); a ``p99`` reads a latency histogram (counts since the driver started)
and is shown as the 99th percentile of what was observed in the last ``RATE_WINDOW`` samples
(a quantile since the start would hardly move after an hour); a ``gauge`` is shown as read.
The console draws every series it is given, by group, so a new series needs no change there.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from typing import Literal, cast

from ..checkpoint.coordinator import now_ms
from ..driver.listeners import EpochResult
from ..driver.status import JobStatus
from ..epoch.histogram import Histogram
from .answers import source_infos
from .schema import EpochSample, FailoverSample, SeriesInfo, TimeSeries

INTERVAL_S = 1.0  # one status sample a second
SAMPLES = 3600  # status samples kept: an hour
EPOCHS = 1000  # epoch samples kept
FAILOVERS = 100  # failovers kept
RATE_WINDOW = 5  # a rate is the counter's increase over this many samples, per second
ERROR_CHARS = 500  # of a failover's error

Kind = Literal["rate", "gauge", "p99"]
Value = float | tuple[int, ...]  # a p99 series reads bucket counts


@dataclass(frozen=True)
class Series:
    """One time series of the status: what ``read`` gives, in ``unit`` (per second for a
    ``rate``, whose ``read`` is a counter; ms for a ``p99``, whose ``read`` is a histogram's
    bucket counts), drawn in the plot ``group``."""

    name: str
    unit: str
    group: str
    kind: Kind
    read: Callable[[JobStatus], Value]


def _lag_records(st: JobStatus) -> float:
    return sum(s.lag_records for s in source_infos(st).values())


def _lag_ms(st: JobStatus) -> float:
    return max((s.lag_ms for s in source_infos(st).values()), default=0)


def _processing_latency(st: JobStatus) -> tuple[int, ...]:
    return tuple(st.metrics.view().latency().counts)


def _committed_latency(st: JobStatus) -> tuple[int, ...]:
    return tuple(st.metrics.view().latency(committed=True).counts)


def _max_busy_ratio(st: JobStatus) -> float:
    busiest = st.metrics.view().busiest()
    return busiest[2].busy_ratio if busiest else 0.0


SERIES: tuple[Series, ...] = (
    Series("records_in", "records/s", "throughput", "rate", lambda st: st.records_in),
    Series("records_out", "records/s", "throughput", "rate", lambda st: st.records_out),
    Series("lag_records", "records", "lag", "gauge", _lag_records),
    Series("lag_ms", "ms", "lag", "gauge", _lag_ms),
    Series("restarts", "restarts", "failovers", "gauge", lambda st: st.restarts),
    Series("processing_latency_p99", "ms", "latency", "p99", _processing_latency),
    Series("committed_latency_p99", "ms", "latency", "p99", _committed_latency),
    Series("max_busy_ratio", "ratio", "busy", "gauge", _max_busy_ratio),
)


class Timeline:
    """The ring buffers of one driver: appended by the control server's loop (status
    samples) and by the regions' threads (epochs), read by ``GET /v1/history``."""

    def __init__(
        self,
        series: tuple[Series, ...] = SERIES,
        samples: int = SAMPLES,
        epochs: int = EPOCHS,
        failovers: int = FAILOVERS,
    ) -> None:
        self.series = series
        self._times: deque[int] = deque(maxlen=samples)
        self._raw: deque[tuple[Value, ...]] = deque(maxlen=samples)  # as read: counters too
        self._epochs: deque[EpochSample] = deque(maxlen=epochs)
        self._failovers: deque[FailoverSample] = deque(maxlen=failovers)
        self._restarts = 0  # as of the latest status sample
        self._lock = threading.Lock()

    def sample(self, st: JobStatus, at_ms: int | None = None) -> None:
        """One status sample: every series read from ``st``, and a failover if the job
        restarted since the sample before (several restarts between two: one entry)."""
        values = tuple(s.read(st) for s in self.series)
        at = now_ms() if at_ms is None else at_ms
        with self._lock:
            self._times.append(at)
            self._raw.append(values)
            if st.restarts > self._restarts:
                error = st.last_error[:ERROR_CHARS] if st.last_error else None
                self._failovers.append(FailoverSample(at_ms=at, restarts=st.restarts, error=error))
            self._restarts = st.restarts

    def epoch_done(self, result: EpochResult) -> None:
        """An ``Job.on_epoch`` listener: one sample per epoch (cheap: one append)."""
        sample = EpochSample(
            epoch=result.epoch,
            at_ms=now_ms(),
            duration_ms=round(result.duration_s * 1000),
            records_in=result.records_in,
            records_out=result.records_out,
            region=result.region,
            phases=result.phases.as_dict() if result.phases else {},
        )
        with self._lock:
            self._epochs.append(sample)

    def samples(self) -> tuple[tuple[int, ...], dict[str, tuple[float | None, ...]]]:
        """The sample times (epoch ms) and each series' values at them (a rate: over the
        ``RATE_WINDOW`` samples before, or as many as there are; None for the first sample,
        or where the counter went back in the window)."""
        with self._lock:
            times, raw = tuple(self._times), list(self._raw)
        out: dict[str, tuple[float | None, ...]] = {}
        for i, s in enumerate(self.series):
            if s.kind == "p99":
                out[s.name] = _window_p99([cast(tuple[int, ...], r[i]) for r in raw])
                continue
            column = [float(cast(float, r[i])) for r in raw]
            out[s.name] = _rates(column, times) if s.kind == "rate" else tuple(column)
        return times, out

    def failovers(self) -> tuple[FailoverSample, ...]:
        with self._lock:
            return tuple(self._failovers)

    @property
    def epochs_capacity(self) -> int:
        return self._epochs.maxlen or 0

    def epochs(self) -> tuple[EpochSample, ...]:
        with self._lock:
            return tuple(self._epochs)

    def time_series(self) -> TimeSeries:
        times, values = self.samples()
        return TimeSeries(
            interval_ms=round(INTERVAL_S * 1000),
            capacity=self._times.maxlen or 0,
            series=tuple(SeriesInfo(name=s.name, unit=s.unit, group=s.group) for s in self.series),
            t_ms=times,
            values=values,
        )


def _window_p99(counts: list[tuple[int, ...]]) -> tuple[float | None, ...]:
    """The 99th percentile (ms) of what each histogram gained over the ``RATE_WINDOW``
    samples before it; None where nothing was observed in them (or the counts went back:
    a driver's histogram never shrinks, so that is a reset)."""
    out: list[float | None] = [None] * len(counts)
    for k in range(1, len(counts)):
        old, new = counts[max(0, k - RATE_WINDOW)], counts[k]
        gained = [b - a for a, b in zip(old, new, strict=True)]
        if any(g < 0 for g in gained) or not any(gained):
            continue
        out[k] = round(Histogram(counts=gained).quantile(0.99), 3)
    return tuple(out)


def _rates(counter: list[float], times: tuple[int, ...]) -> tuple[float | None, ...]:
    out: list[float | None] = [None] * len(counter)
    for k in range(1, len(counter)):
        j = max(0, k - RATE_WINDOW)
        window = counter[j : k + 1]
        ms = times[k] - times[j]
        if ms > 0 and all(a <= b for a, b in pairwise(window)):
            out[k] = round((counter[k] - counter[j]) * 1000 / ms, 3)
    return tuple(out)
