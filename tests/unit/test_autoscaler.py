"""The autoscaler's decision (``autoscaling/decision.py``) step by step, and the real
:class:`Autoscaler` in a closed loop with a simulated job (``autoscaler_plant.py``): a step
input scales up in time and back down after the stabilization window, without flapping,
noise moves nothing, a scale-up that did not help stops further ones, and a dry run only
records."""

from __future__ import annotations

import random
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from stator.control.schema import JobInfo
from stator_operator.autoscaling import autoscaler
from stator_operator.autoscaling.decision import (
    Action,
    Inputs,
    busiest_share,
    decide,
    recommend,
    rescale_backlog,
)
from stator_operator.autoscaling.history import AutoscalerStatus, RescaleRecord
from stator_operator.autoscaling.samples import MAX_AGE_S, Sample, SampleWindow, WindowMetrics
from stator_operator.operation import OpKind
from stator_operator.pipeline_spec import AutoscalerSpec, PipelineSpec, SpecError
from stator_operator.pipeline_status import LastOperation
from tests.unit.autoscaler_plant import Plant
from tests.unit.operator_fakes import Bed

SPEC = AutoscalerSpec(
    enabled=True,
    catch_up_seconds=60,
    metrics_window_seconds=30,
    scale_up_stabilization_seconds=10,
    scale_down_stabilization_seconds=60,
    cooldown_seconds=20,
    max_scale_factor=8,
    max_replicas=8,
)
# The closed loop's spec.autoscaler (as SPEC) and its job: one subtask reads 250 records/s.
LOOP = {
    "catchUpSeconds": 60,
    "metricsWindowSeconds": 30,
    "scaleUpStabilizationSeconds": 10,
    "scaleDownStabilizationSeconds": 60,
    "cooldownSeconds": 20,
    "maxScaleFactor": 8,
    "maxReplicas": 8,
}
PER_SUBTASK = 250.0
SPEC_RAW: dict[str, Any] = {  # a pipeline's spec, its driver left to each test
    "image": "i",
    "entrypoint": "m:f",
    "checkpointing": {"storage": "file:///ck"},
}


@pytest.fixture(autouse=True)
def _no_samples_of_other_tests() -> None:
    """The operator keeps samples per pipeline in memory: each test starts without."""
    autoscaler.forget("team", "counts")
    autoscaler.forget("ns", "p")


BASE = 100.0  # 1x: 40% of one subtask


def metrics(
    input_rate: float, capacity: float | None, lag: int = 0, span: float = 30.0
) -> WindowMetrics:
    busy = 0.0 if capacity is None else input_rate * span / capacity
    return WindowMetrics(
        span_s=span,
        input_rate=input_rate,
        processed_rate=input_rate,
        lag_records=lag,
        busiest_busy_s=busy,
        capacity=capacity,
        busiest="count/0",
    )


def inputs(replicas: int, m: WindowMetrics | None, **kw: Any) -> Inputs:
    defaults: dict[str, Any] = {
        "now_s": 1000.0,
        "replicas": replicas,
        "max_parallelism": 60,
        "metrics": m,
        "downtime_s": 30.0,
    }
    return Inputs(**{**defaults, **kw})


# ---------------------------------------------------------------------------- samples


def test_window_rates_come_from_counters_and_the_busiest_subtask() -> None:
    first = Sample(0.0, 1000, 500, {"count": (1000, 4000), "pinned": ()})
    last = Sample(10.0, 3000, 1500, {"count": (2000, 9000), "pinned": ()})
    m = WindowMetrics.over(first, last)
    # 2000 read, the lag grew by 1000: 300 records/s arrived; subtask 1 was busy 5 of 10 s.
    assert (m.input_rate, m.processed_rate, m.lag_records) == (300.0, 200.0, 1500)
    assert (m.busiest, m.busiest_busy_s, m.utilization) == ("count/1", 5.0, 0.5)
    assert m.capacity == 400.0  # 2000 records while the busiest was busy 5 s
    assert set(m.to_json()) == set(WindowMetrics.JSON_KEYS)


def test_a_restarted_driver_starts_the_window_afresh() -> None:
    window = SampleWindow("d1", keep_s=60)
    window.add(Sample(0.0, 1000, 0, {"count": (5000,)}))
    window.add(Sample(40.0, 9000, 0, {"count": (9000,)}))
    assert window.metrics(30) is not None
    window.add(Sample(42.0, 10, 0, {"count": (100,)}))  # counters began again
    assert len(window.samples) == 1 and window.metrics(30) is None


def test_a_window_needs_its_span_and_keeps_only_what_it_needs() -> None:
    window = SampleWindow("d1", keep_s=40)
    for t in range(0, 100, 2):
        window.add(Sample(float(t), t * 10, 0, {"count": (t * 20,)}))
        if t < 30:
            assert window.metrics(30) is None
    assert window.samples[0].at_s >= 98 - 40 - 2
    m = window.metrics(30)
    assert m is not None and m.span_s == 30 and m.input_rate == 10.0


def test_a_sample_is_timed_when_its_lag_was_measured() -> None:
    job = JobInfo(epoch=3, records_in=900, lag_records=40, lag_at_ms=95_000)
    assert Sample.of(job, 100.0).at_s == 95.0
    assert Sample.of(replace(job, lag_at_ms=None), 100.0).at_s == 100.0  # an older driver
    # A driver's word is bounded: never after the look, at most MAX_AGE_S before it.
    assert Sample.of(replace(job, lag_at_ms=200_000), 100.0).at_s == 100.0
    assert Sample.of(replace(job, lag_at_ms=0), 1000.0).at_s == 1000.0 - MAX_AGE_S
    # Two looks during one epoch: nothing new measured, one sample.
    window = SampleWindow("d1", keep_s=60)
    window.add(Sample.of(job, 100.0))
    window.add(Sample.of(job, 102.0))
    assert len(window.samples) == 1


def _step_looks(timed: bool) -> dict[float, float]:
    """A job at 1 replica (250 records/s) whose input steps from 100 to 600 records/s at
    60 s: its driver plans an epoch of at most 3,000 records when the last ends, measuring
    the lag then (the epochs grow to 12 s); the operator looks every 2 s. The window's
    input rate (20 s) at each look from 60 s to 100 s."""
    window, rates = SampleWindow("d1", keep_s=60), {}
    arrived = 0.0
    records_in = lag = planned = 0
    planned_at = epoch_end = 0.0
    for tick in range(1, 1001):  # 0.1 s each
        t = tick / 10
        arrived += (600 if t > 60 else 100) / 10
        if t >= epoch_end:  # the epoch ends; the next is planned
            records_in += planned
            planned_at, lag = t, int(arrived) - records_in
            planned = min(lag, 3000)
            epoch_end = t + max(1.0, planned / 250)
        if tick % 20 == 0:
            at_ms = int(planned_at * 1000) if timed else None
            job = JobInfo(epoch=1, records_in=records_in, lag_records=lag, lag_at_ms=at_ms)
            window.add(Sample.of(job, t))
            m = window.metrics(20)
            if m is not None and t >= 60:
                rates[t] = m.input_rate
    return rates


def test_a_step_in_the_input_reads_as_the_step_however_long_the_epochs() -> None:
    """Timed at the look, a sample during a 12-s epoch carries the lag of its start: the
    window's rate swung from a half to 1.2x of the step's (the e2e test's first scale-up
    saw 318 of 600 records/s). Timed at the measurement it reads the step from 10 s on."""
    timed, at_look = _step_looks(True), _step_looks(False)
    late = [t for t in timed if t >= 70]
    assert all(0.9 * 600 <= timed[t] <= 600 * 1.01 for t in late), timed
    assert min(at_look[t] for t in late) < 0.5 * 600, at_look
    assert max(at_look[t] for t in late) > 1.1 * 600, at_look


def test_samples_read_only_the_operators_that_follow_replicas() -> None:
    plant = Plant(LOOP, replicas=2, rate_per_subtask=PER_SUBTASK)
    job = plant.job()
    sample = Sample.of(job, 5.0)
    assert set(sample.busy_ms) == {"count"} and len(sample.busy_ms["count"]) == 2
    assert Sample.from_json(sample.to_json()) == sample


# ---------------------------------------------------------------------------- decision


def test_the_least_parallelism_that_keeps_up_at_the_target_utilization() -> None:
    # 1 replica reads 250/s at most; 600/s arriving (no lag): at 70% busy that takes 4 (the
    # downtime's 30 s of input spread over 60 s adds 300/s: 900 / (0.7 * 250) = 5.1 -> 6).
    q, why = recommend(SPEC, inputs(1, metrics(600, 250)))
    assert q == 6, why
    # Staying costs no downtime: 150/s at 1 replica is 60% busy and stays.
    assert recommend(SPEC, inputs(1, metrics(150, 250)))[0] == 1


def test_key_groups_spread_evenly_win() -> None:
    """With 60 key-groups, 7 subtasks leave the busiest 9, as 8 do not (8); 9 to 11 leave 6 or
    7 like 10 (6): a parallelism never exceeds the least with the same busiest share."""
    assert busiest_share(7, 60) == 9 / 60 and busiest_share(8, 60) == 8 / 60
    chosen = set()
    for rate in range(100, 2000, 25):
        q, _ = recommend(SPEC, inputs(1, metrics(rate, 250)))
        chosen.add(q)
    for q in chosen:
        assert not any(busiest_share(s, 60) == busiest_share(q, 60) for s in range(1, q)), q


def test_bounds_max_parallelism_and_a_ceiling() -> None:
    assert recommend(SPEC, inputs(1, metrics(10_000, 250)))[0] == 8  # maxReplicas
    assert recommend(SPEC, inputs(1, metrics(10_000, 250), max_parallelism=4))[0] == 4
    assert recommend(SPEC, inputs(2, metrics(10_000, 500), ceiling=3))[0] == 3
    # Replicas outside the bounds (set by hand) move into them at once.
    d = decide(SPEC, inputs(12, None))
    assert (d.action, d.target) == (Action.SCALE_DOWN, 8)


def test_no_metrics_waits_and_an_idle_job_goes_to_the_minimum() -> None:
    assert decide(SPEC, inputs(4, None)).action is Action.WAIT
    q, why = recommend(SPEC, inputs(4, metrics(0, None)))
    assert q == 1 and "idle" in why
    # Hardly busy but behind: no estimate, so it stays.
    assert recommend(SPEC, inputs(4, metrics(5, None, lag=100)))[0] == 4


def test_a_scale_up_waits_for_its_stabilization_window_and_takes_its_lowest() -> None:
    behind = metrics(1000, 250, lag=20_000)
    first = decide(SPEC, inputs(1, behind, now_s=1000.0))
    assert first.action is Action.HOLD and "not yet for 10 s" in first.reason
    later = decide(SPEC, inputs(1, behind, now_s=1010.0, recommendations=((995.0, 5),)))
    assert (later.action, later.target) == (Action.SCALE_UP, 5)  # 8 now, 5 in the window
    assert later.expected_capacity == pytest.approx(250 * 60 / 12)


def test_one_step_multiplies_replicas_by_at_most_the_factor() -> None:
    spec = AutoscalerSpec(**{**SPEC.__dict__, "max_scale_factor": 2.0})
    behind = metrics(1000, 250, lag=20_000)
    d = decide(spec, inputs(1, behind, recommendations=((900.0, 8),)))
    assert (d.action, d.target) == (Action.SCALE_UP, 2)


def test_a_scale_up_that_would_not_pay_off_is_held_back() -> None:
    # A lag the job reads within the catch-up time as it is: no rescale for it.
    clearing = metrics(150, 250, lag=4000)  # 100/s spare: 40 s
    d = decide(SPEC, inputs(1, clearing, recommendations=((900.0, 2),)))
    assert d.action is Action.HOLD and d.held_back and "is read in 40 s" in d.reason
    # Behind, but a rescale's downtime longer than catching up at once would take.
    slow = metrics(200, 250, lag=4000)  # 80 s as it is
    d = decide(SPEC, inputs(1, slow, downtime_s=120.0, recommendations=((900.0, 2),)))
    assert d.held_back and "would not catch up sooner" in d.reason


def test_a_rescale_is_sized_for_the_backlog_its_lead_builds() -> None:
    """From the decision to the running job's stop (a pre-started driver's start) the input
    goes on outrunning the running parallelism: sized for the lag at the decision, the new
    parallelism arrives to more than it can read in the catch-up time."""
    spec = replace(SPEC, catch_up_seconds=30, max_replicas=6)
    burst = metrics(322.5, 233.5, lag=3420)  # the e2e test's first decision
    at_once = inputs(1, burst, downtime_s=8.0)
    assert rescale_backlog(at_once) == pytest.approx(3420 + 322.5 * 8)
    assert recommend(spec, at_once)[0] == 4
    led = inputs(1, burst, downtime_s=8.0, lead_s=60.0)
    assert rescale_backlog(led) == pytest.approx(3420 + (322.5 - 233.5) * 60 + 322.5 * 8)
    assert recommend(spec, led)[0] == 5
    # A job that reads more than its input catches up during the lead: its downtime's input
    # is all that is left.
    clearing = inputs(1, metrics(100, 250, lag=3000), downtime_s=8.0, lead_s=60.0)
    assert rescale_backlog(clearing) == pytest.approx(100 * 8)
    # The lead delays what a scale-up gains: not worth it where the lag is read by then.
    slow = metrics(200, 250, lag=4000)  # read in 80 s as it is
    d = decide(SPEC, inputs(1, slow, downtime_s=5.0, recommendations=((900.0, 2),)))
    assert d.action is Action.SCALE_UP, d
    d = decide(SPEC, inputs(1, slow, downtime_s=5.0, lead_s=80.0, recommendations=((900.0, 2),)))
    assert d.held_back and "80 s lead" in d.reason, d


def test_a_scale_down_waits_for_its_window_takes_its_highest_and_must_pay_off() -> None:
    quiet = metrics(100, 2000)  # 8 replicas, 5% busy
    early = decide(SPEC, inputs(8, quiet, recommendations=((990.0, 1),)))
    assert early.action is Action.HOLD and "not yet for 60 s" in early.reason
    d = decide(SPEC, inputs(8, quiet, recommendations=((900.0, 3), (950.0, 1))))
    assert (d.action, d.target) == (Action.SCALE_DOWN, 3)
    # 8 -> 7 saves 60 replica-seconds over the window against 240 stopped for it.
    busy = metrics(700, 2000)
    d = decide(SPEC, inputs(8, busy, recommendations=((900.0, 7),)))
    assert d.held_back and "saves 60 replica-seconds" in d.reason


def test_history_corrects_estimates_and_measures_downtime() -> None:
    history = AutoscalerStatus()
    assert history.correction() == 1.0 and history.downtime_s(None) == 30.0
    assert history.downtime_s(12.0) == 12.0
    helped = RescaleRecord("t", "d1", 1, 4, 250.0, 1000.0, 700.0, 20.0)
    assert helped.effectiveness == pytest.approx(0.6)
    history = history.rescaled(helped)
    assert history.correction() == pytest.approx(0.6) and history.downtime_s(None) == 20.0
    assert history.ceiling() is None
    futile = RescaleRecord("t", "d2", 4, 8, 700.0, 1400.0, 720.0, 40.0)
    history = history.rescaled(futile)
    assert history.ceiling() == 8
    # A corrected prediction asks for more replicas than a linear one.
    m = metrics(600, 250)
    linear = recommend(SPEC, inputs(1, m))[0]
    assert recommend(SPEC, inputs(1, m, correction=0.6))[0] > linear
    restored = AutoscalerStatus.from_dict(history.to_dict())
    assert restored.rescales == history.rescales
    # The lead: the median of the last three measured, else the estimate given.
    assert history.lead_s(25.0) == 25.0
    led = [replace(futile, lead_seconds=s) for s in (40.0, 70.0, 50.0, 90.0)]
    for record in led:
        history = history.rescaled(record)
    assert history.lead_s(25.0) == 70.0
    assert AutoscalerStatus.from_dict(history.to_dict()).lead_s(0.0) == 70.0


def test_a_flow_s_lead_runs_from_its_start_to_the_old_driver_s_stop() -> None:
    raw = {"kind": "rescale", "id": "d2", "readyAtMs": 100_000, "totalSeconds": 70.0}
    assert LastOperation.from_dict(raw).lead_seconds is None  # type: ignore[union-attr]
    stopped = LastOperation.from_dict({**raw, "processingStoppedAtMs": 85_000})
    assert stopped is not None and stopped.lead_seconds == 55.0  # began at 30 s
    running = PipelineSpec.read({**SPEC_RAW, "driver": {"prestart": True}})
    assert autoscaler.lead_estimate(running, stopped) == 55.0
    deployed = LastOperation.from_dict({**raw, "kind": "deploy"})
    assert autoscaler.lead_estimate(running, deployed) == 70.0  # a pre-start waits as long
    at_once = PipelineSpec.read({**SPEC_RAW, "driver": {"prestart": False}})
    assert autoscaler.lead_estimate(at_once, deployed) == 0.0
    assert autoscaler.lead_estimate(running, None) == 0.0


def test_status_entries_of_the_wrong_shape_read_as_absent() -> None:
    raw = {
        "decisions": [{"action": "hold"}, "x", {"action": "hold", "replicas": 2, "target": 2}],
        "recommendations": [[1.0, 2], ["a", 3], [2.0, True]],
        "rescales": [{"fromReplicas": "2"}],
        "deployment": 7,
    }
    status = AutoscalerStatus.from_dict(raw)
    assert len(status.decisions) == 1 and status.recommendations == ((1.0, 2),)
    assert status.rescales == () and AutoscalerStatus.from_dict("junk") == AutoscalerStatus()


# ---------------------------------------------------------------------------- the spec


@pytest.mark.parametrize(
    ("autoscaler", "extra", "names"),
    [
        ({"minReplicas": 5, "maxReplicas": 3}, {}, "spec.autoscaler.minReplicas (5)"),
        ({"maxReplicas": 200}, {"maxParallelism": 128}, "spec.autoscaler.maxReplicas (200)"),
        ({}, {"executor": {"instances": 3}}, "spec.executor.instances"),
        ({"targetUtilization": 1.5}, {}, "spec.autoscaler.targetUtilization"),
        ({"maxScaleFactor": 1.0}, {}, "spec.autoscaler.maxScaleFactor"),
        (
            {"minReplicas": 1},
            {"executor": {}, "localRecovery": {"standby": True}},
            "spec.localRecovery.standby",
        ),
    ],
)
def test_a_wrong_autoscaler_spec_is_refused_naming_the_field(
    autoscaler: dict[str, Any], extra: dict[str, Any], names: str
) -> None:
    raw = {
        "image": "i",
        "entrypoint": "m:f",
        "checkpointing": {"storage": "file:///ck"},
        "autoscaler": {"enabled": True, **autoscaler},
        **extra,
    }
    with pytest.raises(SpecError, match=names.replace("(", r"\(").replace(")", r"\)")):
        PipelineSpec.parse(raw)
    raw["autoscaler"]["enabled"] = False  # checked only when it is on
    if "executor" not in extra or "instances" in extra.get("executor", {}):
        PipelineSpec.parse(raw)


# ---------------------------------------------------------------------------- closed loop


def step_input(t: float) -> float:
    """1x for 200 s, 6x for 400 s, then 1x."""
    return BASE * 6 if 200 <= t < 600 else BASE


def test_a_step_input_scales_up_in_time_and_back_down_without_flapping() -> None:
    plant = Plant(LOOP, replicas=1, rate_per_subtask=PER_SUBTASK)
    plant.run(1200, step_input)
    steps = plant.replicas_over_time()
    # Up once or twice, then down: never up again after a scale-down.
    peak = steps.index(max(steps))
    assert steps[: peak + 1] == sorted(steps[: peak + 1]), steps
    assert steps[peak:] == sorted(steps[peak:], reverse=True), steps
    assert steps[0] == 1 and steps[-1] == 1 and max(steps) >= 3, steps
    first_up = next(t for t, r, _ in plant.history if r > 1)
    assert first_up - 200 < 60, "the step is answered within a minute"
    # The lag is back under a tenth of what one second of input brings within 3 minutes.
    behind = [t for t, _, lag in plant.history if 200 <= t < 600 and lag > BASE * 6 / 10]
    assert behind and max(behind) - 200 < 180, max(behind)
    # Down only after the input fell and the scale-down window passed, in at most two steps
    # (the first window may straddle the drop), each a rescale, its cool-down, a metrics
    # window and a stabilization window (140 s here).
    down = [
        t
        for (t, r, _), (_, before, _) in zip(plant.history[1:], plant.history[:-1], strict=True)
        if r < before
    ]
    assert min(down) >= 600 + LOOP["scaleDownStabilizationSeconds"], down
    cycle = 30 + LOOP["cooldownSeconds"] + LOOP["metricsWindowSeconds"]
    cycle += LOOP["scaleDownStabilizationSeconds"]
    assert len(down) <= 2 and max(down) - 600 < 2 * cycle + 20, down
    status = plant.status
    assert status["last"]["action"] == "hold" and status["last"]["replicas"] == 1
    assert any(e[0] == "Autoscaled" for e in plant.events)
    assert all(r["effectiveness"] in (None, 1.0) for r in status["rescales"]), status


def test_a_rescale_is_measured_after_its_new_drivers_first_epoch() -> None:
    """A new driver whose first epoch ends long after it is ready (a large restore): the
    cool-down and the measuring window start at that first epoch, so every rescale records
    its downtime (known from then) and the capacity of a driver that processes."""
    plant = Plant(LOOP, replicas=1, rate_per_subtask=PER_SUBTASK, first_epoch_s=60.0)
    plant.run(1200, step_input)
    # One scale-up, 1 -> 5; no scale-down: 90 s stopped outweighs what 5 -> 1 saves.
    (rescale,) = plant.status["rescales"]
    assert rescale["downtimeSeconds"] == 30.0 + 60.0, rescale
    assert rescale["observedCapacity"] == 5 * PER_SUBTASK and rescale["effectiveness"] == 1
    waiting = [d for d in plant.status["decisions"] if "first epoch" in d["reason"]]
    assert waiting and all(d["action"] == "wait" for d in waiting), plant.status["decisions"]


def test_a_driver_with_nothing_to_read_is_processing() -> None:
    """The input ends; a scale-down brings up a driver that never runs an epoch (nothing to
    read): it counts as processing from when it found its input empty (``caught_up_ms``),
    so the next decisions take it down to the minimum, each rescale with its downtime."""
    plant = Plant(
        {**LOOP, "maxScaleFactor": 2}, replicas=1, rate_per_subtask=PER_SUBTASK, downtime_s=10
    )
    plant.run(1400, lambda t: step_input(t) if t < 600 else 0.0)
    assert plant.replicas_over_time() == [1, 2, 4, 2, 1]
    rescales = plant.status["rescales"]
    assert [r["downtimeSeconds"] for r in rescales] == [10.0] * 4, rescales
    assert plant.status["last"]["action"] == "hold", plant.status["last"]


def test_a_driver_idle_before_its_input_arrives_keeps_its_window() -> None:
    """Processing began when the driver first found nothing to read: its first epoch, when
    input arrives, does not start the cool-down and the window again."""
    plant = Plant(LOOP, replicas=1, rate_per_subtask=PER_SUBTASK)
    plant.run(200, lambda t: 0.0 if t < 60 else BASE)
    actions = [d["action"] for d in plant.status["decisions"]]
    assert "hold" in actions and "wait" not in actions[actions.index("hold") :], actions


def test_a_rescale_s_lead_is_measured_and_the_scale_up_sizes_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rescales whose pre-started driver takes a minute to start while the old one goes on
    (as on the 2-core test bed): the first decision reads the lead from the first
    deployment's start, the rescales record theirs, and a burst's scale-up sizes for the
    backlog the minute builds, so the lag is back sooner than when sized for the lag at the
    decision."""
    fast = {**LOOP, "catchUpSeconds": 30, "metricsWindowSeconds": 20}
    fast |= {"scaleUpStabilizationSeconds": 0, "cooldownSeconds": 15}

    def run() -> tuple[Plant, float]:
        plant = Plant(fast, replicas=1, rate_per_subtask=PER_SUBTASK, lead_s=60, downtime_s=8)
        plant.body["status"]["lastOperation"] = {  # the first deployment: 60 s to ready
            "kind": "deploy",
            "id": "d1",
            "readyAtMs": int(plant.t * 1000),
            "totalSeconds": 60.0,
            "downtimeSeconds": 8.0,
        }
        plant.run(700, lambda t: 5 * BASE if 60 <= t < 300 else BASE)
        back = next(t for t, r, lag in plant.history if r > 1 and lag < 5 * BASE)
        return plant, back

    led, back = run()
    with monkeypatch.context() as m:
        m.setattr(AutoscalerStatus, "lead_s", lambda self, fallback: 0.0)
        at_once, back_at_once = run()
    assert led.replicas_over_time()[:2] == [1, 8], led.events
    assert at_once.replicas_over_time()[:2] == [1, 5], at_once.events
    assert back < back_at_once - 10, (back, back_at_once)
    rescales = led.status["rescales"]
    assert [r["leadSeconds"] for r in rescales] == [60.0] * len(rescales), rescales
    assert led.status["last"]["inputs"]["leadSeconds"] == 60.0


def test_noise_around_a_steady_input_moves_nothing() -> None:
    noise = random.Random(7)
    plant = Plant(LOOP, replicas=3, rate_per_subtask=PER_SUBTASK)
    plant.run(900, lambda t: BASE * 4 * noise.uniform(0.6, 1.4))
    assert plant.replicas_over_time() == [3], plant.events


def test_a_scale_up_that_did_not_help_stops_further_ones() -> None:
    """CPU-bound work on a small machine: past 400 records/s more subtasks only share the
    CPU. 1 -> 2 delivers part of its predicted gain (which corrects the next prediction),
    2 -> 4 none: it is recorded as ineffective, and no further scale-up follows however far
    behind the job is."""
    loop = {**LOOP, "maxScaleFactor": 2, "maxReplicas": 16}
    plant = Plant(loop, replicas=1, rate_per_subtask=PER_SUBTASK, ceiling_rate=400)
    plant.run(1200, lambda t: 900.0)
    assert plant.replicas_over_time() == [1, 2, 4], plant.events
    events = [e for e in plant.events if e[0] == "ScalingIneffective"]
    assert len(events) == 1 and "no scale-up past 4" in events[0][1], plant.events
    first, second = plant.status["rescales"]
    assert first["effectiveness"] == pytest.approx(0.6)
    # The second prediction was corrected by the first: 400 * (1 + 0.6 * 1).
    assert second["expectedCapacity"] == pytest.approx(640) and second["effectiveness"] == 0
    assert plant.status["last"]["inputs"]["ceiling"] == 4


def test_a_dry_run_records_decisions_and_never_rescales() -> None:
    plant = Plant({**LOOP, "dryRun": True}, replicas=1, rate_per_subtask=PER_SUBTASK)
    plant.run(600, step_input)
    assert plant.replicas_over_time() == [1]
    assert plant.body["spec"]["replicas"] == 1
    recommended = [e for e in plant.events if e[0] == "AutoscaleRecommended"]
    assert recommended and "dry run, would scale-up 1 -> " in recommended[0][1]
    assert any(d["dryRun"] for d in plant.status["decisions"])
    assert plant.status["rescales"] == []


# ---------------------------------------------------------------------------- the reconciler


def _job(seconds: int) -> dict[str, Any]:
    """A driver ``seconds`` into a burst: 1000 records/s arriving, 250/s read by its one
    subtask, busy all the time, the lag growing."""
    return {
        "job": "team.counts",
        "epoch": seconds,
        "records_in": 250 * seconds,
        "lag_records": 750 * seconds,
        "max_parallelism": 64,
        "startup": {"first_epoch_ms": int(time.time() * 1000) - 1000 * seconds},
        "graph": {"nodes": [{"id": 1, "label": "count", "kind": "process", "parallelism": 1}]},
        "metrics": {
            "operators": {
                "count": {
                    "kind": "keyed",
                    "subtasks": [{"subtask": 0, "busy_ms_total": 1000 * seconds}],
                }
            }
        },
    }


def test_the_reconciler_rescales_through_the_rescale_flow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decision patches spec.replicas (the scale subresource); the next reconcile sees
    a rescale, which takes its savepoint like a person's ``kubectl scale``."""
    bed = Bed(
        tmp_path,
        replicas=1,
        autoscaler={
            "enabled": True,
            "maxReplicas": 4,
            "maxScaleFactor": 4,
            "metricsWindowSeconds": 10,
            "scaleUpStabilizationSeconds": 0,
            "cooldownSeconds": 0,
            "catchUpSeconds": 60,
        },
    )
    driver = bed.deploy()
    now = [time.time()]
    monkeypatch.setattr(autoscaler, "clock", lambda: now[0])
    for second in range(0, 40, 2):
        driver.job_info = _job(second)
        bed.step()
        if bed.op is not None:
            break
        now[0] += 2
    op = bed.op
    assert op is not None and op.kind is OpKind.RESCALE, bed.status.get("autoscaler")
    assert bed.kube.pipeline["spec"]["replicas"] == 4
    autoscaled = [m for _, reason, m in bed.events if reason == "Autoscaled"]
    assert len(autoscaled) == 1 and autoscaled[0].startswith("scale-up 1 -> 4: "), bed.events
    status = bed.status["autoscaler"]
    assert status["rescales"][0]["fromReplicas"] == 1 and status["rescales"][0]["toReplicas"] == 4
    inputs = status["last"]["inputs"]
    assert inputs["inputRate"] == 1000.0 and inputs["capacity"] == 250.0, inputs
    assert ("Normal", "SpecChanged", "rescale (savepoint): replicas") in bed.events


def test_the_autoscaler_off_writes_nothing(tmp_path: Path) -> None:
    bed = Bed(tmp_path, replicas=1)
    driver = bed.deploy()
    for second in range(0, 30, 2):
        driver.job_info = _job(second)
        bed.step()
    assert "autoscaler" not in bed.status and bed.kube.pipeline["spec"]["replicas"] == 1


def test_a_job_whose_keyed_operators_are_all_pinned_is_left_alone(tmp_path: Path) -> None:
    bed = Bed(tmp_path, replicas=3, autoscaler={"enabled": True, "cooldownSeconds": 0})
    driver = bed.deploy()
    for second in range(0, 90, 2):
        job = _job(second)
        job["graph"]["nodes"][0]["pinned"] = True
        driver.job_info = job
        bed.step()
    assert bed.kube.pipeline["spec"]["replicas"] == 3 and bed.op is None
    last = bed.status["autoscaler"]["last"]
    assert last["action"] == "wait" and "pinned" in last["reason"], last


def test_only_a_recommendation_held_back_from_paying_off_is_announced_as_held() -> None:
    """AutoscaleHeld says a stable recommendation would not pay off; a recommendation still
    waiting out its stabilization window is only in status."""
    plant = Plant(LOOP, replicas=1, rate_per_subtask=PER_SUBTASK)
    plant.run(400, lambda t: 150.0 if t < 200 else 240.0)  # 96% busy at 1: behind, slowly
    held = [m for reason, m in plant.events if reason == "AutoscaleHeld"]
    waiting = ("not yet for", "not throughout")
    stabilizing = [d for d in plant.status["decisions"] if any(w in d["reason"] for w in waiting)]
    assert stabilizing, plant.status["decisions"]
    assert held and all("but" in m for m in held), held
    assert not any(w in m for m in held for w in waiting), held


def test_a_scale_up_reads_the_running_capacity_as_the_recommendation_does() -> None:
    """A lightly loaded window's capacity is read no lower than the last measured under
    load, also where step 5 asks how soon the lag is read as it is."""
    # 150/s arriving, 3,000 behind; the window, 10% busy, reads 160/s (light load).
    quiet = WindowMetrics(30.0, 150.0, 150.0, 3000, 3.0, 160.0, "count/0")
    d = decide(SPEC, inputs(1, quiet, loaded_capacity=250.0, recommendations=((900.0, 2),)))
    # Step 2 reads 250/s and recommends 2; at 250/s the lag is read in 30 s, within the
    # catch-up time: held (at 160/s it would have read as 300 s, and scaled up).
    assert d.recommended == 2 and d.held_back and "is read in 30 s" in d.reason, d
