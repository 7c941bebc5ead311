"""The autoscaler's step in the reconciler's steady state: sample the running job's metrics
(every look at ``/v1/job``), and every :data:`EVALUATE_EVERY_S` decide
(``decision.decide``), record the decision (``status.autoscaler``, an event when the outcome
changes) and rescale by patching ``replicas`` through the scale subresource, as
``kubectl scale`` does: the rescale flow then runs as for a person's edit (savepoint,
pre-started driver, rollback, fencing), and executors follow the new replicas.

The samples live in this process (a restarted operator collects a window afresh); what
must outlive it, the recommendations the stabilization windows read and the rescales'
measured outcomes, is in status. A driver runs its author's code: its answers are already
bounded by the schema, and whatever they say, replicas stay within the spec's
[minReplicas, maxReplicas] and maxParallelism."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from stator.control.schema import JobInfo
from stator.control.wire import Json
from stator.keygroups import MAX_MAX_PARALLELISM

from ..operation import OpKind
from ..outcomes import EventReason
from ..pipeline_spec import AutoscalerSpec, PipelineSpec
from ..pipeline_status import LastOperation, PipelineStatus
from ..ports import EventSink, ScaleApi
from ..status import StatusWriter, stamp_ms, stamp_s
from .decision import (
    LOADED,
    Action,
    Decision,
    Inputs,
    decide,
    required_rate,
    rescaled_capacity,
)
from .history import INEFFECTIVE, AutoscalerStatus, DecisionRecord, RescaleRecord
from .samples import Sample, SampleWindow, WindowMetrics, metrics_over

log = logging.getLogger("stator.autoscaler")

EVALUATE_EVERY_S = 10.0
# Wall clock seconds (status time stamps compare with it); tests replace it.
clock: Callable[[], float] = time.time

# Per pipeline (namespace, name): its running deployment's samples, and the last evaluation.
_WINDOWS: dict[tuple[str, str], SampleWindow] = {}
_EVALUATED: dict[tuple[str, str], float] = {}


def forget(namespace: str, name: str) -> None:
    """Drop a deleted pipeline's samples."""
    _WINDOWS.pop((namespace, name), None)
    _EVALUATED.pop((namespace, name), None)


@dataclass
class Autoscaler:
    pipeline: StatusWriter
    kube: ScaleApi
    event: EventSink
    key: tuple[str, str] = field(init=False)

    def __post_init__(self) -> None:
        self.key = (self.pipeline.namespace, self.pipeline.name)

    def step(self, spec: PipelineSpec, running: PipelineSpec, job: JobInfo) -> None:
        """One look at the running job: a sample, and a decision when one is due."""
        auto = spec.autoscaler
        deployment = self.pipeline.status.deployment
        if not auto.enabled or deployment is None:
            forget(*self.key)
            return
        at = clock()
        keep = auto.metrics_window_seconds + 2 * EVALUATE_EVERY_S
        window = _WINDOWS.get(self.key)
        if window is None or window.deployment != deployment.id:
            window = _WINDOWS[self.key] = SampleWindow(deployment.id, keep)
        window.keep_s = keep
        window.add(Sample.of(job, at))
        if at - _EVALUATED.get(self.key, 0.0) < EVALUATE_EVERY_S:
            return
        _EVALUATED[self.key] = at
        self._evaluate(auto, running, job, window, at)

    def _evaluate(
        self,
        auto: AutoscalerSpec,
        running: PipelineSpec,
        job: JobInfo,
        window: SampleWindow,
        at: float,
    ) -> None:
        status = self.pipeline.status
        deployment = window.deployment
        history = AutoscalerStatus.from_dict(
            (self.pipeline.body.get("status") or {}).get("autoscaler")
        )
        ready = stamp_s(status.deployment.ready_at if status.deployment else None)
        began = processing_since(job, ready, at)
        since = (at if began is None else began) + auto.cooldown_seconds
        samples = [s for s in window.samples if s.at_s >= since]
        metrics = metrics_over(samples, auto.metrics_window_seconds)
        history = self._measure(history, running.parallelism, metrics, status, deployment)
        m_at = max_parallelism(job, running)
        if metrics is not None and metrics.capacity is not None and metrics.utilization >= LOADED:
            history = history.measured_under_load(running.parallelism, metrics.capacity)
        loaded = None
        if history.loaded is not None:
            replicas, capacity = history.loaded
            loaded = rescaled_capacity(capacity, replicas, running.parallelism, m_at)
        last_op = status.last_operation
        inputs = Inputs(
            now_s=at,
            replicas=running.parallelism,
            max_parallelism=m_at,
            metrics=metrics,
            downtime_s=history.downtime_s(last_op.downtime_seconds if last_op else None),
            lead_s=history.lead_s(lead_estimate(running, last_op)),
            correction=history.correction(),
            loaded_capacity=loaded,
            ceiling=history.ceiling(),
            recommendations=history.recommendations_of(deployment),
        )
        graph = job.graph.nodes if job.graph else ()
        if graph and not any(n.parallelism and not n.pinned for n in graph):
            why = "no keyed operator follows replicas (none, or all pinned by the pipeline)"
            decision = Decision(Action.WAIT, inputs.replicas, inputs.replicas, None, why)
        elif began is None:
            why = "the driver has not finished its first epoch: it is not processing yet"
            decision = Decision(Action.WAIT, inputs.replicas, inputs.replicas, None, why)
        elif at < since:
            why = f"cool-down: {since - at:.0f} s more after the driver began processing"
            decision = Decision(Action.WAIT, inputs.replicas, inputs.replicas, None, why)
        else:
            decision = decide(auto, inputs)
        record = DecisionRecord(
            time=stamp_ms(int(at * 1000)),
            action=str(decision.action),
            replicas=decision.replicas,
            target=decision.target,
            recommended=decision.recommended,
            reason=decision.reason,
            inputs=_inputs(auto, inputs),
            dry_run=auto.dry_run and decision.rescales,
        )
        changed = not record.same_outcome(history.last)
        history = history.recommended(deployment, at, decision.recommended).decided(record)
        if decision.rescales and not auto.dry_run:
            history = history.rescaled(
                RescaleRecord(
                    time=record.time,
                    deployment=deployment,
                    from_replicas=decision.replicas,
                    to_replicas=decision.target,
                    capacity_before=metrics.capacity if metrics else None,
                    expected_capacity=decision.expected_capacity,
                )
            )
        self.pipeline.write(autoscaler=history.to_dict())
        log.info(
            "%s/%s: %s %s -> %s (%s) %s",
            *self.key,
            decision.action,
            decision.replicas,
            decision.target,
            decision.reason,
            record.inputs,
        )
        if changed:
            self._announce(decision, record, auto.dry_run)
        if decision.rescales and not auto.dry_run:
            self.kube.scale_pipeline(*self.key, decision.target)

    def _measure(
        self,
        history: AutoscalerStatus,
        replicas: int,
        metrics: WindowMetrics | None,
        status: PipelineStatus,
        deployment: str,
    ) -> AutoscalerStatus:
        """The latest rescale's outcome, once its new driver has a full window: the capacity
        it got, and its downtime (the flow's ``lastOperation``)."""
        pending = history.pending_measurement(replicas)
        if pending is None or pending.deployment == deployment or metrics is None:
            return history
        last_op = status.last_operation
        downtime = lead = None
        if last_op is not None and last_op.id == deployment and last_op.kind is OpKind.RESCALE:
            downtime, lead = last_op.downtime_seconds, last_op.lead_seconds
        measured = pending.measured(metrics.capacity, downtime, lead)
        e = measured.effectiveness
        if e is not None and e < INEFFECTIVE:
            self.event(
                "Warning",
                EventReason.SCALING_INEFFECTIVE,
                f"the scale-up {pending.from_replicas} -> {pending.to_replicas} delivered "
                f"{e:.0%} of the capacity it predicted ({measured.observed_capacity or 0:.0f} "
                f"records/s, expected {pending.expected_capacity or 0:.0f}): no scale-up past "
                f"{pending.to_replicas} until a scale-down",
            )
        return history.with_latest(measured)

    def _announce(self, decision: Decision, record: DecisionRecord, dry_run: bool) -> None:
        inputs = record.inputs
        facts = (
            f"input {inputs.get('inputRate')} records/s, lag {inputs.get('lagRecords')}, "
            f"busiest subtask {inputs.get('utilization')} busy, capacity "
            f"{inputs.get('capacity')} records/s"
        )
        if decision.rescales:
            move = f"{decision.action} {decision.replicas} -> {decision.target}"
            if dry_run:
                self.event(
                    "Normal",
                    EventReason.AUTOSCALE_RECOMMENDED,
                    f"dry run, would {move}: {decision.reason}; {facts}",
                )
            else:
                self.event("Normal", EventReason.AUTOSCALED, f"{move}: {decision.reason}; {facts}")
        elif decision.held_back:
            self.event(
                "Normal",
                EventReason.AUTOSCALE_HELD,
                f"stays at {decision.replicas}: {decision.reason}; {facts}",
            )


def processing_since(job: JobInfo, ready_s: float, now_s: float) -> float | None:
    """When the driver began processing (``StartupMarks.processing_ms``, as the flow's
    downtime ends: ``processing_again``), its own clock kept within [ready, now]; None before.
    A driver that restores a large state or waits for its executors is ready long before its
    first epoch ends: a window from readiness would read a driver still starting (a low
    capacity), and measure a rescale before its downtime is known."""
    began = job.startup.processing_ms
    if began is None:
        return None
    return min(max(began / 1000, ready_s), now_s)


def lead_estimate(running: PipelineSpec, last_op: LastOperation | None) -> float:
    """A rescale's lead before one of the autoscaler's is measured: the last flow's, else
    with a pre-started driver the time the last flow took to bring its driver up (the
    first deployment's: the pod's start to ready, what a pre-start waits for), else none
    (the old driver stops at once; the new one's start is downtime)."""
    if last_op is None:
        return 0.0
    if last_op.lead_seconds is not None:
        return last_op.lead_seconds
    return last_op.total_seconds if running.driver.prestart else 0.0


def max_parallelism(job: JobInfo, running: PipelineSpec) -> int:
    """The job's key-groups (the driver's word, bounded by the spec's)."""
    limit = MAX_MAX_PARALLELISM
    return min(job.max_parallelism or limit, running.max_parallelism or limit)


def _inputs(auto: AutoscalerSpec, inp: Inputs) -> dict[str, Json]:
    """What the decision read, for status and events: always the same keys (a merge patch
    of status would keep a key a later record left out)."""
    m = inp.metrics
    window: dict[str, Json] = m.to_json() if m else dict.fromkeys(WindowMetrics.JSON_KEYS)
    return {
        **window,
        "requiredRate": round(required_rate(auto, inp), 1) if m else None,
        "downtimeSeconds": round(inp.downtime_s, 1),
        "leadSeconds": round(inp.lead_s, 1),
        "correction": round(inp.correction, 3),
        "loadedCapacity": None if inp.loaded_capacity is None else round(inp.loaded_capacity, 1),
        "ceiling": inp.ceiling,
        "maxParallelism": inp.max_parallelism,
    }
