"""The typed status: read from what any operator version stored (a corrupt field reads as
absent, as before), written back in the same stored form."""

from __future__ import annotations

from typing import Any

from stator.driver.status import JobState
from stator_operator.operation import OpKind, Step
from stator_operator.outcomes import ConditionType, DriverState, EventReason, Phase
from stator_operator.pipeline_status import (
    Condition,
    Deployment,
    LastOperation,
    PipelineStatus,
    SavepointRecord,
)

STORED: dict[str, Any] = {
    "phase": "Running",
    "deployment": {
        "id": "ab12cd34",
        "restoredFrom": "latest",
        "lineage": "ab12cd34",
        "driverPod": "counts-driver-ab12cd34",
        "readyAt": "2026-01-01T00:00:00Z",
        "executorSet": None,
    },
    "savepoints": [
        {
            "path": "s3://b/sp/1",
            "time": "2026-01-01T00:00:00Z",
            "trigger": "upgrade",
            "root": "s3://b/sp",
            "epoch": 7,
        },
        {
            "path": "s3://b/sp/2",
            "time": "2026-01-01T00:01:00Z",
            "trigger": "periodic",
            "epoch": None,
        },
    ],
    "conditions": [
        {
            "type": "Ready",
            "status": "True",
            "reason": "DriverReady",
            "message": "m",
            "lastTransitionTime": "t",
        },
    ],
    "lastOperation": {
        "kind": "rescale",
        "id": "ab12cd34",
        "stepSeconds": {"savepoint": 0.5, "deploy": 1.25, "await-ready": 4.0},
        "totalSeconds": 5.75,
        "readyAtMs": 1767225600000,
        "processingStoppedAtMs": 1767225594000,
        "processingAgainAt": "2026-01-01T00:00:03Z",
        "driverStartupSeconds": {"pod-start": 1.0, "first-epoch": 2.0},
        "downtimeSeconds": 9.0,
    },
    "restarts": 2,
    "savepointNonce": 3,
    "lastReconciledSpec": {"image": "i"},
    "operation": {
        "kind": "savepoint",
        "id": "ef56",
        "step": 2,
        "stepName": "await-savepoint",
        "startedAt": "t",
        "stepStartedAt": "t",
    },
}


def test_the_stored_status_reads_typed_and_writes_back_the_same() -> None:
    status = PipelineStatus.from_dict(STORED)
    assert status.phase is Phase.RUNNING and not status.suspended
    assert status.deployment == Deployment(
        "ab12cd34", "latest", "ab12cd34", "counts-driver-ab12cd34", "2026-01-01T00:00:00Z", None
    )
    assert status.deployment.to_dict() == STORED["deployment"]
    assert [s.to_dict() for s in status.savepoints] == STORED["savepoints"]
    assert [c.to_dict() for c in status.conditions] == STORED["conditions"]
    ready = status.condition(ConditionType.READY)
    assert ready is not None and ready.ok and ready.reason == "DriverReady"
    assert (status.restarts, status.savepoint_nonce) == (2, 3)
    assert status.last_reconciled_spec == {"image": "i"}
    assert status.operation is not None
    assert (status.operation.kind, status.operation.step) == (
        OpKind.SAVEPOINT,
        Step.AWAIT_SAVEPOINT,
    )
    last = status.last_operation
    assert last is not None and last.to_dict() == STORED["lastOperation"]
    assert (last.kind, last.ready_at_ms, last.handed_over_at_ms) == (
        OpKind.RESCALE,
        1767225600000,
        None,
    )
    assert last.step_seconds["deploy"] == 1.25 and last.downtime_seconds == 9.0


def test_the_last_operation_patch_leaves_nothing_of_the_record_it_replaces() -> None:
    last = LastOperation(OpKind.RESTART, "ef56", {"deploy": 1.0}, 1.0, 1767225600000)
    patch = last.to_patch()
    assert patch["kind"] == "restart" and patch["readyAtMs"] == 1767225600000
    assert patch["downtimeSeconds"] is None and patch["processingAgainAt"] is None
    assert patch["stepSeconds"] == {**dict.fromkeys(s.label for s in Step), "deploy": 1.0}
    assert "downtimeSeconds" not in last.to_dict()


def test_corrupt_fields_read_as_absent() -> None:
    status = PipelineStatus.from_dict(
        {
            "phase": "Sideways",
            "deployment": "x",
            "savepoints": ["x", {"time": "no path"}, {"path": "s3://b/sp/1", "epoch": "7"}],
            "conditions": {"type": "Ready"},
            "restarts": "many",
            "lastReconciledSpec": "x",
            "lastOperation": {"id": "ab12", "readyAtMs": "soon"},
        }
    )
    assert status.phase is None and status.deployment is None
    assert status.savepoints == (SavepointRecord("s3://b/sp/1", None, None, None, None),)
    assert status.conditions == () and status.restarts == 0
    assert status.last_reconciled_spec is None and status.operation is None
    assert status.last_operation is None
    odd = {"kind": "teleport", "id": "ab12", "readyAtMs": 5, "stepSeconds": {"deploy": "x"}}
    last = LastOperation.from_dict(odd)
    assert last is not None and (last.kind, dict(last.step_seconds)) == (None, {})


def test_an_empty_status_is_nothing_deployed() -> None:
    status = PipelineStatus.from_dict({})
    assert (status.phase, status.deployment, status.savepoints, status.last_error) == (
        None,
        None,
        (),
        None,
    )
    assert Condition("SpecValid", False, "r", "m", None).to_dict()["status"] == "False"


def test_the_driver_states_the_operator_reads_are_the_drivers() -> None:
    assert {str(s) for s in DriverState} <= {str(s) for s in JobState}


def test_every_operation_kind_has_its_step_event_and_the_deploying_ones_a_completed_one() -> None:
    assert [str(k.step_reason) for k in OpKind][:3] == ["DeployStep", "UpgradeStep", "RescaleStep"]
    deploying = (OpKind.DEPLOY, OpKind.UPGRADE, OpKind.RESCALE, OpKind.RESUME)
    completed = [k.completed_reason for k in (*deploying, OpKind.RESTART, OpKind.ROLLBACK)]
    assert completed[-1] == "RollbackCompleted" and EventReason.RESCALE_COMPLETED in completed
