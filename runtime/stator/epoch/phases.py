"""Where an epoch's time goes: its phases, as ms after the driver planned it.

Tasks stamp their own phases with the wall clock (``SplitReport`` / ``StateReport``:
``started_ms`` ... ``ended_ms``); the driver stamps the rest. Across several machines the
clocks of executors and driver differ by their skew (NTP: a few ms), which the phases of
tasks inherit. Each field is the *last* task's moment (the phase is over when its slowest
task is), except ``*_start``, the first task's.

planned (0) -> ``submitted`` (the Spark job is built and submitted) -> ``source_start`` ..
``source_end`` (source tasks: read, stateless chain, shuffle write) -> ``keyed_start`` ->
``keyed_input`` (the shuffle is read) -> ``keyed_processed`` (the functions ran over every
record) -> ``keyed_end`` (state committed, checkpoint snapshot taken) -> ``job_end`` (the
driver has the reports) -> ``handed_off`` (positions advanced, output pending, the
checkpoint handed to the coordinator; an exactly-once sink commits when it completes:
``committed`` in the committed latency, ``driver/job_metrics.py``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .reports import Report, SplitReport, StateReport


@dataclass(frozen=True)
class EpochPhases:
    """ms after the epoch was planned; 0 where no task of that kind ran."""

    submitted: int = 0
    source_start: int = 0
    source_end: int = 0
    keyed_start: int = 0
    keyed_input: int = 0
    keyed_processed: int = 0
    keyed_end: int = 0
    job_end: int = 0
    handed_off: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def phases(
    planned_ms: int,
    submitted_ms: int,
    reports: list[Report],
    job_end_ms: int,
    handed_off_ms: int,
) -> EpochPhases:
    """One epoch's phases from its reports and the driver's own stamps."""
    reads = [r for r in reports if isinstance(r, SplitReport) and r.ended_ms]
    states = [r for r in reports if isinstance(r, StateReport) and r.ended_ms]

    def after(ms: int) -> int:
        return max(0, ms - planned_ms) if ms else 0

    return EpochPhases(
        submitted=after(submitted_ms),
        source_start=after(min((r.started_ms for r in reads), default=0)),
        source_end=after(max((r.ended_ms for r in reads), default=0)),
        keyed_start=after(min((r.started_ms for r in states), default=0)),
        keyed_input=after(max((r.input_ms for r in states), default=0)),
        keyed_processed=after(max((r.processed_ms for r in states), default=0)),
        keyed_end=after(max((r.ended_ms for r in states), default=0)),
        job_end=after(job_end_ms),
        handed_off=after(handed_off_ms),
    )
