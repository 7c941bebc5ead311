"""A job as the autoscaler sees it, simulated in steps of virtual time: input at a rate,
keyed subtasks that each read ``rate_per_subtask`` records per busy second of the
key-groups they hold, the consumer lag, and rescales that go on at the running parallelism
for ``lead_s`` (a pre-started driver's start), then stop the job for ``downtime_s`` and
bring up a new deployment (counters from zero) whose first epoch ends
``first_epoch_s`` after it is ready, once it has input (before one, it is caught up where it
finds nothing to read; the flow's downtime is known from either). The real
:class:`Autoscaler` runs against it through the operator's fakes, so a closed loop (step
input, noise, a scale-up that does not help) is tested end to end in milliseconds."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stator.control.schema import (
    GraphNode,
    JobGraph,
    JobInfo,
    MetricsInfo,
    OperatorMetricsInfo,
    StartupMarks,
    SubtaskMetricsInfo,
)
from stator.keygroups import range_for_subtask
from stator_operator.autoscaling import autoscaler
from stator_operator.autoscaling.autoscaler import Autoscaler, forget
from stator_operator.outcomes import EventReason, Phase
from stator_operator.pipeline_spec import PipelineSpec
from stator_operator.status import StatusWriter, stamp_ms
from tests.unit.operator_fakes import FakeKube

START = 1_800_000_000.0  # virtual unix seconds


@dataclass
class Plant:
    autoscaler: dict[str, Any]  # spec.autoscaler
    replicas: int
    rate_per_subtask: float
    max_parallelism: int = 60
    downtime_s: float = 30.0
    lead_s: float = 0.0  # a rescale's flow until the running job stops
    # A new deployment reads from the moment it is ready; its first epoch, the one that
    # restores, ends this much later (a large state, a long first epoch).
    first_epoch_s: float = 0.0
    # The most all subtasks together read per second (CPU-bound work on a small machine):
    # more subtasks then only share it.
    ceiling_rate: float = math.inf
    tick_s: float = 2.0
    t: float = START
    lag: float = 0.0
    stopped_until: float = 0.0
    records_in: float = 0.0
    busy_s: list[float] = field(default_factory=list)
    deployment: int = 0
    ready_t: float = START
    first_t: float | None = None  # the deployment's first epoch ended
    caught_up_t: float | None = None  # before one, it found nothing to read
    last_read: float = 0.0
    redeploy: bool = False  # a rescale's new deployment comes up once its downtime is over
    flow_t: float | None = None  # a rescale's flow began (its lead runs)
    stopped_t: float = 0.0  # the running job stopped for the last rescale
    history: list[tuple[float, int, float]] = field(default_factory=list)  # (t, replicas, lag)
    events: list[tuple[str, str]] = field(default_factory=list)
    kube: FakeKube = field(init=False)

    def __post_init__(self) -> None:
        self.body: dict[str, Any] = {
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": self._spec(self.replicas),
            "status": {"phase": str(Phase.RUNNING)},
        }
        self.kube = FakeKube(self.body)
        forget("ns", "p")
        self._deploy()

    def _spec(self, replicas: int) -> dict[str, Any]:
        return {
            "image": "i",
            "entrypoint": "m:f",
            "replicas": replicas,
            "maxParallelism": self.max_parallelism,
            "checkpointing": {"storage": "file:///ck"},
            "autoscaler": {"enabled": True, **self.autoscaler},
        }

    def _deploy(self) -> None:
        self.deployment += 1
        self.records_in, self.busy_s = 0.0, [0.0] * self.replicas
        self.ready_t, self.first_t, self.caught_up_t = self.t, None, None
        deployment = {"id": f"d{self.deployment}", "readyAt": stamp_ms(int(self.t * 1000))}
        self.kube.pipeline["status"]["deployment"] = deployment

    def capacity(self, replicas: int) -> float:
        """Records/s when the busiest subtask is busy all the time."""
        widest = math.ceil(self.max_parallelism / replicas)
        return min(self.rate_per_subtask * self.max_parallelism / widest, self.ceiling_rate)

    def _advance(self, input_rate: float) -> None:
        dt_s = self.tick_s
        self.lag += input_rate * dt_s
        self.last_read = 0.0
        if self.t >= self.stopped_until:
            read = self.last_read = min(self.lag, self.capacity(self.replicas) * dt_s)
            self.lag -= read
            self.records_in += read
            full = self.capacity(self.replicas)  # the busiest subtask's pace, shared by all
            for i in range(self.replicas):
                groups = range_for_subtask(i, self.replicas, self.max_parallelism)
                widest = math.ceil(self.max_parallelism / self.replicas)
                self.busy_s[i] += read / full * (groups.end - groups.start) / widest
        self.t += dt_s

    def job(self) -> JobInfo:
        subtasks = tuple(
            SubtaskMetricsInfo(subtask=i, busy_ms_total=round(b * 1000))
            for i, b in enumerate(self.busy_s)
        )
        return JobInfo(
            epoch=1,
            startup=StartupMarks(
                first_epoch_ms=_ms(self.first_t), caught_up_ms=_ms(self.caught_up_t)
            ),
            records_in=round(self.records_in),
            lag_records=round(self.lag),
            max_parallelism=self.max_parallelism,
            graph=JobGraph(
                nodes=(GraphNode(id=1, label="count", kind="process", parallelism=self.replicas),)
            ),
            metrics=MetricsInfo(
                operators={"count": OperatorMetricsInfo(kind="keyed", subtasks=subtasks)}
            ),
        )

    def run(self, seconds: float, input_rate: Callable[[float], float]) -> None:
        """Run for ``seconds`` of input at ``input_rate(t)`` (t: seconds since START), the
        autoscaler looking at every tick but during a rescale's flow (``lead_s``, then
        ``downtime_s``)."""
        end = self.t + seconds
        while self.t < end:
            self._advance(input_rate(self.t - START))
            wanted = int(self.kube.pipeline["spec"]["replicas"])
            if wanted != self.replicas and self.flow_t is None:  # the rescale flow begins
                self.flow_t = self.t
            if self.flow_t is not None and not self.redeploy:  # its lead, then it stops
                if self.t >= self.flow_t + self.lead_s:
                    self.replicas, self.redeploy = wanted, True
                    self.stopped_t, self.stopped_until = self.t, self.t + self.downtime_s
                else:
                    self.history.append((self.t - START, self.replicas, self.lag))
                continue  # the reconciler runs the autoscaler only without a flow
            if self.t < self.stopped_until:
                continue
            if self.redeploy:
                self.redeploy = False
                self._deploy()
                assert self.flow_t is not None
                self.body["status"]["lastOperation"] = {
                    "kind": "rescale",
                    "id": f"d{self.deployment}",
                    "readyAtMs": int(self.t * 1000),
                    "totalSeconds": self.t - self.flow_t,
                    "processingStoppedAtMs": int(self.stopped_t * 1000),
                }
                self.flow_t = None
            self._mark()
            self._step()
            self.history.append((self.t - START, self.replicas, self.lag))

    def _mark(self) -> None:
        """The driver's start-up marks, and the reconciler's ``processing_again``."""
        has_input = self.last_read or self.lag
        if self.first_t is None:
            if has_input and self.t >= self.ready_t + self.first_epoch_s:
                self.first_t = self.t
            elif self.caught_up_t is None and not has_input:
                self.caught_up_t = self.t
        again = self.caught_up_t or self.first_t
        last = self.body["status"].get("lastOperation")
        if last and "downtimeSeconds" not in last and again is not None:
            last["processingAgainAt"] = stamp_ms(int(again * 1000))
            last["downtimeSeconds"] = again - self.stopped_t

    def _step(self) -> None:
        writer = StatusWriter(self.kube, self.body)
        running = PipelineSpec.read(self._spec(self.replicas))
        spec = PipelineSpec.read(self.body["spec"])

        def event(kind: str, reason: EventReason, message: str) -> None:
            self.events.append((str(reason), message))

        clock, autoscaler.clock = autoscaler.clock, lambda: self.t
        try:
            Autoscaler(writer, self.kube, event).step(spec, running, self.job())
        finally:
            autoscaler.clock = clock

    @property
    def status(self) -> dict[str, Any]:
        return dict(self.body["status"].get("autoscaler") or {})

    def replicas_over_time(self) -> list[int]:
        """The parallelism each time it changed, in order."""
        out: list[int] = []
        for _, r, _ in self.history:
            if not out or out[-1] != r:
                out.append(r)
        return out


def _ms(t: float | None) -> int | None:
    return None if t is None else int(t * 1000)
