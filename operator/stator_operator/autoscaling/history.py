"""``status.autoscaler``: what the autoscaler decided and why, and what it learned from its
rescales (typed, bounded; ``from_dict`` reads a hand-edited or malformed entry as absent).

- ``last``: the latest evaluation, with its inputs.
- ``decisions``: the evaluations that changed the outcome (a new action, target or
  recommendation), newest last, at most :data:`DECISIONS_KEPT`.
- ``recommendations``: this deployment's recommendations as change points (time, replicas):
  what the stabilization windows read, kept across operator restarts.
- ``rescales``: the autoscaler's rescales, each with the capacity it expected and, once
  measured at the new parallelism, the capacity it got, its downtime and its lead (the
  pre-started driver's start, while the old one went on): the correction of later
  estimates and the cost of the next rescale come from here.
- ``loadedCapacity``: the capacity last measured under load, at which replicas: a lightly
  loaded window's estimate is no lower than it (an epoch's fixed cost per keyed task is
  most of a quiet subtask's busy time, and would make every replica look slow)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from stator.control.wire import Json

from ..pipeline_status import int_field, listed, number

DECISIONS_KEPT = 10
RESCALES_KEPT = 5
RECOMMENDATIONS_KEPT = 100
# A scale-up that delivered less than this part of its predicted gain did not help: no
# scale-up past it (Flink's autoscaler uses the same 10%).
INEFFECTIVE = 0.1
DEFAULT_DOWNTIME_S = 30.0  # a rescale's downtime until one is measured


def _num(raw: Mapping[str, Any], key: str) -> float | None:
    value = number(raw.get(key))
    return None if value is None else float(value)


@dataclass(frozen=True)
class DecisionRecord:
    time: str
    action: str
    replicas: int
    target: int
    recommended: int | None
    reason: str
    inputs: Mapping[str, Json]  # the window's metrics and the estimates the decision used
    dry_run: bool = False

    def to_dict(self) -> dict[str, Json]:
        return {
            "time": self.time,
            "action": self.action,
            "replicas": self.replicas,
            "target": self.target,
            "recommended": self.recommended,
            "reason": self.reason[:500],
            "inputs": dict(self.inputs),
            "dryRun": self.dry_run,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> DecisionRecord | None:
        replicas, target = int_field(raw, "replicas"), int_field(raw, "target")
        if replicas is None or target is None or not raw.get("action"):
            return None
        inputs = raw.get("inputs")
        return cls(
            time=str(raw.get("time") or ""),
            action=str(raw["action"]),
            replicas=replicas,
            target=target,
            recommended=int_field(raw, "recommended"),
            reason=str(raw.get("reason") or ""),
            inputs=dict(inputs) if isinstance(inputs, Mapping) else {},
            dry_run=raw.get("dryRun") is True,
        )

    def same_outcome(self, other: DecisionRecord | None) -> bool:
        return other is not None and (self.action, self.target, self.recommended) == (
            other.action,
            other.target,
            other.recommended,
        )


@dataclass(frozen=True)
class RescaleRecord:
    time: str
    deployment: str  # the deployment it rescaled from
    from_replicas: int
    to_replicas: int
    capacity_before: float | None  # records/s measured at from_replicas
    expected_capacity: float | None  # predicted at to_replicas
    observed_capacity: float | None = None  # measured at to_replicas (its first full window)
    downtime_seconds: float | None = None
    lead_seconds: float | None = None  # from the decision to the old driver's stop

    @property
    def effectiveness(self) -> float | None:
        """The part of the predicted gain a scale-up delivered (None: not a measured
        scale-up)."""
        before, expected, got = self.capacity_before, self.expected_capacity, self.observed_capacity
        if self.to_replicas <= self.from_replicas or None in (before, expected, got):
            return None
        assert before is not None and expected is not None and got is not None
        if expected <= before:
            return None
        return max(0.0, min(1.0, (got - before) / (expected - before)))

    def to_dict(self) -> dict[str, Json]:
        e = self.effectiveness
        return {
            "time": self.time,
            "deployment": self.deployment,
            "fromReplicas": self.from_replicas,
            "toReplicas": self.to_replicas,
            "capacityBefore": _round(self.capacity_before),
            "expectedCapacity": _round(self.expected_capacity),
            "observedCapacity": _round(self.observed_capacity),
            "downtimeSeconds": _round(self.downtime_seconds),
            "leadSeconds": _round(self.lead_seconds),
            "effectiveness": None if e is None else round(e, 3),
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> RescaleRecord | None:
        before, after = int_field(raw, "fromReplicas"), int_field(raw, "toReplicas")
        if before is None or after is None:
            return None
        return cls(
            time=str(raw.get("time") or ""),
            deployment=str(raw.get("deployment") or ""),
            from_replicas=before,
            to_replicas=after,
            capacity_before=_num(raw, "capacityBefore"),
            expected_capacity=_num(raw, "expectedCapacity"),
            observed_capacity=_num(raw, "observedCapacity"),
            downtime_seconds=_num(raw, "downtimeSeconds"),
            lead_seconds=_num(raw, "leadSeconds"),
        )

    def measured(
        self, capacity: float | None, downtime_s: float | None, lead_s: float | None
    ) -> RescaleRecord:
        return replace(
            self, observed_capacity=capacity, downtime_seconds=downtime_s, lead_seconds=lead_s
        )


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _loaded(raw: Any) -> tuple[int, float] | None:
    if not isinstance(raw, Mapping):
        return None
    replicas, capacity = int_field(raw, "replicas"), _num(raw, "capacity")
    return None if not replicas or capacity is None else (replicas, capacity)


def _point(raw: Any) -> tuple[float, int] | None:
    if isinstance(raw, list) and len(raw) == 2:
        t, q = raw
        if isinstance(t, int | float) and isinstance(q, int) and not isinstance(q, bool):
            return float(t), q
    return None


@dataclass(frozen=True)
class AutoscalerStatus:
    last: DecisionRecord | None = None
    decisions: tuple[DecisionRecord, ...] = ()
    deployment: str | None = None  # whose recommendations these are
    recommendations: tuple[tuple[float, int], ...] = ()
    rescales: tuple[RescaleRecord, ...] = ()
    # The capacity last measured under load: (replicas, records/s).
    loaded: tuple[int, float] | None = None

    @classmethod
    def from_dict(cls, raw: Any) -> AutoscalerStatus:
        if not isinstance(raw, Mapping):
            return cls()
        last = raw.get("last")
        points = raw.get("recommendations")
        return cls(
            last=DecisionRecord.from_dict(last) if isinstance(last, Mapping) else None,
            decisions=listed(raw.get("decisions"), DecisionRecord.from_dict),
            deployment=str(raw["deployment"]) if raw.get("deployment") else None,
            recommendations=tuple(
                p for p in (_point(r) for r in (points if isinstance(points, list) else [])) if p
            ),
            rescales=listed(raw.get("rescales"), RescaleRecord.from_dict),
            loaded=_loaded(raw.get("loadedCapacity")),
        )

    def to_dict(self) -> dict[str, Json]:
        return {
            "last": None if self.last is None else self.last.to_dict(),
            "decisions": [d.to_dict() for d in self.decisions],
            "deployment": self.deployment,
            "recommendations": [[round(t, 1), q] for t, q in self.recommendations],
            "rescales": [r.to_dict() for r in self.rescales],
            "loadedCapacity": None
            if self.loaded is None
            else {"replicas": self.loaded[0], "capacity": round(self.loaded[1], 1)},
        }

    def recommendations_of(self, deployment: str) -> tuple[tuple[float, int], ...]:
        """The recommendations made while ``deployment`` ran (a new deployment starts none)."""
        return self.recommendations if self.deployment == deployment else ()

    def recommended(self, deployment: str, at_s: float, q: int | None) -> AutoscalerStatus:
        """With ``q`` recommended at ``at_s``: a change point if it differs from the last."""
        points = self.recommendations_of(deployment)
        if q is not None and (not points or points[-1][1] != q):
            points = (*points, (at_s, q))[-RECOMMENDATIONS_KEPT:]
        return replace(self, deployment=deployment, recommendations=points)

    def measured_under_load(self, replicas: int, capacity: float) -> AutoscalerStatus:
        return replace(self, loaded=(replicas, capacity))

    def decided(self, record: DecisionRecord) -> AutoscalerStatus:
        decisions = self.decisions
        if not record.same_outcome(decisions[-1] if decisions else None):
            decisions = (*decisions, record)[-DECISIONS_KEPT:]
        return replace(self, last=record, decisions=decisions)

    def rescaled(self, record: RescaleRecord) -> AutoscalerStatus:
        return replace(self, rescales=(*self.rescales, record)[-RESCALES_KEPT:])

    def pending_measurement(self, replicas: int) -> RescaleRecord | None:
        """The latest rescale, if it brought up ``replicas`` and is not measured yet."""
        latest = self.rescales[-1] if self.rescales else None
        if latest is None or latest.observed_capacity is not None:
            return None
        return latest if latest.to_replicas == replicas else None

    def with_latest(self, record: RescaleRecord) -> AutoscalerStatus:
        return replace(self, rescales=(*self.rescales[:-1], record))

    def correction(self) -> float:
        """The part of their predicted gain the last scale-ups delivered (1: as predicted),
        which scales the next prediction's gain; at least :data:`INEFFECTIVE`."""
        seen = [e for r in self.rescales if (e := r.effectiveness) is not None][-3:]
        return max(INEFFECTIVE, statistics.mean(seen)) if seen else 1.0

    def ceiling(self) -> int | None:
        """No scale-up past the latest rescale if it was a scale-up that did not help."""
        latest = self.rescales[-1] if self.rescales else None
        e = None if latest is None else latest.effectiveness
        return (
            latest.to_replicas if latest is not None and e is not None and e < INEFFECTIVE else None
        )

    def downtime_s(self, fallback: float | None) -> float:
        """A rescale's expected downtime: the median of the last three measured, else
        ``fallback`` (the last operation's), else :data:`DEFAULT_DOWNTIME_S`."""
        seen = [d for r in self.rescales if (d := r.downtime_seconds) is not None][-3:]
        if seen:
            return float(statistics.median(seen))
        return fallback if fallback is not None else DEFAULT_DOWNTIME_S

    def lead_s(self, fallback: float) -> float:
        """A rescale's expected lead (from the decision to the running job's stop): the
        median of the last three measured, else ``fallback``."""
        seen = [d for r in self.rescales if (d := r.lead_seconds) is not None][-3:]
        return float(statistics.median(seen)) if seen else fallback
