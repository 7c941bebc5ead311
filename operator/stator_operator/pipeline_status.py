"""``status`` of a StatefulPipeline, typed: what the reconciler, the flows and the observer
read, and the values they write (status.py patches them).

``from_dict`` reads the stored form; a field of the wrong shape (a status edited by hand)
reads as absent (a savepoint history entry or a condition that is not a mapping is skipped)
rather than stopping the reconciler. ``to_dict`` gives the stored form, camelCase keys
unchanged."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stator.control.wire import Json, camel

from .operation import Operation, OpKind, Step
from .outcomes import ConditionType, Phase


def _str(raw: Mapping[str, Any], key: str) -> str | None:
    value = raw.get(key)
    return None if value is None else str(value)


# How a stored field is read, here and in ``autoscaling/history.py`` (status.autoscaler): a
# value of another type reads as absent.


def int_field(raw: Mapping[str, Any], key: str) -> int | None:
    value = raw.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def number(value: Any) -> float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _seconds(value: Any) -> dict[str, float] | None:
    """A stored ``{label: seconds}``: the entries that are numbers."""
    if not isinstance(value, Mapping):
        return None
    return {str(k): float(v) for k, v in value.items() if number(v) is not None}


@dataclass(frozen=True)
class Deployment:
    """``status.deployment``: the driver that runs (or last ran)."""

    id: str
    restored_from: str | None
    lineage: str | None
    driver_pod: str | None
    ready_at: str | None
    executor_set: str | None  # None: no executor pods (a later set is the pipeline's first)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Deployment | None:
        if not raw.get("id"):
            return None
        return cls(
            id=str(raw["id"]),
            restored_from=_str(raw, "restoredFrom"),
            lineage=_str(raw, "lineage") or None,
            driver_pod=_str(raw, "driverPod"),
            ready_at=_str(raw, "readyAt"),
            executor_set=_str(raw, "executorSet") or None,
        )

    def to_dict(self) -> dict[str, Json]:
        """Every key, unset ones as null (a merge patch: no key of the previous one stays)."""
        return {
            "id": self.id,
            "restoredFrom": self.restored_from,
            "lineage": self.lineage,
            "driverPod": self.driver_pod,
            "readyAt": self.ready_at,
            "executorSet": self.executor_set,
        }


@dataclass(frozen=True)
class SavepointRecord:
    """An entry of ``status.savepoints``, the savepoint history."""

    path: str
    time: str | None
    trigger: str | None  # "periodic", else the kind of the operation that took it
    root: str | None  # the savepoint directory it was taken into
    epoch: int | None

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> SavepointRecord | None:
        if not raw.get("path"):
            return None
        return cls(
            path=str(raw["path"]),
            time=_str(raw, "time"),
            trigger=_str(raw, "trigger"),
            root=_str(raw, "root"),
            epoch=int_field(raw, "epoch"),
        )

    def to_dict(self) -> dict[str, Json]:
        out: dict[str, Json] = {"path": self.path, "time": self.time, "trigger": self.trigger}
        if self.root is not None:
            out["root"] = self.root
        out["epoch"] = self.epoch
        return out


@dataclass(frozen=True)
class Condition:
    type: str
    ok: bool  # "True" / "False" in the stored form
    reason: str
    message: str
    last_transition_time: str | None

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Condition | None:
        if not raw.get("type"):
            return None
        return cls(
            type=str(raw["type"]),
            ok=raw.get("status") == "True",
            reason=str(raw.get("reason") or ""),
            message=str(raw.get("message") or ""),
            last_transition_time=_str(raw, "lastTransitionTime"),
        )

    def to_dict(self) -> dict[str, Json]:
        return {
            "type": self.type,
            "status": "True" if self.ok else "False",
            "reason": self.reason,
            "message": self.message,
            "lastTransitionTime": self.last_transition_time,
        }


@dataclass(frozen=True)
class LastOperation:
    """``status.lastOperation``: how long the last flow that brought a driver up took, step by
    step (written by flows.py when the driver is ready), and once that driver has run its
    first epoch, its start-up split and the downtime (``reconciler.processing_again``)."""

    kind: OpKind | None  # None: a kind this operator does not know
    id: str  # the deployment it brought up
    step_seconds: Mapping[str, float]  # by Step.label, the steps it took
    total_seconds: float
    ready_at_ms: int
    processing_stopped_at_ms: int | None = None  # Operation.processing_stopped_ms
    handed_over_at_ms: int | None = None  # Operation.handed_over_ms
    processing_again_at: str | None = None
    driver_startup_seconds: Mapping[str, float] | None = None
    downtime_seconds: float | None = None  # upgrades and rescales

    @property
    def lead_seconds(self) -> float | None:
        """From the flow's start to the old driver's stop (its savepoint epoch began): the
        time a pre-started driver's start took while the old one went on processing. None
        without that stop (a first deployment, a fallback to the latest checkpoint)."""
        stopped = self.processing_stopped_at_ms
        if stopped is None:
            return None
        started_ms = self.ready_at_ms - 1000 * self.total_seconds
        return round(max(0.0, (stopped - started_ms) / 1000), 2)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> LastOperation | None:
        value = {name: raw.get(key) for name, key in _LAST_KEYS.items()}
        ready_at = number(value["ready_at_ms"])
        if not value["id"] or not ready_at:
            return None
        stopped, handed = (
            number(value["processing_stopped_at_ms"]),
            number(value["handed_over_at_ms"]),
        )
        again = value["processing_again_at"]
        return cls(
            kind=OpKind(value["kind"]) if value["kind"] in _KINDS else None,
            id=str(value["id"]),
            step_seconds=_seconds(value["step_seconds"]) or {},
            total_seconds=float(number(value["total_seconds"]) or 0.0),
            ready_at_ms=int(ready_at),
            processing_stopped_at_ms=None if stopped is None else int(stopped),
            handed_over_at_ms=None if handed is None else int(handed),
            processing_again_at=None if again is None else str(again),
            driver_startup_seconds=_seconds(value["driver_startup_seconds"]),
            downtime_seconds=number(value["downtime_seconds"]),
        )

    def to_dict(self) -> dict[str, Json]:
        """The stored form: camelCase keys, unset fields left out."""
        out: dict[str, Json] = {}
        for name, key in _LAST_KEYS.items():
            value = getattr(self, name)
            if isinstance(value, Mapping):
                out[key] = dict(value)
            elif value is not None:
                out[key] = str(value) if isinstance(value, OpKind) else value
        return out

    def to_patch(self) -> dict[str, Json]:
        """The stored form as a merge patch: unset fields and the steps this operation skipped
        as null, so nothing of the record it replaces is left behind."""
        steps: dict[str, Json] = {**dict.fromkeys(s.label for s in Step), **self.step_seconds}
        return {**dict.fromkeys(_LAST_KEYS.values()), **self.to_dict(), "stepSeconds": steps}


_LAST_KEYS = {field.name: camel(field.name) for field in dataclasses.fields(LastOperation)}
_KINDS = {str(k) for k in OpKind}


def listed(raw: Any, read: Any) -> tuple[Any, ...]:
    entries = raw if isinstance(raw, list) else []
    return tuple(e for e in (read(r) for r in entries if isinstance(r, Mapping)) if e is not None)


@dataclass(frozen=True)
class PipelineStatus:
    phase: Phase | None
    operation: Operation | None  # the write-ahead record of the flow in flight
    last_reconciled_spec: dict[str, Any] | None  # the running deployment's spec, as given
    last_stable_spec: dict[str, Any] | None  # the last spec that ran (what a rollback brings up)
    deployment: Deployment | None
    savepoints: tuple[SavepointRecord, ...]
    conditions: tuple[Condition, ...]
    last_error: str | None
    failed_spec: str | None  # attempt fingerprint of a spec rolled back or given up
    suspended_with: str | None  # what a suspended pipeline resumes from
    savepoint_nonce: int | None  # the savepoints.triggerNonce last answered
    periodic_savepoint_at: str | None
    restarts: int
    restart_history: Any  # stator.driver.restart.History's stored form
    last_operation: LastOperation | None
    # The fields mirrored from the running driver's answer (MIRRORED), as stored: the
    # reconciler writes them by their stored names and compares them so, never reads them.
    mirrored: Mapping[str, Json]

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> PipelineStatus:
        op = raw.get("operation")
        phase = raw.get("phase")
        restarts = raw.get("restarts")
        return cls(
            phase=Phase(phase) if phase in _PHASES else None,
            operation=Operation.from_json(op) if op else None,
            last_reconciled_spec=_spec(raw.get("lastReconciledSpec")),
            last_stable_spec=_spec(raw.get("lastStableSpec")),
            deployment=Deployment.from_dict(_mapping(raw.get("deployment"))),
            savepoints=listed(raw.get("savepoints"), SavepointRecord.from_dict),
            conditions=listed(raw.get("conditions"), Condition.from_dict),
            last_error=_str(raw, "lastError"),
            failed_spec=_str(raw, "failedSpec"),
            suspended_with=_str(raw, "suspendedWith"),
            savepoint_nonce=int_field(raw, "savepointNonce"),
            periodic_savepoint_at=_str(raw, "periodicSavepointAt"),
            restarts=int(restarts) if isinstance(restarts, int | float) else 0,
            restart_history=raw.get("restartHistory"),
            last_operation=LastOperation.from_dict(_mapping(raw.get("lastOperation"))),
            mirrored={key: raw[key] for key in MIRRORED if key in raw},
        )

    def condition(self, ctype: ConditionType) -> Condition | None:
        return next((c for c in self.conditions if c.type == ctype), None)

    @property
    def suspended(self) -> bool:
        return self.phase is Phase.SUSPENDED


# The status fields a running driver's answer gives (``reconciler._job_fields``).
MIRRORED = (
    "epoch",
    "parallelism",
    "jobState",
    "lagRecords",  # the sources' consumer lag, in records (total) and ms (largest)
    "lagMs",
    "latestCheckpoint",
    "lastError",
    "standbyCopies",
    "restores",
    "regions",
    "placement",
    "metrics",  # a summary: latency p99s, the busiest subtask (metrics_summary.py)
    "checkpointHealth",  # the driver's checkpoint health (checkpoint_health.py)
)

_PHASES = {str(p) for p in Phase}  # another value (a corrupt one) reads as no phase


def _spec(value: Any) -> dict[str, Any] | None:
    return dict(value) if isinstance(value, Mapping) else None
