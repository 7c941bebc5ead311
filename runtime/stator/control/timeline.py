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
twice the throughput); a ``gauge`` is shown as read. The console draws every series it is
given, by group, so a new series needs no change there.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from typing import Literal

from ..checkpoint.coordinator import now_ms
from ..driver.listeners import EpochResult
from ..driver.status import JobStatus
from .answers import source_infos
from .schema import EpochSample, FailoverSample, SeriesInfo, TimeSeries

INTERVAL_S = 1.0  # one status sample a second
SAMPLES = 3600  # status samples kept: an hour
EPOCHS = 1000  # epoch samples kept
FAILOVERS = 100  # failovers kept
RATE_WINDOW = 5  # a rate is the counter's increase over this many samples, per second
ERROR_CHARS = 500  # of a failover's error

Kind = Literal["rate", "gauge"]


@dataclass(frozen=True)
class Series:
    """One time series of the status: what ``read`` gives, in ``unit`` (per second for a
    ``rate``, whose ``read`` is a counter), drawn in the plot ``group``."""

    name: str
    unit: str
    group: str
    kind: Kind
    read: Callable[[JobStatus], float]


def _lag_records(st: JobStatus) -> float:
    return sum(s.lag_records for s in source_infos(st).values())


def _lag_ms(st: JobStatus) -> float:
    return max((s.lag_ms for s in source_infos(st).values()), default=0)


SERIES: tuple[Series, ...] = (
    Series("records_in", "records/s", "throughput", "rate", lambda st: st.records_in),
    Series("records_out", "records/s", "throughput", "rate", lambda st: st.records_out),
    Series("lag_records", "records", "lag", "gauge", _lag_records),
    Series("lag_ms", "ms", "lag", "gauge", _lag_ms),
    Series("restarts", "restarts", "failovers", "gauge", lambda st: st.restarts),
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
        self._raw: deque[tuple[float, ...]] = deque(maxlen=samples)  # as read: counters too
        self._epochs: deque[EpochSample] = deque(maxlen=epochs)
        self._failovers: deque[FailoverSample] = deque(maxlen=failovers)
        self._restarts = 0  # as of the latest status sample
        self._lock = threading.Lock()

    def sample(self, st: JobStatus, at_ms: int | None = None) -> None:
        """One status sample: every series read from ``st``, and a failover if the job
        restarted since the sample before (several restarts between two: one entry)."""
        values = tuple(float(s.read(st)) for s in self.series)
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
            column = [r[i] for r in raw]
            if s.kind == "rate":
                out[s.name] = _rates(column, times)
            else:
                out[s.name] = tuple(column)
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


def _rates(counter: list[float], times: tuple[int, ...]) -> tuple[float | None, ...]:
    out: list[float | None] = [None] * len(counter)
    for k in range(1, len(counter)):
        j = max(0, k - RATE_WINDOW)
        window = counter[j : k + 1]
        ms = times[k] - times[j]
        if ms > 0 and all(a <= b for a, b in pairwise(window)):
            out[k] = round((counter[k] - counter[j]) * 1000 / ms, 3)
    return tuple(out)
