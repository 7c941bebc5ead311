"""The autoscaler's decision replayed over metric series recorded from real jobs
(``tests/data/autoscaler/``, written by ``python -m bench.autoscale --record DIR``: every
2 s, a driver's counters as the operator samples them, and the replicas it ran at). The
jobs read Kafka input at 100 -> 600 -> 100 records/s with a keyed function that waits 4 ms
per record, on this 2-core machine: their epochs make the counters move in steps, so the
series are noisy the way real ones are.

- ``fixed-min``: 1 replica throughout: the burst must be answered by a scale-up, the calm
  before it by nothing.
- ``fixed-max``: 6 replicas throughout: calm phases recommend scaling down (after the
  stabilization window), the burst never does.
- ``autoscaled``: the operator's own run, rescales included: replayed per deployment, no
  decision goes against the direction the input took.
- ``cpu-bound``: a job whose function computes instead of waiting, at 4 replicas and then 8
  on 2 cores: the scale-up did not help, and history records it as ineffective."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stator_operator.autoscaling.decision import (
    LOADED,
    Action,
    Decision,
    Inputs,
    busiest_share,
    decide,
)
from stator_operator.autoscaling.history import AutoscalerStatus, RescaleRecord
from stator_operator.autoscaling.samples import Sample, metrics_over
from stator_operator.pipeline_spec import PipelineSpec
from tests.pipelines.autoscale_kafka import AUTOSCALER

DATA = Path(__file__).resolve().parents[1] / "data" / "autoscaler"
SPEC = PipelineSpec.read(
    {"image": "i", "entrypoint": "m:f", "checkpointing": {"storage": "s"}, "autoscaler": AUTOSCALER}
).autoscaler
EVERY_S = 10.0


@dataclass(frozen=True)
class Look:
    t: float  # seconds since the series began
    replicas: int
    decision: Decision


def series(name: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads((DATA / f"{name}.json").read_text())
    return rows


def deployments(rows: list[dict[str, Any]]) -> Iterator[tuple[int, list[Sample]]]:
    """The series cut where the replicas changed or the counters began again."""
    current: list[Sample] = []
    replicas = 0
    for row in rows:
        sample = Sample.from_json(row)
        if current and (row["replicas"] != replicas or not sample.follows(current[-1])):
            yield replicas, current
            current = []
        replicas = row["replicas"]
        current.append(sample)
    if current:
        yield replicas, current


def replay(rows: list[dict[str, Any]], downtime_s: float = 30.0) -> list[Look]:
    """Every 10 s of each deployment (after its cool-down), the decision the operator would
    take from the samples so far."""
    start = rows[0]["at_s"]
    looks: list[Look] = []
    for replicas, samples in deployments(rows):
        history = AutoscalerStatus()
        since = samples[0].at_s + SPEC.cooldown_seconds
        next_look = since
        for i, sample in enumerate(samples):
            if sample.at_s < next_look:
                continue
            next_look = sample.at_s + EVERY_S
            window = [s for s in samples[: i + 1] if s.at_s >= since]
            metrics = metrics_over(window, SPEC.metrics_window_seconds)
            if metrics and metrics.capacity and metrics.utilization >= LOADED:
                history = history.measured_under_load(replicas, metrics.capacity)
            inputs = Inputs(
                now_s=sample.at_s,
                replicas=replicas,
                max_parallelism=60,
                metrics=metrics,
                downtime_s=downtime_s,
                recommendations=history.recommendations,
                loaded_capacity=history.loaded[1] if history.loaded else None,
            )
            decision = decide(SPEC, inputs)
            history = history.recommended("d", sample.at_s, decision.recommended)
            looks.append(Look(sample.at_s - start, replicas, decision))
    return looks


# When the recorded input's burst began and ended, in seconds since the series began (the
# schedule of ``bench/autoscale.py``: 180 s of 1x, then 120 s of 6x).
BURST = (180.0, 300.0)

needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="no recorded series")


@needs_data
def test_at_the_minimum_the_burst_is_answered_and_the_calm_is_left_alone() -> None:
    looks = replay(series("fixed-min"))
    begins, _ = BURST
    calm = [look for look in looks if look.t < begins]
    assert calm and not any(look.decision.rescales for look in calm), calm
    ups = [look for look in looks if look.decision.action is Action.SCALE_UP]
    assert ups, [(look.t, look.decision.reason) for look in looks]
    assert ups[0].t - begins < 60, ups[0]
    assert 3 <= ups[0].decision.target <= AUTOSCALER["maxReplicas"], ups[0]


@needs_data
def test_at_the_maximum_calm_scales_down_after_its_window_and_the_burst_never() -> None:
    looks = replay(series("fixed-max"))
    begins, ends = BURST
    during = [look for look in looks if begins + 30 <= look.t < ends + 30]
    assert during and not any(look.decision.rescales for look in during), during
    downs = [look for look in looks if look.decision.action is Action.SCALE_DOWN]
    assert downs and all(look.decision.target < 6 for look in downs)
    # The first comes once the window's worth of calm recommendations is in.
    assert downs[0].t >= SPEC.cooldown_seconds + SPEC.scale_down_stabilization_seconds
    assert not any(look.decision.action is Action.SCALE_UP for look in looks)


@needs_data
def test_the_operators_own_run_never_decides_against_the_input() -> None:
    looks = replay(series("autoscaled"))
    begins, ends = BURST
    for look in looks:
        if look.decision.action is Action.SCALE_DOWN:
            assert not begins + 30 < look.t < ends, look
        if look.decision.action is Action.SCALE_UP:
            assert look.t > begins, look


@needs_data
def test_a_recorded_scale_up_that_did_not_help_is_ineffective() -> None:
    rows = series("cpu-bound")
    at = {r: max((s for p, s in deployments(rows) if p == r), key=len) for r in (4, 8)}
    m_before = metrics_over(at[4], SPEC.metrics_window_seconds)
    m_after = metrics_over(at[8], SPEC.metrics_window_seconds)
    assert m_before is not None and m_after is not None
    assert m_before.capacity is not None and m_after.capacity is not None
    # The prediction a scale-up 4 -> 8 made (60 key-groups: 15 -> 8 for the busiest).
    expected = m_before.capacity * busiest_share(4, 60) / busiest_share(8, 60)
    record = RescaleRecord("t", "d1", 4, 8, m_before.capacity, expected, m_after.capacity)
    assert record.effectiveness is not None and record.effectiveness < 0.1, (
        m_before.capacity,
        m_after.capacity,
    )
    history = AutoscalerStatus().rescaled(record)
    assert history.ceiling() == 8
