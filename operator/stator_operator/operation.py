"""The operation in flight: the write-ahead record kept in ``status.operation`` (see flows.py).

Stored as JSON with camelCase keys that do not change between versions: an operator upgraded
in the middle of a flow reads what the previous one wrote and finishes the flow."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import Any

from stator.control.wire import Json, camel

from .outcomes import EventReason, Phase
from .pipeline_spec import UpgradeMode


class OpKind(StrEnum):
    DEPLOY = "deploy"
    UPGRADE = "upgrade"
    RESCALE = "rescale"
    SUSPEND = "suspend"
    RESUME = "resume"
    RESTART = "restart"
    ROLLBACK = "rollback"
    SAVEPOINT = "savepoint"
    DELETE = "delete"

    @property
    def phase(self) -> Phase:
        """``status.phase`` while an operation of this kind runs."""
        return _PHASES[self]

    @property
    def step_reason(self) -> EventReason:
        """The event an operation of this kind posts at each step: ``UpgradeStep``."""
        return EventReason(f"{self.capitalize()}Step")

    @property
    def completed_reason(self) -> EventReason:
        """The event once its driver is ready: ``UpgradeCompleted`` (only the kinds that
        bring a driver up have one)."""
        return EventReason(f"{self.capitalize()}Completed")


_PHASES = {
    OpKind.DEPLOY: Phase.DEPLOYING,
    OpKind.UPGRADE: Phase.UPGRADING,
    OpKind.RESCALE: Phase.RESCALING,
    OpKind.SUSPEND: Phase.SUSPENDING,
    OpKind.RESUME: Phase.DEPLOYING,
    OpKind.RESTART: Phase.RESTARTING,
    OpKind.ROLLBACK: Phase.ROLLING_BACK,
    OpKind.SAVEPOINT: Phase.RUNNING,
    OpKind.DELETE: Phase.DELETING,
}


PERIODIC = "periodic"  # Operation.trigger of a savepoint taken every savepoints.periodicSeconds


class Step(IntEnum):
    """The numbered steps of every flow, in order (a flow may start past the first)."""

    PRESTART = 0
    SAVEPOINT = 1
    AWAIT_SAVEPOINT = 2
    REMOVE_DRIVER = 3
    DEPLOY = 4
    AWAIT_READY = 5

    @property
    def label(self) -> str:
        """``stepName`` in status: ``await-savepoint``."""
        return self.name.lower().replace("_", "-")


@dataclass(frozen=True)
class Operation:
    kind: OpKind
    id: str  # also the id of the deployment it brings up
    step: Step
    started_at: str
    step_started_at: str
    target: dict[str, Any] | None = None  # the spec the flow brings up (or stops)
    restore: str | None = None  # savepoint path, "latest" or "none"
    # The run a restart continues (its checkpoints record it); other flows start their own,
    # named by their id.
    lineage: str | None = None
    # metadata.generation when the flow started: what status.observedGeneration says once
    # it is up (a spec applied meanwhile is the next flow's).
    generation: int | None = None
    mode: UpgradeMode | None = None
    # The change changes the parallelism (spec.Change.rescales, decided when it began; a
    # rescale's always does): its steps read this, never the kind or the specs again.
    rescales: bool = False
    # The flow brings up a spec other than the one that ran (classify's decision when it
    # began: an upgrade, a rescale, a resume of a spec changed while suspended), so its failed
    # driver rolls back. None: a flow classify did not start, or recorded before this field.
    changes_spec: bool | None = None
    nonce: int | None = None  # savepoints.triggerNonce answered by this savepoint
    trigger: str | None = None  # PERIODIC; else the kind is the trigger
    savepoint_request: str | None = None  # the driver's request id (step 2)
    savepoint: str | None = None  # taken at step 2, restored by a rollback
    not_before: float | None = None  # restart backoff (epoch seconds)
    deployed_at: float | None = None
    delete_started_at: str | None = None
    done: bool = False  # a delete whose driver is gone
    # The new driver was started at step 0 and waits for the hand-over at step 4.
    prestarted: bool = False
    # ... and was handed over at step 3 (epoch ms), before the old driver was removed.
    handed_over_ms: int | None = None
    # When the old driver stopped processing: its savepoint's epoch began (ms, its clock).
    processing_stopped_ms: int | None = None
    # When the current step started (epoch seconds), and how long each finished step took:
    # the split of an upgrade's or rescale's downtime, kept across operator restarts.
    step_started: float | None = None
    step_seconds: dict[str, float] | None = None
    # A lost driver's node (its Lease lapsed): the new driver prefers any other, as that
    # node may look Ready for a while yet (the node lifecycle controller's grace period).
    avoid_node: str | None = None
    # The Spark application id of the executors the new driver runs (executor pods only):
    # the running deployment's set, or a set of its own (``new_executor_set``: a rescale's
    # pre-started driver starts its executors while the old driver still processes).
    executor_set: str | None = None
    new_executor_set: bool = False

    def at(self, step: Step, started_at: str, **changes: Any) -> Operation:
        """This operation moved on to ``step``."""
        return dataclasses.replace(
            self,
            step=step,
            step_started_at=started_at,
            step_started=time.time(),
            step_seconds=self.timings(),
            **changes,
        )

    def timings(self) -> dict[str, float]:
        """Seconds spent in each step so far, the current one up to now. A step taken
        twice (e.g. a retried deploy) adds up."""
        out = dict(self.step_seconds or {})
        if self.step_started is not None:
            label = self.step.label
            out[label] = round(out.get(label, 0.0) + time.time() - self.step_started, 2)
        return out

    def to_json(self) -> dict[str, Json]:
        """The stored form: camelCase keys, unset fields left out."""
        out: dict[str, Json] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None or (value is False and field.default is False):
                continue
            out[_KEYS[field.name]] = value.value if isinstance(value, StrEnum) else value
        out["step"] = int(self.step)
        out["stepName"] = self.step.label
        return out

    def to_patch(self) -> dict[str, Json]:
        """The stored form as a merge patch: unset fields as null, so no key of the operation
        this one replaces is left behind."""
        return {**dict.fromkeys([*_KEYS.values(), "stepName"]), **self.to_json()}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Operation:
        """Read a stored operation (``to_json``'s form: an unset field is left out)."""
        values = {name: raw[key] for name, key in _KEYS.items() if raw.get(key) is not None}
        values["kind"] = OpKind(raw["kind"])
        values["step"] = Step(int(raw["step"]))
        if "mode" in values:
            values["mode"] = UpgradeMode(values["mode"])
        return cls(**values)


_KEYS = {field.name: camel(field.name) for field in dataclasses.fields(Operation)}
