"""The autoscaler's decision: from a window of the job's metrics, the parallelism that keeps
up with the input at the least replicas, and whether to move to it now. Pure: the inputs
are values (recorded series replay through it in the unit tests), the answer a
:class:`Decision` that says why.

The model (after Flink's autoscaler, FLIP-271, on Stator's metrics):

1. **What the job must read.** The input rate, plus the backlog spread over
   ``catchUpSeconds``. At the running parallelism the backlog is the lag now; at another it
   is the backlog the rescale leaves when its new parallelism starts: the lag, what the
   input adds beyond what the running parallelism reads during the rescale's *lead* (from
   the decision to the running job's stop: a pre-started driver's start, tens of seconds on
   a loaded machine, while the running job goes on), and the input of its *downtime* (the
   job is stopped). A parallelism that could not read that within the catch-up time is not
   enough: sized for the lag at the decision, a scale-up in a burst arrives to a backlog
   it cannot read and a second one follows.
2. **What q replicas can read.** The capacity measured at the current p (source records per
   second of the busiest subtask's busy time), times how much less the busiest subtask
   holds at q: with keys spread evenly over key-groups, its share is ceil(M / q) / M of
   them. A q that leaves the busiest subtask as many key-groups as a smaller q does is never
   chosen (the smaller is as fast); so values that spread key-groups evenly win. Scaling up
   is corrected by how earlier scale-ups did (``correction``: the part of the predicted
   gain they delivered); scaling down is taken as linear (the safe side).
3. **Recommend** the least q in [minReplicas, maxReplicas] (and never above maxParallelism
   or a parallelism whose scale-up did not help) whose capacity at ``targetUtilization``
   covers 1.
4. **Stabilize.** Apply the lowest recommendation of the last
   ``scaleUpStabilizationSeconds`` to go up and the highest of the last
   ``scaleDownStabilizationSeconds`` to go down, once recommendations span that long (the
   Kubernetes HPA's rule): a spike or a lull shorter than the window moves nothing. One
   step multiplies or divides replicas by at most ``maxScaleFactor``.
5. **Only if it pays off.** A scale-up stops the job for the rescale's downtime, after its
   lead, so it goes ahead only if the job cannot read its backlog within the catch-up time
   as it is, and the rescale gets it there sooner. A scale-down goes ahead only at a
   parallelism that reads the backlog its own downtime builds within the catch-up time
   (step 1 sizes for that), and only if the replica-seconds it saves over its
   stabilization window outweigh those the job spends stopped for it (so 8 -> 7 waits;
   8 -> 2 does not).

Scaling up is triggered by lag and scaling down by utilization, so a parallelism chosen in
one direction does not at once recommend the other: the hysteresis that keeps it from
flapping."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from ..pipeline_spec import AutoscalerSpec
from .samples import WindowMetrics


class Action(StrEnum):
    SCALE_UP = "scale-up"
    SCALE_DOWN = "scale-down"
    HOLD = "hold"  # decided: the parallelism stays
    WAIT = "wait"  # not decided: no metrics yet, a cool-down, a flow in flight


@dataclass(frozen=True)
class Inputs:
    """What one decision reads besides the spec."""

    now_s: float
    replicas: int  # the running parallelism
    max_parallelism: int
    metrics: WindowMetrics | None  # None: no full window yet
    downtime_s: float  # a rescale's expected downtime (measured: ``history.downtime_s``)
    # A rescale's expected lead: from the decision to the running job's stop, while the
    # running parallelism goes on (measured: ``history.lead_s``).
    lead_s: float = 0.0
    correction: float = 1.0  # the part of a scale-up's predicted gain it delivers
    # The capacity last measured under load (the busiest subtask at least ``LOADED`` busy),
    # taken to the running parallelism: what a lightly loaded window's busy time, most of
    # it an epoch's fixed cost per task, understates.
    loaded_capacity: float | None = None
    ceiling: int | None = None  # a scale-up to above this did not help
    # This deployment's earlier recommendations as change points (time, replicas), oldest
    # first: each held until the next.
    recommendations: tuple[tuple[float, int], ...] = ()


@dataclass(frozen=True)
class Decision:
    action: Action
    replicas: int  # the running parallelism
    target: int  # what it moves to (the running parallelism unless scaling)
    recommended: int | None  # this evaluation's recommendation, before stabilizing
    reason: str
    expected_capacity: float | None = None  # at ``target``, records/s (a rescale's promise)
    # A recommendation stable over its window that step 5 held back (it would not pay off).
    held_back: bool = False

    @property
    def rescales(self) -> bool:
        return self.action in (Action.SCALE_UP, Action.SCALE_DOWN)


def busiest_share(q: int, max_parallelism: int) -> float:
    """The share of key-groups the busiest of q subtasks holds."""
    return math.ceil(max_parallelism / q) / max_parallelism


# A window whose busiest subtask was busier than this measures capacity as it is under load.
LOADED = 0.4


def rescaled_capacity(capacity: float, p: int, q: int, max_parallelism: int) -> float:
    """A capacity measured at p replicas, taken to q by the busiest subtask's share."""
    return capacity * busiest_share(p, max_parallelism) / busiest_share(q, max_parallelism)


def capacity_at(q: int, inp: Inputs) -> float:
    """The records/s q replicas can read, predicted from what p replicas did (or, in a
    lightly loaded window, from the last measure under load if it says more)."""
    m = inp.metrics
    measured = m.capacity if m else None
    assert m is not None and measured is not None
    if m.utilization < LOADED and inp.loaded_capacity is not None:
        measured = max(measured, inp.loaded_capacity)
    gain = busiest_share(inp.replicas, inp.max_parallelism) / busiest_share(q, inp.max_parallelism)
    if q > inp.replicas:
        gain = 1 + inp.correction * (gain - 1)
    return measured * gain


def required_rate(spec: AutoscalerSpec, inp: Inputs, rescaled: bool = True) -> float:
    """Step 1: the input rate plus the backlog spread over the catch-up time: the lag, or
    (``rescaled``: at another parallelism than the running one) the backlog the rescale
    leaves."""
    m = inp.metrics
    assert m is not None
    backlog = rescale_backlog(inp) if rescaled else m.lag_records
    return m.input_rate + backlog / spec.catch_up_seconds


def rescale_backlog(inp: Inputs) -> float:
    """The backlog when a rescale decided now has its new parallelism running: the lag and
    what the input adds beyond what the running parallelism reads during the lead (never
    below nothing: a job that reads more than its input catches up meanwhile), then the
    input of the downtime."""
    m = inp.metrics
    assert m is not None
    has = capacity_at(inp.replicas, inp) if m.capacity is not None else m.processed_rate
    after_lead = max(0.0, m.lag_records + (m.input_rate - has) * inp.lead_s)
    return after_lead + m.input_rate * inp.downtime_s


def bounds(spec: AutoscalerSpec, inp: Inputs) -> tuple[int, int]:
    high = min(spec.max_replicas or inp.max_parallelism, inp.max_parallelism)
    if inp.ceiling is not None:
        high = min(high, max(inp.ceiling, inp.replicas))
    low = min(spec.min_replicas, high)
    return low, high


def recommend(spec: AutoscalerSpec, inp: Inputs) -> tuple[int, str]:
    """Steps 2 and 3: the least parallelism that reads what the job must at the target
    utilization, and how it was found."""
    low, high = bounds(spec, inp)
    m = inp.metrics
    assert m is not None
    if m.capacity is None:
        if m.lag_records == 0:
            return low, "idle: the keyed subtasks were hardly busy and nothing is behind"
        return inp.replicas, "no measure of capacity (hardly busy) with a lag: keeps"
    target = spec.target_utilization
    for q in range(low, high + 1):
        need = required_rate(spec, inp, rescaled=q != inp.replicas)
        if capacity_at(q, inp) * target >= need:
            return q, f"{q} read {need:.0f} records/s at {target:.0%} busy"
    need = required_rate(spec, inp, rescaled=high != inp.replicas)
    return high, f"even {high} (the most allowed) read under {need:.0f} records/s at {target:.0%}"


def decide(spec: AutoscalerSpec, inp: Inputs) -> Decision:
    """Steps 3 to 5 for one evaluation."""
    p = inp.replicas
    low, high = bounds(spec, inp)
    if p < low or p > high:  # set by hand, or the bounds changed: into them, at once
        target = max(low, min(p, high))
        return _rescale(inp, target, None, f"replicas {p} outside [{low}, {high}]")
    if inp.metrics is None:
        return _hold(inp, None, "collecting metrics", Action.WAIT)
    q, why = recommend(spec, inp)
    return _hold(inp, q, why) if q == p else _stabilized(spec, inp, q, why)


def _stabilized(spec: AutoscalerSpec, inp: Inputs, q: int, why: str) -> Decision:
    """Step 4: the recommendation applied once the window's agree on a direction."""
    p = inp.replicas
    up = q > p
    window = spec.scale_up_stabilization_seconds if up else spec.scale_down_stabilization_seconds
    recs = (*inp.recommendations, (inp.now_s, q))
    start = inp.now_s - window
    if recs[0][0] > start:  # the recommendations do not span the window yet
        return _hold(inp, q, f"{q} recommended ({why}), not yet for {window} s")
    # Change points: each holds until the next, so the one in force at the window's start
    # counts too.
    at_start = max(i for i, (t, _) in enumerate(recs) if t <= start)
    seen = [r for _, r in recs[at_start:]]
    if up and min(seen) > p:
        return _scale_up(spec, inp, min(*seen, math.ceil(p * spec.max_scale_factor)), q, why)
    if not up and max(seen) < p:
        low, _ = bounds(spec, inp)
        return _scale_down(spec, inp, max(*seen, math.ceil(p / spec.max_scale_factor), low), q, why)
    return _hold(inp, q, f"{q} recommended ({why}), not throughout the last {window} s")


def _scale_up(spec: AutoscalerSpec, inp: Inputs, target: int, q: int, why: str) -> Decision:
    """Step 5 for a scale-up: only if the backlog is not read in time as it is, and the
    rescale reads it sooner despite its downtime."""
    m = inp.metrics
    assert m is not None and m.capacity is not None  # an idle job never recommends more
    has = capacity_at(inp.replicas, inp)  # as step 2 reads it: under load, if lightly loaded
    now = _caught_up_s(m.lag_records, has, m.input_rate)
    if now <= spec.catch_up_seconds:
        return _held_back(
            inp,
            q,
            f"{q} recommended ({why}), but the lag of {m.lag_records} records "
            f"is read in {now:.0f} s at {inp.replicas} (catch-up {spec.catch_up_seconds} s)",
        )
    gets = capacity_at(target, inp)
    then = inp.lead_s + inp.downtime_s + _caught_up_s(rescale_backlog(inp), gets, m.input_rate)
    # Never caught up either way: a rescale still pays off if it falls behind more slowly.
    slower = math.isinf(then) and gets > has
    if then >= now and not slower:
        return _held_back(
            inp,
            q,
            f"{q} recommended ({why}), but after a rescale's {inp.lead_s:.0f} s lead and "
            f"{inp.downtime_s:.0f} s of downtime the job would not catch up sooner "
            f"({_s(then)} against {_s(now)})",
        )
    return _rescale(
        inp,
        target,
        q,
        f"{why}; behind: caught up in {_s(now)} as it is, {_s(then)} after the rescale",
    )


def _scale_down(spec: AutoscalerSpec, inp: Inputs, target: int, q: int, why: str) -> Decision:
    """Step 5 for a scale-down: the replica-seconds it saves over the window that asked for
    it must outweigh those the job spends stopped for it."""
    p, window = inp.replicas, spec.scale_down_stabilization_seconds
    saved, spent = (p - target) * window, p * inp.downtime_s
    if saved < spent:
        return _held_back(
            inp,
            q,
            f"{q} recommended ({why}), but {p} -> {target} saves {saved:.0f} "
            f"replica-seconds over {window} s against {spent:.0f} stopped for the rescale",
        )
    return _rescale(inp, target, q, why)


def _caught_up_s(backlog: float, capacity: float, input_rate: float) -> float:
    if backlog <= 0:
        return 0.0
    spare = capacity - input_rate
    return backlog / spare if spare > 0 else math.inf


def _s(seconds: float) -> str:
    return "never" if math.isinf(seconds) else f"{seconds:.0f} s"


def _rescale(inp: Inputs, target: int, q: int | None, why: str) -> Decision:
    action = Action.SCALE_UP if target > inp.replicas else Action.SCALE_DOWN
    measured = inp.metrics is not None and inp.metrics.capacity is not None
    expected = capacity_at(target, inp) if measured else None
    return Decision(action, inp.replicas, target, q, why, expected)


def _held_back(inp: Inputs, q: int, why: str) -> Decision:
    return Decision(Action.HOLD, inp.replicas, inp.replicas, q, why, held_back=True)


def _hold(inp: Inputs, q: int | None, why: str, action: Action = Action.HOLD) -> Decision:
    return Decision(action, inp.replicas, inp.replicas, q, why)
