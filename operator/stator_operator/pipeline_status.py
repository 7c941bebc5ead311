"""``status`` of a StatefulPipeline, typed: what the reconciler, the flows and the observer
read, and the values they write (status.py patches them).

``from_dict`` reads the stored form; a field of the wrong shape (a status edited by hand)
reads as absent (a savepoint history entry or a condition that is not a mapping is skipped)
rather than stopping the reconciler. ``to_dict`` gives the stored form, camelCase keys
unchanged."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .operation import Operation
from .outcomes import ConditionType, Phase


def _str(raw: Mapping[str, Any], key: str) -> str | None:
    value = raw.get(key)
    return None if value is None else str(value)


def _int(raw: Mapping[str, Any], key: str) -> int | None:
    value = raw.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


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

    def to_dict(self) -> dict[str, Any]:
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
            epoch=_int(raw, "epoch"),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "time": self.time, "trigger": self.trigger}
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "status": "True" if self.ok else "False",
            "reason": self.reason,
            "message": self.message,
            "lastTransitionTime": self.last_transition_time,
        }


def _listed(raw: Any, read: Any) -> tuple[Any, ...]:
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
    # Written by flows.py (at ready) and the reconciler (once processing again); read back by
    # processing_again only, in its stored form.
    last_operation: Mapping[str, Any]
    # The status as stored, for the fields mirrored from the driver's answer (reconciler.py
    # writes them by their stored names and compares them so).
    raw: Mapping[str, Any]

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
            savepoints=_listed(raw.get("savepoints"), SavepointRecord.from_dict),
            conditions=_listed(raw.get("conditions"), Condition.from_dict),
            last_error=_str(raw, "lastError"),
            failed_spec=_str(raw, "failedSpec"),
            suspended_with=_str(raw, "suspendedWith"),
            savepoint_nonce=_int(raw, "savepointNonce"),
            periodic_savepoint_at=_str(raw, "periodicSavepointAt"),
            restarts=int(restarts) if isinstance(restarts, int | float) else 0,
            restart_history=raw.get("restartHistory"),
            last_operation=_mapping(raw.get("lastOperation")),
            raw=raw,
        )

    def condition(self, ctype: ConditionType) -> Condition | None:
        return next((c for c in self.conditions if c.type == ctype), None)

    @property
    def suspended(self) -> bool:
        return self.phase is Phase.SUSPENDED


_PHASES = {str(p) for p in Phase}  # another value (a corrupt one) reads as no phase


def _spec(value: Any) -> dict[str, Any] | None:
    return dict(value) if isinstance(value, Mapping) else None
