"""The operator's decisions, step by step, against in-memory Kubernetes and drivers
(tests/unit/operator_fakes.py) and real ``file://`` storage: every kind of spec change, every
step of every flow, and failure at each step. What is asserted is what the operator leaves
behind: the status and operation it wrote, the objects it created, the events it emitted."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.rest import ApiException

from stator.checkpoint.ownership import Ownership, read_owner
from stator.config import JobConfig
from stator.storage import open_store
from stator_operator import flows, observer
from stator_operator.admission import ENFORCE_LABEL
from stator_operator.naming import spark_app_id
from stator_operator.operation import Operation, OpKind, Step
from stator_operator.pipeline_spec import UpgradeMode
from stator_operator.spec import attempt_fingerprint
from tests.unit.operator_fakes import Bed, FakeDriver
from tests.unit.savepoints import write_savepoint

LONG_AGO = "2000-01-01T00:00:00Z"


def args_of(bed: Bed, pod: str | None = None) -> list[str]:
    args: list[str] = bed.kube.pods[pod or bed.driver_pod()]["spec"]["containers"][0]["args"]
    return args


def restore_arg(bed: Bed, pod: str | None = None) -> str:
    args = args_of(bed, pod)
    return args[args.index("--restore") + 1]


def job_yaml(bed: Bed) -> dict[str, Any]:
    cfg: dict[str, Any] = yaml.safe_load(bed.kube.configs["counts-config"]["data"]["job.yaml"])
    return cfg


def conditions_message(bed: Bed, ctype: str) -> str:
    return next(c["message"] for c in bed.status["conditions"] if c["type"] == ctype)


def conditions(bed: Bed) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in bed.status.get("conditions", [])}


def is_savepoint(location: str) -> bool:
    return open_store(location).exists("_savepoint.json")


def stopped_with_savepoint(bed: Bed, driver: FakeDriver, location: str) -> None:
    """Steps 1-2 of a flow: the driver is asked to stop with a savepoint and takes it."""
    bed.step()
    op = bed.op
    assert op is not None and op.step is Step.AWAIT_SAVEPOINT
    request = driver.requests[op.savepoint_request or ""]
    assert request["stop"] is (op.kind is not OpKind.SAVEPOINT)
    driver.complete(request["id"], location)
    bed.step()


# ---------------------------------------------------------------------- deploy


def test_deploy_creates_the_objects_then_awaits_the_driver(tmp_path: Path) -> None:
    bed = Bed(tmp_path)
    assert bed.step() == 0.0
    op = bed.op
    assert op is not None and (op.kind, op.step, op.restore) == (
        OpKind.DEPLOY,
        Step.DEPLOY,
        "latest",
    )
    assert bed.status["phase"] == "Deploying"
    assert bed.status["operation"]["stepName"] == "deploy"

    bed.step()  # step 4
    assert {kind for kind, _ in bed.kube.objects} == {
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "Service",
        "NetworkPolicy",
        "Lease",
    }
    # The control API's token, and its read-only one (GETs: monitors, the console).
    assert set(bed.kube.secrets) == {"counts-control", "counts-read"}
    assert bed.kube.secrets["counts-read"]["token"] != bed.kube.secrets["counts-control"]["token"]
    pod = next(iter(bed.kube.pods.values()))
    args = pod["spec"]["containers"][0]["args"]
    assert "control.read_token_file=/etc/stator-read/token" in args
    assert {"name": "read", "secret": {"secretName": "counts-read", "defaultMode": 0o440}} in (
        pod["spec"]["volumes"]
    )
    ingress = bed.kube.objects[("NetworkPolicy", "counts-stator")]["spec"]["ingress"]
    assert ingress[0]["from"] == [
        {"podSelector": {"matchLabels": {"stator.dev/pipeline": "counts"}}}
    ]
    assert ingress[1]["ports"] == [{"protocol": "TCP", "port": 8081}]
    pod = f"counts-driver-{op.id}"
    assert list(bed.kube.pods) == [pod] and restore_arg(bed) == "latest"
    cfg = job_yaml(bed)
    assert (cfg["parallelism"], cfg["max_parallelism"]) == (2, 64)
    assert cfg["savepoint"]["dir"] == f"file://{tmp_path}/sp"
    assert bed.op is not None and bed.op.step is Step.AWAIT_READY
    assert "DriverCreated" in bed.reasons()

    assert bed.step() > 0  # step 5: the pod is still pending
    assert bed.op is not None and bed.op.step is Step.AWAIT_READY
    bed.start_driver(pod)
    bed.step()
    s = bed.status
    assert "operation" not in s and s["phase"] == "Running"
    assert s["lastReconciledSpec"] == s["lastStableSpec"] == bed.kube.pipeline["spec"]
    assert s["deployment"]["id"] == op.id and s["deployment"]["restoredFrom"] == "latest"
    assert s["deployment"]["driverPod"] == pod
    assert (s["replicas"], s["observedGeneration"]) == (2, 1)
    assert conditions(bed)["Ready"] == ("True", "DriverReady")
    assert bed.reasons() == ["DeployStep", "DriverCreated", "DeployStep", "DeployCompleted"]


def test_defaults_are_the_runtimes_and_not_passed_on(tmp_path: Path) -> None:
    bed = Bed(tmp_path)
    bed.edit_spec(replicas=None, maxParallelism=None)
    bed.kube.pipeline["spec"] = {k: v for k, v in bed.kube.pipeline["spec"].items() if v}
    bed.deploy()
    cfg = job_yaml(bed)
    assert "parallelism" not in cfg and "max_parallelism" not in cfg
    assert bed.status["replicas"] == JobConfig().parallelism
    bed.edit_spec(replicas=JobConfig().parallelism)  # the default, now explicit: no rescale
    bed.step()
    assert bed.op is None and "SpecChanged" not in bed.reasons()


def test_deploy_from_a_readable_initial_savepoint(tmp_path: Path) -> None:
    initial = f"file://{tmp_path}/old/savepoint-1"
    write_savepoint(initial)
    bed = Bed(tmp_path, restore={"initialSavepoint": initial})
    bed.deploy()
    assert restore_arg(bed) == initial and bed.status["deployment"]["restoredFrom"] == initial


def test_an_unreadable_initial_savepoint_deploys_nothing(tmp_path: Path) -> None:
    missing = f"file://{tmp_path}/nothing-here"
    bed = Bed(tmp_path, restore={"initialSavepoint": missing})
    bed.step()
    bed.step()
    assert not bed.kube.pods and bed.op is None
    assert bed.status["phase"] == "Failed"
    assert conditions(bed)["SpecValid"] == ("False", "UnreadableSavepoint")
    assert bed.status["lastError"].startswith("spec.restore.initialSavepoint: ")
    assert missing in bed.status["lastError"]
    assert bed.reasons() == ["InvalidSpec"], "one event per new message"
    write_savepoint(missing)  # now it is there
    bed.step()
    assert conditions(bed)["SpecValid"] == ("True", "Valid") and "lastError" not in bed.status
    assert bed.op is not None and bed.op.restore == missing


def test_an_invalid_spec_is_reported_before_anything_runs(tmp_path: Path) -> None:
    bed = Bed(tmp_path, config={"epoch.max_recods": "10"})
    bed.step()
    assert not bed.kube.pods and bed.op is None and bed.status["phase"] == "Failed"
    assert "unknown config key 'epoch.max_recods'" in bed.status["lastError"]
    assert conditions(bed)["SpecValid"] == ("False", "InvalidSpec")
    bed.edit_spec(config={"epoch.max_records": "10"})
    bed.deploy()
    assert conditions(bed)["SpecValid"] == ("True", "Valid")


@pytest.mark.parametrize(
    "foreign", [("ConfigMap", "counts-config"), ("RoleBinding", "counts-stator")]
)
def test_an_object_of_the_pipelines_name_that_it_does_not_own_is_refused(
    tmp_path: Path, foreign: tuple[str, str]
) -> None:
    """Issue 38: the operator neither replaces nor adopts another's object of the name it
    needs; the deploy waits at its step with SpecValid=False until the name is free."""
    bed = Bed(tmp_path)
    bed.kube.foreign.add(foreign)
    bed.step()
    bed.step()  # step 4 meets the foreign object
    assert not bed.kube.pods, "no driver runs without its objects"
    assert conditions(bed)["SpecValid"] == ("False", "NameTaken")
    assert f"{foreign[0]} {foreign[1]} already exists and is not owned" in bed.status["lastError"]
    assert bed.op is not None and bed.op.step is Step.DEPLOY, "the step is kept, not repeated"
    if foreign[0] == "ConfigMap":
        assert "counts-config" not in bed.kube.configs
    else:
        assert foreign not in bed.kube.objects
    bed.kube.foreign.clear()  # its owner deleted it
    bed.step()
    assert len(bed.kube.pods) == 1
    assert conditions(bed)["SpecValid"] == ("True", "Valid")


@pytest.mark.parametrize("level", [None, "baseline", "privileged"])
def test_a_namespace_that_does_not_enforce_restricted_runs_no_pipeline(
    tmp_path: Path, level: str | None
) -> None:
    """Issue 38: executors are checked by the API server alone, so a pipeline waits with
    SpecValid=False (and the fix in its message) until its namespace enforces the
    restricted Pod Security level; then it deploys without a spec change."""
    bed = Bed(tmp_path)
    bed.kube.namespace = {} if level is None else {ENFORCE_LABEL: level}
    bed.step()
    assert not bed.kube.pods and bed.op is None
    assert conditions(bed)["SpecValid"] == ("False", "InvalidSpec")
    found = "no level" if level is None else repr(level)
    assert found in bed.status["lastError"]
    assert f"{ENFORCE_LABEL}=restricted" in bed.status["lastError"]
    assert "podSecurity.requireRestricted=false" in bed.status["lastError"]
    bed.kube.namespace = {ENFORCE_LABEL: "restricted"}
    bed.deploy()
    assert conditions(bed)["SpecValid"] == ("True", "Valid")


def test_the_namespace_check_is_off_when_the_chart_says_so(tmp_path: Path) -> None:
    bed = Bed(tmp_path)
    bed.kube.namespace = {}
    bed.pipeline_options["require_restricted"] = False
    bed.deploy()
    assert len(bed.kube.pods) == 1 and not bed.status.get("lastError")


def test_an_invalid_change_keeps_the_running_job(tmp_path: Path) -> None:
    bed = Bed(tmp_path)
    bed.deploy()
    bed.edit_spec(config={"parallelism": "9"})
    bed.step()
    assert bed.op is None and bed.status["phase"] == "Running", "the last good spec runs on"
    assert "spec.config.parallelism is set by the operator" in bed.status["lastError"]
    assert len(bed.kube.pods) == 1 and not bed.kube.deleted


# ---------------------------------------------------------------------- watching a driver


def test_the_running_driver_is_mirrored_into_status(tmp_path: Path) -> None:
    bed = Bed(tmp_path)
    driver = bed.deploy()
    driver.job_info = {
        "epoch": 12,
        "state": "RUNNING",
        "parallelism": {"count": 2},
        "latest_checkpoint": {
            "id": 5,
            "epoch": 11,
            "created_ms": 1_700_000_000_000,
            "state_bytes": 1000,
            "incremental_bytes": 100,
            "duration_ms": 3,
            "incremental": True,
        },
        "last_error": "region 'in-a': a task failed once",
        "regions": [
            {
                "id": "in-a",
                "nodes": ["in-a", "count", "out"],
                "state": "RUNNING",
                "epoch": 12,
                "restarts": 1,
                "latest_checkpoint": {"id": 5, "epoch": 11, "created_ms": 1_700_000_000_000},
                "last_error": "a task failed once",
            },
            {
                "id": "in-b",
                "nodes": ["in-b", "out-b"],
                "state": "RUNNING",
                "epoch": 30,
                "restarts": 0,
                "latest_checkpoint": None,
                "last_error": None,
            },
        ],
    }
    assert bed.step() > 0
    s = bed.status
    assert s["regions"] == [
        {
            "id": "in-a",
            "state": "RUNNING",
            "epoch": 12,
            "restarts": 1,
            "latestCheckpoint": 5,
            "lastError": "a task failed once",
        },
        {
            "id": "in-b",
            "state": "RUNNING",
            "epoch": 30,
            "restarts": 0,
            "latestCheckpoint": None,
            "lastError": None,
        },
    ]
    assert (s["epoch"], s["jobState"], s["parallelism"]) == (12, "RUNNING", {"count": 2})
    assert s["latestCheckpoint"] == {
        "id": 5,
        "epoch": 11,
        "time": "2023-11-14T22:13:20Z",
        "stateBytes": 1000,
        "incrementalBytes": 100,
    }
    assert s["lastError"] == "region 'in-a': a task failed once"
    patches = len(bed.kube.patches)
    bed.step()
    assert len(bed.kube.patches) == patches, "nothing new, nothing written"


def test_a_bounded_job_that_ends_is_finished(tmp_path: Path) -> None:
    bed = Bed(tmp_path)
    bed.deploy()
    bed.kube.set_phase(bed.driver_pod(), "Succeeded")
    bed.step()
    bed.step()
    assert bed.status["phase"] == "Finished" and bed.op is None
    assert bed.reasons().count("Finished") == 1


@pytest.mark.parametrize("how", ["failed", "vanished"])
def test_a_failed_driver_restarts_from_the_latest_checkpoint_after_a_backoff(
    tmp_path: Path, how: str
) -> None:
    bed = Bed(tmp_path)
    bed.deploy()
    first = bed.driver_pod()
    if how == "failed":
        bed.kube.set_phase(first, "Failed", exit_code=137)
    else:
        del bed.kube.pods[first]
    bed.step()
    op = bed.op
    assert op is not None and (op.kind, op.step, op.restore) == (
        OpKind.RESTART,
        Step.REMOVE_DRIVER,
        "latest",
    )
    reason = "driver pod Failed (exit 137)" if how == "failed" else "driver pod gone (exit None)"
    assert bed.status["lastError"] == reason
    assert (bed.status["restarts"], bed.status["phase"]) == (1, "Restarting")
    # The default: exponential-backoff from 1 s with 10% jitter, at most 10 restarts.
    failed = [m for _, r, m in bed.events if r == "DriverFailed"]
    assert len(failed) == 1 and re.fullmatch(
        re.escape(f"{reason}; restart 1 of 10, in ") + r"(0\.9|1\.0|1\.1)s", failed[0]
    ), failed
    assert op.not_before is not None and op.not_before > time.time()
    assert bed.step() > 0 and not bed.kube.deleted, "waits out the backoff"
    bed.edit_operation(notBefore=0)
    bed.finish()
    assert restore_arg(bed) == "latest" and bed.status["phase"] == "Running"
    assert bed.status["deployment"]["restoredFrom"] == "latest"
    assert "RestartCompleted" in bed.reasons()


def test_a_driver_that_stops_renewing_its_lease_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A driver whose node is lost keeps its pod Running in the API; its Lease tells. Silent
    for no longer than the Lease's duration: nothing happens; longer: its pod is removed at
    once (no kubelet will confirm it), the job restarts from the latest checkpoint, and the
    Lease is released for the next driver once the old pod is gone."""
    now = [1000.0]
    monkeypatch.setattr(observer, "clock", lambda: now[0])
    bed = Bed(tmp_path)
    bed.deploy()
    first = bed.driver_pod()
    bed.kube.pods[first]["spec"]["nodeName"] = "node-b"
    bed.kube.lease = (first, "2026-11-24T06:00:00+00:00", 15)
    bed.step()
    now[0] += 14  # silent, but within its duration
    bed.step()
    assert bed.op is None and not bed.kube.force_deleted
    bed.kube.lease = (first, "2026-11-24T06:00:14+00:00", 15)  # it renewed: counting anew
    bed.step()
    now[0] += 14.5
    bed.step()
    assert bed.op is None, "silent 14.5 s only since its last renewal"
    now[0] += 1
    bed.step()
    assert bed.kube.force_deleted == [first]
    op = bed.op
    assert op is not None and (op.kind, op.restore) == (OpKind.RESTART, "latest")
    lost = [m for _, r, m in bed.events if r == "DriverLost"]
    assert len(lost) == 1 and f"driver pod {first} on node" in lost[0], lost
    assert "has not renewed its lease for 16 s (lease duration 15 s)" in bed.status["lastError"]
    bed.edit_operation(notBefore=0)
    bed.finish()
    assert bed.kube.lease is not None and bed.kube.lease[0] is None  # released for the next
    assert bed.driver_pod() != first and restore_arg(bed) == "latest"
    # The lost node may look Ready for a while yet: the new driver prefers any other.
    affinity = bed.kube.pods[bed.driver_pod()]["spec"]["affinity"]["nodeAffinity"]
    term = affinity["preferredDuringSchedulingIgnoredDuringExecution"][0]["preference"]
    assert term["matchExpressions"][0]["values"] == ["node-b"]


def test_a_job_the_driver_ended_is_failed_with_its_cause_not_restarted(tmp_path: Path) -> None:
    """Exit 2: the driver ended the job (a user function raising on the same record, bad
    state); its final error line, from the termination message, is the pipeline's cause."""
    bed = Bed(tmp_path)
    bed.deploy()
    pod = bed.driver_pod()
    bed.kube.set_phase(pod, "Failed", exit_code=2)
    cause = "job 'counts' cannot run: KeyError: 'price' in operator 'totals' key 'u1' epoch 3"
    bed.kube.pods[pod]["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = cause
    bed.step()
    s = bed.status
    assert (s["phase"], s["lastError"]) == ("Failed", cause)
    assert bed.op is None and "restarts" not in s and not bed.kube.deleted
    assert ("Warning", "JobFailed", cause) in bed.events
    assert conditions(bed)["Ready"] == ("False", "JobFailed")
    bed.step()
    assert bed.op is None and bed.status["phase"] == "Failed", "stays failed until the spec changes"


def test_a_stop_the_operator_did_not_request_is_not_finished(tmp_path: Path) -> None:
    """A driver stopped with a savepoint by someone else exits 3 (the operator passes
    control.stopped_exit_code): reported, and redeployed from the latest checkpoint."""
    bed = Bed(tmp_path)
    bed.deploy()
    first = bed.driver_pod()
    assert "control.stopped_exit_code=3" in bed.kube.pods[first]["spec"]["containers"][0]["args"]
    bed.kube.set_phase(first, "Failed", exit_code=3)
    bed.step()
    op = bed.op
    assert op is not None and (op.kind, op.restore) == (OpKind.RESTART, "latest")
    assert bed.status["phase"] != "Finished"
    assert "StoppedOutsideOperator" in bed.reasons()
    assert "restarts" not in bed.status, "not a failure: the restart budget is untouched"
    bed.finish()
    assert bed.status["phase"] == "Running" and restore_arg(bed) == "latest"


def test_restarts_exhausted_fail_the_pipeline(tmp_path: Path) -> None:
    bed = Bed(tmp_path, failover={"maxRestarts": 1})
    bed.deploy()
    bed.kube.set_phase(bed.driver_pod(), "Failed", exit_code=1)
    bed.step()
    bed.edit_operation(notBefore=0)
    bed.until(lambda: bed.op is not None and bed.op.step is Step.AWAIT_READY)
    bed.kube.set_phase(bed.driver_pod(), "Failed", exit_code=1)  # fails again, never ready
    bed.step()
    s = bed.status
    assert (s["phase"], s["restarts"], "operation" in s) == ("Failed", 2, False)
    assert conditions(bed)["Ready"] == ("False", "RestartsExhausted")
    assert bed.reasons()[-1] == "Failed"
    events = len(bed.events)
    for _ in range(3):
        bed.step()
    assert len(bed.events) == events and bed.status["restarts"] == 2, "given up: stays so"
    bed.edit_spec(image="stator-runtime:2")  # a new spec is tried
    bed.step()
    assert bed.op is not None and bed.op.kind is OpKind.UPGRADE


def test_a_crash_looping_driver_is_restarted_with_growing_delays(tmp_path: Path) -> None:
    """The operator restarts a failed driver pod by the job's restart strategy: here
    exponential-backoff from 2 s, x3, capped at 10 s, no jitter, at most 4 restarts."""
    failover = {
        "restartStrategy": "exponential-backoff",
        "maxRestarts": 4,
        "restartDelaySeconds": 2,
        "maxRestartDelaySeconds": 10,
        "backoffMultiplier": 3,
        "backoffJitter": 0,
    }
    bed = Bed(tmp_path, failover=failover)
    bed.deploy()
    waits = []
    for _ in range(4):
        bed.kube.set_phase(bed.driver_pod(), "Failed", exit_code=1)
        bed.step()
        op = bed.op
        assert op is not None and op.kind is OpKind.RESTART and op.not_before is not None
        waits.append(round(op.not_before - time.time()))
        bed.edit_operation(notBefore=0)
        bed.finish()
    assert waits == [2, 6, 10, 10]
    assert bed.status["restartHistory"]["count"] == 4
    bed.kube.set_phase(bed.driver_pod(), "Failed", exit_code=1)
    bed.step()
    s = bed.status
    assert (s["phase"], s["restarts"], bed.op) == ("Failed", 5, None)
    assert "exponential-backoff allows 4" in conditions_message(bed, "Ready")


def test_a_new_spec_gets_a_fresh_restart_budget(tmp_path: Path) -> None:
    failover = {"restartStrategy": "fixed-delay", "maxRestarts": 1}
    bed = Bed(tmp_path, failover=failover, upgradeMode="last-state")
    bed.deploy()
    bed.kube.set_phase(bed.driver_pod(), "Failed", exit_code=1)
    bed.step()
    assert bed.status["restartHistory"]["count"] == 1
    bed.edit_operation(notBefore=0)
    bed.finish()
    bed.edit_spec(image="stator-runtime:2")
    bed.finish()
    assert "restartHistory" not in bed.status
    bed.kube.set_phase(bed.driver_pod(), "Failed", exit_code=1)
    bed.step()
    assert bed.op is not None and bed.op.kind is OpKind.RESTART, "one restart allowed again"


def test_a_first_deployment_that_never_gets_ready_restarts(tmp_path: Path) -> None:
    bed = Bed(tmp_path)
    bed.until(lambda: bed.op is not None and bed.op.step is Step.AWAIT_READY)
    bed.edit_operation(stepStartedAt=LONG_AGO)
    bed.step()
    op = bed.op
    assert op is not None and op.kind is OpKind.RESTART
    assert bed.status["lastError"] == "driver not ready within 300s"


# ---------------------------------------------------------------------- spec changes


def test_fields_with_their_own_flows_do_not_redeploy(tmp_path: Path) -> None:
    bed = Bed(tmp_path)
    bed.deploy()
    bed.edit_spec(
        deletion={"finalSavepoint": False},
        savepoints={"directory": f"file://{tmp_path}/sp", "historyMaxCount": 3},
        failover={"readinessTimeoutSeconds": 60},
    )
    bed.step()
    assert bed.op is None and bed.status["phase"] == "Running"
    assert "SpecChanged" not in bed.reasons() and not bed.kube.deleted
    assert "lastError" not in bed.status


def test_a_new_initial_savepoint_on_a_running_pipeline_is_refused(tmp_path: Path) -> None:
    """Only the first deployment reads it: accepting the edit would change nothing."""
    initial = f"file://{tmp_path}/old/savepoint-1"
    write_savepoint(initial)
    bed = Bed(tmp_path, restore={"initialSavepoint": initial})
    bed.deploy()
    first = bed.driver_pod()
    other = f"file://{tmp_path}/old/savepoint-2"
    write_savepoint(other)
    bed.edit_spec(restore={"initialSavepoint": other})
    bed.step()
    assert bed.op is None and bed.driver_pod() == first and bed.status["phase"] == "Running"
    assert conditions(bed)["SpecValid"] == ("False", "InvalidSpec")
    assert conditions_message(bed, "SpecValid") == (
        f"spec.restore.initialSavepoint changed from {initial} to {other}: only the first "
        f"deployment restores from it, and this pipeline runs from its own checkpoints and "
        f"savepoints; put it back (or remove it), or delete the pipeline and apply it again "
        f"to start from {other}"
    )
    bed.edit_spec(restore={})  # removing it is fine: it was read already
    bed.step()
    assert conditions(bed)["SpecValid"] == ("True", "Valid") and bed.driver_pod() == first


def test_a_rescale_stops_with_a_savepoint_and_restores_it(tmp_path: Path) -> None:
    bed = Bed(tmp_path)
    driver = bed.deploy()
    first = bed.driver_pod()
    bed.edit_spec(replicas=4)
    bed.step()
    op = bed.op
    assert op is not None
    assert (op.kind, op.step, op.mode) == (OpKind.RESCALE, Step.SAVEPOINT, UpgradeMode.SAVEPOINT)
    assert bed.status["phase"] == "Rescaling"
    assert ("Normal", "SpecChanged", "rescale (savepoint): replicas") in bed.events

    bed.step()  # 1 -> 2
    op = bed.op
    assert op is not None and op.step is Step.AWAIT_SAVEPOINT and op.savepoint_request == "req1"
    assert driver.requests["req1"]["stop"] is True
    # Canonical whatever spec.savepoints.formatType says: a rescale reads only what it owns.
    assert driver.requests["req1"]["format_type"] == "canonical"
    assert bed.step() > 0 and bed.op is not None and bed.op.step is Step.AWAIT_SAVEPOINT

    location = f"file://{tmp_path}/sp/team.counts/savepoint-0000000007-req1"
    driver.complete("req1", location)
    bed.step()  # 2 -> 3
    op = bed.op
    assert op is not None and (op.step, op.restore, op.savepoint) == (
        Step.REMOVE_DRIVER,
        location,
        location,
    )
    history = bed.status["savepoints"]
    assert [(h["path"], h["trigger"], h["epoch"]) for h in history] == [(location, "rescale", 7)]
    assert conditions(bed)["SavepointSucceeded"] == ("True", "Completed")

    assert bed.step() > 0 and bed.kube.deleted == [first]  # 3: asked to go, still there
    bed.step()  # 3 -> 4: gone
    assert bed.op is not None and bed.op.step is Step.DEPLOY and not bed.kube.pods
    bed.finish()
    assert restore_arg(bed) == location and job_yaml(bed)["parallelism"] == 4
    s = bed.status
    assert (s["phase"], s["replicas"], s["deployment"]["restoredFrom"]) == (
        "Running",
        4,
        location,
    )
    assert conditions(bed)["UpgradeSucceeded"] == ("True", "Completed")
    steps = [m for _, r, m in bed.events if r == "RescaleStep"]
    assert steps == [
        "rescale: step 1 (savepoint)",
        "rescale: step 2 (await-savepoint)",
        "rescale: step 3 (remove-driver)",
        "rescale: step 4 (deploy)",
        "rescale: step 5 (await-ready)",
    ]
    assert bed.reasons()[-1] == "RescaleCompleted"


def test_the_downtime_of_a_rescale_is_split_by_step_and_a_restart_replaces_it(
    tmp_path: Path,
) -> None:
    bed = Bed(tmp_path)
    driver = bed.deploy()
    bed.edit_spec(replicas=4)
    bed.step()  # start
    bed.step()  # 1 -> 2
    # The epoch in flight ends 0.1 s after the request (the old driver still processes),
    # then the savepoint's epoch takes a while.
    stopped_at = int(time.time() * 1000) + 100
    time.sleep(0.3)
    location = f"file://{tmp_path}/sp/team.counts/savepoint-0000000007-req1"
    driver.complete("req1", location, started_ms=stopped_at)
    new = bed.finish()
    last = bed.status["lastOperation"]
    steps = last["stepSeconds"]
    labels = ["savepoint", "await-savepoint", "remove-driver", "deploy", "await-ready"]
    assert (last["kind"], set(steps)) == ("rescale", set(labels))
    assert steps["await-savepoint"] >= 0.3 and all(v >= 0 for v in steps.values())
    assert last["totalSeconds"] == pytest.approx(sum(steps.values()), abs=0.02)
    completed = next(m for _, r, m in bed.events if r == "RescaleCompleted")
    assert re.search(r"\(.*await-savepoint \d+\.\d s.*\)$", completed), completed

    # The new driver reports its start-up; once its first epoch ended, the downtime is known.
    ready = last["readyAtMs"]
    deployed = ready - 1000 * steps["await-ready"]
    startup: dict[str, int | None] = {
        "process_started_ms": int(deployed + 1000),
        "driver_started_ms": int(deployed + 2500),
        "spark_ready_ms": int(deployed + 6000),
        "recovered_ms": int(deployed + 6200),
        "first_epoch_ms": None,
    }
    new.job_info = {**new.job_info, "startup": startup}
    bed.step()
    assert "downtimeSeconds" not in bed.status["lastOperation"], "no first epoch yet"
    new.job_info = {
        **new.job_info,
        "startup": {**startup, "first_epoch_ms": int(deployed + 9200)},
    }
    bed.step()
    last = bed.status["lastOperation"]
    assert last["driverStartupSeconds"] == {
        "pod-start": 1.0,
        "python-start": 1.5,
        "spark-session": 3.5,
        "recovery": 0.2,
        "first-epoch": 3.0,
    }
    # From the old driver's last record to the new driver's first epoch: the epoch in flight
    # when the savepoint was asked for is not downtime.
    assert last["downtimeSeconds"] == pytest.approx((deployed + 9200 - stopped_at) / 1000, abs=0.01)
    operator_share = steps["savepoint"] + steps["await-savepoint"] + steps["remove-driver"]
    assert last["downtimeSeconds"] < operator_share + steps["deploy"] + 9.2
    again = next(m for _, r, m in bed.events if r == "ProcessingAgain")
    assert "first epoch" in again and "spark-session 3.5 s" in again, again
    events = len(bed.events)
    bed.step()
    assert len(bed.events) == events, "reported once"

    del bed.kube.pods[bed.driver_pod()]  # then the driver dies: a restart, steps 3-5
    bed.step()
    bed.edit_operation(notBefore=0)
    bed.finish()
    last = bed.status["lastOperation"]
    assert last["kind"] == "restart"
    assert set(last["stepSeconds"]) == {"remove-driver", "deploy", "await-ready"}


def test_a_rescaled_driver_with_nothing_to_read_is_processing_again_when_caught_up(
    tmp_path: Path,
) -> None:
    """The input ended: the new driver runs no epoch, but found nothing to read; the flow's
    downtime ends there (it would otherwise wait for the next input, counting the idle time)."""
    bed = Bed(tmp_path)
    driver = bed.deploy()
    bed.edit_spec(replicas=4)
    bed.step()
    bed.step()
    stopped_at = int(time.time() * 1000)
    location = f"file://{tmp_path}/sp/team.counts/savepoint-0000000007-req1"
    driver.complete("req1", location, started_ms=stopped_at)
    new = bed.finish()
    last = bed.status["lastOperation"]
    deployed = last["readyAtMs"] - 1000 * last["stepSeconds"]["await-ready"]
    startup = {"recovered_ms": int(deployed + 300), "caught_up_ms": int(deployed + 800)}
    new.job_info = {**new.job_info, "startup": startup}
    bed.step()
    last = bed.status["lastOperation"]
    assert last["driverStartupSeconds"] == {"recovery": 0.3, "caught-up": 0.5}, last
    assert last["downtimeSeconds"] == pytest.approx((deployed + 800 - stopped_at) / 1000, abs=0.01)
    again = next(m for _, r, m in bed.events if r == "ProcessingAgain")
    assert "was caught up (nothing to read)" in again and "caught-up 0.5 s" in again, again


def test_a_rescale_after_the_input_ended_finishes_instead_of_rolling_back(tmp_path: Path) -> None:
    bed = Bed(tmp_path)
    driver = bed.deploy()
    bed.edit_spec(replicas=4)
    bed.step()
    stopped_with_savepoint(bed, driver, f"file://{tmp_path}/sp/team.counts/savepoint-7-req1")
    bed.until(lambda: bed.op is not None and bed.op.step is Step.AWAIT_READY)
    assert bed.op is not None
    pod = f"counts-driver-{bed.op.id}"
    bed.start_driver(pod).state = "FINISHED"
    bed.kube.set_phase(pod, "Succeeded", exit_code=0)  # restored, nothing left, ended
    bed.step()
    bed.step()
    s = bed.status
    assert not bed.op and s["phase"] == "Finished" and s["replicas"] == 4
    assert "UpgradeFailed" not in bed.reasons() and "failedSpec" not in s


def prestarted_rescale(bed: Bed, **change: Any) -> tuple[FakeDriver, str, str]:
    """Deploy with pre-started drivers on, ask for replicas 4 (or ``change``), and run step 0
    until the new driver waits: the old driver, the old pod and the new pod."""
    old = bed.deploy()
    first = bed.driver_pod()
    bed.edit_spec(**(change or {"replicas": 4}))
    bed.step()
    op = bed.op
    kind = OpKind.UPGRADE if change else OpKind.RESCALE
    assert op is not None and (op.kind, op.step) == (kind, Step.PRESTART)
    assert bed.step() > 0  # 0: the new driver pod is created
    new_pod = f"counts-driver-{op.id}"
    args = args_of(bed, new_pod)
    assert "--await-handover" in args and "--restore" not in args
    assert bed.events[-1][1] == "DriverPrestarted"
    bed.step()  # still pending: step 0 waits, the old driver is untouched
    assert bed.op is not None and bed.op.step is Step.PRESTART and not bed.kube.deleted
    assert not old.requests
    return old, first, new_pod


def test_a_rescale_prestarts_the_new_driver_and_hands_it_the_savepoint(tmp_path: Path) -> None:
    bed = Bed(tmp_path, driver={"prestart": True})
    old, first, new_pod = prestarted_rescale(bed)
    new = bed.start_driver(new_pod)
    new.state = "CREATED"  # starting: not waiting yet
    bed.step()
    assert bed.op is not None and bed.op.step is Step.PRESTART
    new.state = "STANDBY"
    bed.step()  # 0 -> 1
    op = bed.op
    assert op is not None and op.step is Step.SAVEPOINT and op.prestarted
    location = f"file://{tmp_path}/sp/team.counts/savepoint-0000000007-req1"
    bed.step()  # 1 -> 2
    assert bed.step() == flows.QUICK_S, "the old driver is stopping: look again soon"
    op = bed.op
    assert op is not None and op.savepoint_request
    stopped_at = int(time.time() * 1000) - 3000  # the old driver's savepoint epoch began
    old.complete(op.savepoint_request, location, started_ms=stopped_at)
    bed.step()  # 2 -> 3
    bed.step()  # 3: the old driver stopped processing: hand over before removing it
    assert new.handed_over == [(location, False)] and not bed.kube.deleted
    assert bed.op is not None and bed.op.step is Step.REMOVE_DRIVER and bed.op.handed_over_ms
    time.sleep(0.2)  # the old pod takes a while to go: the new driver restores meanwhile
    bed.step()  # 3: only the old driver is asked to go
    assert bed.kube.deleted == [first] and new_pod in bed.kube.pods
    bed.step()  # 3 -> 4: the old one is gone
    assert bed.op is not None and bed.op.step is Step.DEPLOY and list(bed.kube.pods) == [new_pod]
    bed.step()  # 4: nothing left to do
    assert new.handed_over == [(location, False)], "handed over once"
    assert bed.op is not None and bed.op.step is Step.AWAIT_READY
    assert (
        "Normal",
        "DriverCreated",
        f"driver pod {new_pod} restoring from {location} (pre-started, handed over at step 3)",
    ) in bed.events
    new.state = "RUNNING"
    bed.until(lambda: not bed.op)
    s = bed.status
    assert (s["phase"], s["replicas"], s["deployment"]["driverPod"]) == ("Running", 4, new_pod)
    assert s["deployment"]["restoredFrom"] == location and job_yaml(bed)["parallelism"] == 4
    steps = [m for _, r, m in bed.events if r == "RescaleStep"]
    assert steps[0] == "rescale: step 0 (prestart)" and len(steps) == 6

    # Downtime runs from the old driver's last record (its savepoint epoch began) to the end
    # of the new driver's first epoch.
    last = s["lastOperation"]
    assert last["processingStoppedAtMs"] == stopped_at
    seconds = last["stepSeconds"]
    assert seconds["prestart"] >= 0  # recorded (a KeyError if not), not counted below
    handed = last["handedOverAtMs"]  # at step 3: the split of the start-up starts there
    assert last["readyAtMs"] - 1000 * seconds["await-ready"] >= handed + 150
    startup: dict[str, int | None] = {
        "process_started_ms": int(handed - 9000),  # all before the hand-over
        "driver_started_ms": int(handed - 7000),
        "spark_ready_ms": int(handed - 2000),
        "handover_ms": int(handed + 100),
        "recovered_ms": int(handed + 400),
        "first_epoch_ms": int(handed + 2400),
    }
    new.job_info = {**new.job_info, "startup": startup}
    bed.step()
    last = bed.status["lastOperation"]
    assert last["driverStartupSeconds"] == {
        "pod-start": 0.0,
        "python-start": 0.0,
        "handover": 0.1,
        "spark-session": 0.0,
        "recovery": 0.3,
        "first-epoch": 2.0,
    }
    assert last["downtimeSeconds"] == pytest.approx((handed + 2400 - stopped_at) / 1000, abs=0.01)


def test_the_running_driver_stays_mirrored_while_the_new_one_is_prestarted(
    tmp_path: Path,
) -> None:
    """Step 0 lasts as long as the new driver's start (a minute on a loaded machine): the
    old driver still processes, and its lag must not freeze in status meanwhile."""
    bed = Bed(tmp_path, driver={"prestart": True})
    old, _, new_pod = prestarted_rescale(bed)
    old.job_info = {**old.job_info, "epoch": 40, "lag_records": 2322}
    bed.step()
    assert bed.op is not None and bed.op.step is Step.PRESTART
    assert (bed.status["epoch"], bed.status["lagRecords"]) == (40, 2322)
    old.job_info = {**old.job_info, "epoch": 55, "lag_records": 19338}
    bed.step()
    assert (bed.status["epoch"], bed.status["lagRecords"]) == (55, 19338)
    assert bed.status["replicas"] != 4, "the running parallelism until the hand-over"
    new = bed.start_driver(new_pod)
    new.state = "STANDBY"
    bed.step()  # 0 -> 1: from here the old driver stops; its last answer stays
    assert bed.op is not None and bed.op.step is Step.SAVEPOINT
    old.job_info = {**old.job_info, "epoch": 56, "lag_records": 1}
    bed.step()
    assert bed.status["epoch"] == 55


def test_an_upgrade_s_prestarted_driver_with_executor_pods_is_handed_over_after_the_old_one_left(
    tmp_path: Path,
) -> None:
    """At the same parallelism its executors take over the running ones' StatefulSet and
    claims (their local state is the savepoint's), which the old driver's still hold: Spark
    starts after the hand-over, once the old executors are gone."""
    bed = Bed(tmp_path, driver={"prestart": True}, executor={"cores": 1})
    old, first, new_pod = prestarted_rescale(bed, image="stator-runtime:2")
    assert "--start-executors" not in args_of(bed, new_pod)
    assert job_yaml(bed)["spark"]["conf"]["spark.app.id"] == spark_app_id("team", "counts")
    bed.kube.executor_pods = {f"spark-s-{spark_app_id('team', 'counts')}-0-0": "n0"}
    new = bed.start_driver(new_pod)
    new.state = "STANDBY"
    bed.step()  # 0 -> 1
    location = f"file://{tmp_path}/sp/team.counts/savepoint-0000000007-req1"
    stopped_with_savepoint(bed, old, location)  # 1 -> 2 -> 3
    bed.step()  # 3: the old driver is asked to go, and nothing is handed over yet
    assert bed.kube.deleted == [first] and not new.handed_over
    bed.step()
    bed.step()  # the old driver is gone, its executors not yet
    assert bed.op is not None and bed.op.step is Step.REMOVE_DRIVER and not new.handed_over
    bed.kube.executor_pods.clear()  # garbage-collected with their driver
    bed.until(lambda: bed.op is not None and bed.op.step is Step.DEPLOY)
    assert not new.handed_over and bed.op is not None and bed.op.handed_over_ms is None
    bed.step()  # 4: the hand-over
    assert new.handed_over == [(location, False)]
    assert bed.op is not None and bed.op.step is Step.AWAIT_READY


def test_a_rescale_s_prestarted_driver_with_executor_pods_runs_a_set_of_its_own(
    tmp_path: Path,
) -> None:
    """A rescale reads the savepoint whatever the old executors hold: the new driver starts
    its own executor set (StatefulSet, claims) before the old driver stops, is handed over as
    soon as the stop-with-savepoint completed, and the old set's claims are deleted once it
    runs. A later restart takes the new set over."""
    bed = Bed(tmp_path, driver={"prestart": True}, executor={"cores": 1}, localRecovery=LOCAL)
    base = spark_app_id("team", "counts")
    old, first, new_pod = prestarted_rescale(bed)
    op = bed.op
    assert op is not None and op.new_executor_set and op.executor_set == f"{base}-{op.id}"
    assert "--start-executors" in args_of(bed, new_pod)
    assert job_yaml(bed)["spark"]["conf"]["spark.app.id"] == op.executor_set
    # The old set's executors and claims, and the new set's, side by side.
    executor_pods(bed, ["n0", "n1"])
    mine = [f"spark-s-{op.executor_set}-0-{i}" for i in range(4)]
    bed.kube.executor_pods.update(dict.fromkeys(mine, "n2"))
    bed.kube.claims |= {f"stator-state-{p}" for p in mine}
    new = bed.start_driver(new_pod)
    new.state = "STANDBY"
    bed.step()  # 0 -> 1
    location = f"file://{tmp_path}/sp/team.counts/savepoint-0000000007-req1"
    stopped_with_savepoint(bed, old, location)  # 1 -> 2 -> 3
    bed.step()  # 3: handed over before the old driver is asked to go
    assert new.handed_over == [(location, False)] and bed.kube.deleted == []
    bed.until(lambda: bed.op is not None and bed.op.step is Step.AWAIT_READY)
    assert bed.kube.deleted == [first]  # its executors may still be going: nobody waits
    new.state = "RUNNING"
    bed.until(lambda: not bed.op)
    assert bed.status["deployment"]["executorSet"] == op.executor_set
    assert bed.kube.claims == {f"stator-state-{p}" for p in mine}  # the old set's are gone
    # A restart (the driver fails) runs the same set: its executors restore locally.
    bed.kube.set_phase(new_pod, "Failed", exit_code=1)
    bed.step()
    restart = bed.op
    assert restart is not None and restart.kind is OpKind.RESTART
    assert restart.executor_set == op.executor_set and not restart.new_executor_set
    bed.edit_operation(notBefore=0)  # past the restart backoff
    bed.step()
    bed.step()  # the failed driver is gone, its executors not yet: they hold the set
    assert bed.op is not None and bed.op.step is Step.REMOVE_DRIVER
    bed.kube.executor_pods.clear()
    bed.until(lambda: bed.op is not None and bed.op.step is Step.AWAIT_READY)
    assert job_yaml(bed)["spark"]["conf"]["spark.app.id"] == op.executor_set


def test_a_rescale_given_up_before_it_began_deletes_its_executor_set_s_claims(
    tmp_path: Path,
) -> None:
    bed = Bed(tmp_path, driver={"prestart": True}, executor={"cores": 1}, localRecovery=LOCAL)
    old_pods = executor_pods(bed, ["n0", "n1"])
    _, _, new_pod = prestarted_rescale(bed)
    op = bed.op
    assert op is not None and op.executor_set is not None
    bed.kube.claims.add(f"stator-state-spark-s-{op.executor_set}-0-0")
    bed.kube.set_phase(new_pod, "Failed", exit_code=2)  # it refused to start
    bed.step()
    assert bed.op is None and bed.status["phase"] == "Running"
    assert bed.kube.claims == {f"stator-state-{p}" for p in old_pods}


def test_a_fallback_to_the_latest_checkpoint_hands_over_only_after_the_old_driver_left(
    tmp_path: Path,
) -> None:
    """Without a completed stop-with-savepoint the old driver may still be processing."""
    bed = Bed(tmp_path, driver={"prestart": True})
    old, first, new_pod = prestarted_rescale(bed)
    new = bed.start_driver(new_pod)
    new.state = "STANDBY"
    bed.step()  # 0 -> 1
    bed.step()  # 1 -> 2
    op = bed.op
    assert op is not None and op.savepoint_request
    old.fail(op.savepoint_request, "disk full")
    bed.step()  # 2 -> 3 with restore=latest
    assert bed.op is not None and bed.op.restore == "latest"
    bed.step()
    assert bed.kube.deleted == [first] and not new.handed_over
    bed.until(lambda: bed.op is not None and bed.op.step is Step.AWAIT_READY)
    assert new.handed_over == [("latest", False)]


def test_a_prestarted_driver_that_fails_is_replaced_the_usual_way(tmp_path: Path) -> None:
    bed = Bed(tmp_path, driver={"prestart": True})
    old, first, new_pod = prestarted_rescale(bed)
    bed.kube.set_phase(new_pod, "Failed", exit_code=1)
    bed.step()  # 0 -> 1 without it
    op = bed.op
    assert op is not None and op.step is Step.SAVEPOINT and not op.prestarted
    assert bed.events[-2][:2] == ("Warning", "PrestartFailed"), bed.events[-2]
    location = f"file://{tmp_path}/sp/team.counts/savepoint-0000000007-req1"
    stopped_with_savepoint(bed, old, location)
    bed.step()  # 3: both drivers are asked to go
    assert sorted(bed.kube.deleted) == sorted([first, new_pod])
    bed.finish()
    assert restore_arg(bed) == location and "--await-handover" not in args_of(bed)
    assert bed.status["deployment"]["driverPod"] == new_pod


@pytest.mark.parametrize(
    ("executor", "hand_over_at"),
    [(None, Step.REMOVE_DRIVER), ({"cores": 1}, Step.REMOVE_DRIVER)],
    ids=["spark-in-the-driver-pod", "executor-pods"],
)
def test_a_prestarted_driver_gone_before_its_hand_over_is_replaced(
    tmp_path: Path, executor: dict[str, Any] | None, hand_over_at: Step
) -> None:
    bed = Bed(tmp_path, driver={"prestart": True}, **({"executor": executor} if executor else {}))
    old, _, new_pod = prestarted_rescale(bed)
    bed.start_driver(new_pod).state = "STANDBY"
    bed.step()  # 0 -> 1
    location = f"file://{tmp_path}/sp/team.counts/savepoint-0000000007-req1"
    stopped_with_savepoint(bed, old, location)
    bed.until(lambda: bed.op is not None and bed.op.step is hand_over_at)
    del bed.kube.pods[new_pod]  # e.g. its node was drained
    bed.step()  # 3 (or 4 -> 3) without it
    op = bed.op
    assert op is not None and op.step is Step.REMOVE_DRIVER and not op.prestarted
    assert bed.events[-2][:2] == ("Warning", "PrestartFailed")
    bed.finish()
    assert restore_arg(bed) == location and bed.status["phase"] == "Running"


def test_a_hand_over_sent_before_an_operator_restart_is_sent_again(tmp_path: Path) -> None:
    bed = Bed(tmp_path, driver={"prestart": True})
    old, _, new_pod = prestarted_rescale(bed)
    new = bed.start_driver(new_pod)
    new.state = "STANDBY"
    bed.step()
    location = f"file://{tmp_path}/sp/team.counts/savepoint-0000000007-req1"
    stopped_with_savepoint(bed, old, location)
    bed.until(lambda: bed.op is not None and bed.op.step is Step.DEPLOY)
    new.handover(location)  # the previous operator sent it, then died before recording it
    bed.step()
    assert new.handed_over == [(location, False), (location, False)]
    assert bed.op is not None and bed.op.step is Step.AWAIT_READY


@pytest.mark.parametrize(
    ("mode", "first_step", "restore"),
    [
        ("savepoint", Step.SAVEPOINT, None),
        ("last-state", Step.REMOVE_DRIVER, "latest"),
        ("stateless", Step.REMOVE_DRIVER, "none"),
    ],
)
def test_an_upgrade_goes_by_its_upgrade_mode(
    tmp_path: Path, mode: str, first_step: Step, restore: str | None
) -> None:
    bed = Bed(tmp_path, upgradeMode=mode)
    driver = bed.deploy()
    bed.edit_spec(image="stator-runtime:2")
    bed.step()
    op = bed.op
    assert op is not None
    assert (op.kind, op.step, op.mode, op.restore) == (
        OpKind.UPGRADE,
        first_step,
        UpgradeMode(mode),
        restore,
    )
    assert ("Normal", "SpecChanged", f"upgrade ({mode}): image") in bed.events
    if mode == "savepoint":
        restore = f"file://{tmp_path}/sp/team.counts/savepoint-0000000007-req1"
        stopped_with_savepoint(bed, driver, restore)
    else:
        assert not driver.requests, "no savepoint is taken"
    bed.finish()
    assert restore_arg(bed) == restore
    assert ("restore.force_empty=true" in args_of(bed)) is (mode == "stateless")
    assert bed.kube.pods[bed.driver_pod()]["spec"]["containers"][0]["image"] == "stator-runtime:2"
    assert bed.status["lastReconciledSpec"]["image"] == "stator-runtime:2"
    assert bed.reasons()[-1] == "UpgradeCompleted"


def test_a_failed_upgrade_rolls_back_and_is_not_retried(tmp_path: Path) -> None:
    bed = Bed(tmp_path)
    driver = bed.deploy()
    stable = bed.status["lastStableSpec"]
    bed.edit_spec(entrypoint="pipelines.counts:missing")
    bed.step()
    location = f"file://{tmp_path}/sp/team.counts/savepoint-0000000007-req1"
    stopped_with_savepoint(bed, driver, location)
    bed.until(lambda: bed.op is not None and bed.op.step is Step.AWAIT_READY)
    bed.kube.set_phase(bed.driver_pod(), "Failed", exit_code=1)
    bed.step()

    op = bed.op
    assert op is not None
    assert (op.kind, op.step, op.restore) == (OpKind.ROLLBACK, Step.REMOVE_DRIVER, location)
    assert op.target == stable
    stored = bed.status["operation"]
    assert "savepointRequest" not in stored and "mode" not in stored, "replaced whole"
    s = bed.status
    assert s["phase"] == "RollingBack" and s["lastError"] == "driver pod Failed"
    assert s["failedSpec"] == attempt_fingerprint(bed.kube.pipeline["spec"])
    assert conditions(bed)["UpgradeSucceeded"] == ("False", "RolledBack")
    assert ("Warning", "UpgradeFailed", "driver pod Failed; rolling back") in bed.events

    bed.finish()
    assert restore_arg(bed) == location
    assert args_of(bed)[2] == stable["entrypoint"]
    s = bed.status
    assert s["phase"] == "Running" and s["lastReconciledSpec"] == stable
    assert s["lastError"] == "driver pod Failed", "a rollback keeps its cause in view"
    assert bed.reasons()[-1] == "RollbackCompleted"

    changes = bed.reasons().count("SpecChanged")
    for _ in range(3):
        bed.step()
    assert bed.op is None and bed.reasons().count("SpecChanged") == changes, "not retried"
    bed.edit_spec(entrypoint="pipelines.counts:build2")  # any new change is tried
    bed.step()
    assert bed.op is not None and bed.op.kind is OpKind.UPGRADE


def test_an_upgrade_not_ready_in_time_rolls_back_to_the_latest_checkpoint(tmp_path: Path) -> None:
    bed = Bed(tmp_path, upgradeMode="last-state")
    bed.deploy()
    bed.edit_spec(image="stator-runtime:2")
    bed.until(lambda: bed.op is not None and bed.op.step is Step.AWAIT_READY)
    bed.edit_operation(stepStartedAt=LONG_AGO)
    bed.step()
    op = bed.op
    assert op is not None and (op.kind, op.restore) == (OpKind.ROLLBACK, "latest")
    assert bed.status["lastError"] == "driver not ready within 300s"


# ---------------------------------------------------------------------- savepoint failures


def _at_savepoint_step(tmp_path: Path) -> tuple[Bed, FakeDriver]:
    """A running pipeline whose rescale is at step 1."""
    bed = Bed(tmp_path)
    driver = bed.deploy()
    bed.edit_spec(replicas=3)
    bed.step()
    return bed, driver


def _fell_back(bed: Bed, reason: str) -> None:
    op = bed.op
    assert op is not None and (op.step, op.restore, op.savepoint) == (
        Step.REMOVE_DRIVER,
        "latest",
        None,
    )
    assert conditions(bed)["SavepointSucceeded"] == ("False", "FellBackToCheckpoint")
    message = f"{reason}; continuing from the latest completed checkpoint"
    assert [m for _, r, m in bed.events if r == "SavepointFailed"] == [message]


def test_an_unreachable_driver_falls_back_to_the_latest_checkpoint(tmp_path: Path) -> None:
    bed, driver = _at_savepoint_step(tmp_path)
    driver.reachable = False
    bed.step()
    _fell_back(
        bed, f"the driver is unreachable: cannot reach the control API at {driver.url}: refused"
    )
    bed.finish()
    assert restore_arg(bed) == "latest" and bed.status["replicas"] == 3


def test_a_refused_savepoint_falls_back(tmp_path: Path) -> None:
    bed, driver = _at_savepoint_step(tmp_path)
    driver.refuse = (409, "the job has ended")
    bed.step()
    _fell_back(bed, "the driver refused the savepoint: the job has ended")


def test_a_failed_savepoint_falls_back(tmp_path: Path) -> None:
    bed, driver = _at_savepoint_step(tmp_path)
    bed.step()
    driver.fail("req1", "disk full")
    bed.step()
    _fell_back(bed, "savepoint failed: disk full")


def test_a_savepoint_that_takes_too_long_falls_back(tmp_path: Path) -> None:
    bed, _ = _at_savepoint_step(tmp_path)
    bed.step()
    bed.edit_operation(stepStartedAt=LONG_AGO)
    bed.step()
    _fell_back(bed, "savepoint still PENDING after 300s")


def test_the_savepoint_timeout_is_the_specs(tmp_path: Path) -> None:
    # Large canonical savepoints take longer than the default 300 s.
    bed = Bed(tmp_path, savepoints={"directory": f"file://{tmp_path}/sp", "timeoutSeconds": 900})
    bed.deploy()
    bed.edit_spec(replicas=3)
    bed.step()
    bed.step()
    ten_minutes_ago = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 600))
    bed.edit_operation(stepStartedAt=ten_minutes_ago)
    bed.step()
    assert bed.op is not None and bed.op.step is Step.AWAIT_SAVEPOINT, "still waiting"
    bed.edit_operation(stepStartedAt=LONG_AGO)
    bed.step()
    _fell_back(bed, "savepoint still PENDING after 900s")


def test_a_request_the_driver_does_not_know_falls_back(tmp_path: Path) -> None:
    bed, driver = _at_savepoint_step(tmp_path)
    bed.step()
    driver.requests.clear()  # e.g. a driver restarted in between
    bed.step()
    _fell_back(bed, "savepoint failed: no savepoint request with id 'req1'")


def test_a_driver_gone_before_answering_falls_back(tmp_path: Path) -> None:
    bed, driver = _at_savepoint_step(tmp_path)
    bed.step()
    driver.reachable = False
    assert bed.step() > 0, "it may only be busy: ask again"
    bed.kube.set_phase(bed.driver_pod(), "Succeeded")
    bed.step()
    _fell_back(
        bed, f"the driver is unreachable: cannot reach the control API at {driver.url}: refused"
    )


def test_a_driver_gone_after_its_savepoint_is_found_in_storage(tmp_path: Path) -> None:
    bed, driver = _at_savepoint_step(tmp_path)
    bed.step()
    location = f"file://{tmp_path}/sp/team.counts/savepoint-0000000009-req1"
    write_savepoint(location)  # the driver wrote it, stopped and lingered no longer
    write_savepoint(f"file://{tmp_path}/sp/team.counts/savepoint-0000000003-other")
    driver.reachable = False
    bed.step()
    op = bed.op
    assert op is not None and (op.step, op.restore) == (Step.REMOVE_DRIVER, location)
    assert bed.status["savepoints"][-1]["path"] == location


def test_a_stop_requested_before_an_operator_restart_is_adopted(tmp_path: Path) -> None:
    bed, driver = _at_savepoint_step(tmp_path)
    driver.trigger_savepoint(stop=True)  # taken, but the operator died before recording it
    bed.step()
    op = bed.op
    assert op is not None and (op.step, op.savepoint_request) == (Step.AWAIT_SAVEPOINT, "req1")
    assert len(driver.requests) == 1


# ---------------------------------------------------------------------- suspend, resume


def test_suspend_stops_with_a_savepoint_and_resume_restores_it(tmp_path: Path) -> None:
    bed = Bed(tmp_path)
    driver = bed.deploy()
    bed.edit_spec(state="suspended")
    bed.step()
    op = bed.op
    assert op is not None and (op.kind, op.step) == (OpKind.SUSPEND, Step.SAVEPOINT)
    assert bed.status["phase"] == "Suspending"
    location = f"file://{tmp_path}/sp/team.counts/savepoint-0000000007-req1"
    stopped_with_savepoint(bed, driver, location)
    bed.until(lambda: bed.status["phase"] == "Suspended")
    assert bed.op is None and not bed.kube.pods
    assert bed.status["suspendedWith"] == location
    assert ("Normal", "Suspended", f"suspended with {location}") in bed.events
    assert bed.step() == 30.0 and not bed.kube.pods, "stays suspended"

    bed.edit_spec(state="running")
    bed.step()
    op = bed.op
    assert op is not None and (op.kind, op.step, op.restore) == (
        OpKind.RESUME,
        Step.DEPLOY,
        location,
    )
    bed.finish()
    assert restore_arg(bed) == location and bed.status["phase"] == "Running"
    assert bed.reasons()[-1] == "ResumeCompleted"


# ---------------------------------------------------------------------- savepoints alone


def test_a_savepoint_on_demand_does_not_redeploy(tmp_path: Path) -> None:
    bed = Bed(tmp_path)
    driver = bed.deploy()
    bed.edit_spec(savepoints={"directory": f"file://{tmp_path}/sp", "triggerNonce": 1})
    bed.step()
    op = bed.op
    assert op is not None and (op.kind, op.step, op.nonce) == (OpKind.SAVEPOINT, Step.SAVEPOINT, 1)
    assert bed.status["phase"] == "Running"
    location = f"file://{tmp_path}/sp/team.counts/savepoint-0000000007-req1"
    stopped_with_savepoint(bed, driver, location)
    s = bed.status
    assert "operation" not in s and (s["phase"], s["savepointNonce"]) == ("Running", 1)
    assert [h["trigger"] for h in s["savepoints"]] == ["savepoint"]
    assert not bed.kube.deleted and driver.requests["req1"]["stop"] is False
    bed.step()
    assert bed.op is None, "answered once"


def test_a_failed_savepoint_on_demand_is_answered_and_not_retried(tmp_path: Path) -> None:
    bed = Bed(tmp_path)
    driver = bed.deploy()
    driver.refuse = (400, "no")
    bed.edit_spec(savepoints={"directory": f"file://{tmp_path}/sp", "triggerNonce": 5})
    bed.step()
    bed.step()
    s = bed.status
    assert "operation" not in s and s["savepointNonce"] == 5
    assert s["lastError"] == "the driver refused the savepoint: no"
    bed.step()
    assert bed.op is None and len(bed.kube.patches) > 0


def test_periodic_savepoints_keep_a_bounded_history(tmp_path: Path) -> None:
    bed = Bed(tmp_path)
    driver = bed.deploy()
    bed.edit_spec(
        savepoints={
            "directory": f"file://{tmp_path}/sp",
            "periodicSeconds": 60,
            "historyMaxCount": 1,
        }
    )
    bed.step()
    assert bed.op is None, "not due: the deployment is fresh"
    taken = []
    for n in (1, 2):
        bed.kube.pipeline["status"]["deployment"]["readyAt"] = LONG_AGO
        bed.kube.pipeline["status"]["periodicSavepointAt"] = LONG_AGO
        for h in bed.kube.pipeline["status"].get("savepoints", []):
            h["time"] = LONG_AGO
        bed.step()
        op = bed.op
        assert op is not None and (op.kind, op.trigger) == (OpKind.SAVEPOINT, "periodic")
        taken.append(f"file://{tmp_path}/sp/team.counts/savepoint-000000000{n}-req{n}")
        stopped_with_savepoint(bed, driver, taken[-1])
    history = bed.status["savepoints"]
    assert [(h["path"], h["trigger"]) for h in history] == [(taken[1], "periodic")]
    assert not is_savepoint(taken[0]) and is_savepoint(taken[1]), "the pruned one is disposed"


def test_a_lowered_limit_or_an_aged_savepoint_is_pruned_while_the_pipeline_runs(
    tmp_path: Path,
) -> None:
    """Not only at the next savepoint, which may never come without periodic ones."""
    bed = Bed(tmp_path, savepoints={"directory": f"file://{tmp_path}/sp"})
    driver = bed.deploy()
    taken = []
    for n in (1, 2, 3):
        bed.edit_spec(savepoints={"directory": f"file://{tmp_path}/sp", "triggerNonce": n})
        bed.step()
        taken.append(f"file://{tmp_path}/sp/team.counts/savepoint-000000000{n}-req1")
        stopped_with_savepoint(bed, driver, taken[-1])
    assert [h["path"] for h in bed.status["savepoints"]] == taken
    sp = {"directory": f"file://{tmp_path}/sp", "triggerNonce": 3}
    bed.edit_spec(savepoints={**sp, "historyMaxCount": 2})
    bed.step()
    assert [h["path"] for h in bed.status["savepoints"]] == taken[1:]
    assert not is_savepoint(taken[0]) and is_savepoint(taken[1])
    bed.kube.pipeline["status"]["savepoints"][0]["time"] = LONG_AGO
    bed.edit_spec(savepoints={**sp, "historyMaxCount": 2, "historyMaxAgeSeconds": 3600})
    bed.step()
    assert [h["path"] for h in bed.status["savepoints"]] == taken[2:]
    assert not is_savepoint(taken[1]) and is_savepoint(taken[2])


def test_savepoints_of_upgrades_are_pruned_but_left_to_their_owner(tmp_path: Path) -> None:
    bed = Bed(tmp_path, savepoints={"directory": f"file://{tmp_path}/sp", "historyMaxCount": 1})
    driver = bed.deploy()
    bed.edit_spec(replicas=3)
    bed.step()
    rescale = f"file://{tmp_path}/sp/team.counts/savepoint-0000000007-req1"
    stopped_with_savepoint(bed, driver, rescale)
    driver = bed.finish()
    bed.edit_spec(
        savepoints={"directory": f"file://{tmp_path}/sp", "historyMaxCount": 1, "triggerNonce": 1}
    )
    bed.step()
    stopped_with_savepoint(bed, driver, f"file://{tmp_path}/sp/team.counts/savepoint-8-req1")
    assert [h["trigger"] for h in bed.status["savepoints"]] == ["savepoint"]
    assert is_savepoint(rescale)


# ---------------------------------------------------------------------- delete


def test_delete_with_a_final_savepoint(tmp_path: Path) -> None:
    bed = Bed(tmp_path)
    driver = bed.deploy()
    assert bed.delete_step() == 0.0
    op = bed.op
    assert op is not None and (op.kind, op.step) == (OpKind.DELETE, Step.SAVEPOINT)
    assert bed.status["phase"] == "Deleting" and op.delete_started_at
    bed.delete_step()
    location = f"file://{tmp_path}/sp/team.counts/savepoint-0000000007-req1"
    driver.complete("req1", location)
    assert driver.requests["req1"]["stop"] is True
    steps = 0
    while bed.delete_step() is not None:
        steps += 1
        assert steps < 10
    assert not bed.kube.pods and is_savepoint(location)
    assert bed.status["savepoints"][-1]["trigger"] == "delete"
    assert bed.reasons()[-1] == "Deleted"


def test_delete_without_a_final_savepoint_and_disposing_the_history(tmp_path: Path) -> None:
    kept = f"file://{tmp_path}/sp/team.counts/savepoint-0000000001-x"
    write_savepoint(kept)
    bed = Bed(
        tmp_path,
        deletion={"finalSavepoint": False},
        savepoints={"directory": f"file://{tmp_path}/sp", "disposeOnDelete": True},
    )
    driver = bed.deploy()
    bed.kube.pipeline["status"]["savepoints"] = [{"path": kept, "trigger": "savepoint"}]
    bed.delete_step()
    op = bed.op
    assert op is not None and op.step is Step.REMOVE_DRIVER
    while bed.delete_step() is not None:
        pass
    assert not driver.requests and not bed.kube.pods
    assert not is_savepoint(kept)
    assert bed.reasons()[-2:] == ["SavepointsDisposed", "Deleted"]


@pytest.mark.parametrize("dispose_final", [False, True])
def test_disposing_the_history_keeps_the_final_savepoint_unless_asked(
    tmp_path: Path, dispose_final: bool
) -> None:
    """Issue 38: ``disposeOnDelete`` deleted the final savepoint the deletion just took."""
    old = f"file://{tmp_path}/sp/team.counts/savepoint-0000000001-x"
    write_savepoint(old)
    bed = Bed(
        tmp_path,
        deletion={"disposeFinalSavepoint": dispose_final},
        savepoints={"directory": f"file://{tmp_path}/sp", "disposeOnDelete": True},
    )
    driver = bed.deploy()
    bed.kube.pipeline["status"]["savepoints"] = [{"path": old, "trigger": "savepoint"}]
    bed.delete_step()
    bed.delete_step()
    final = f"file://{tmp_path}/sp/team.counts/savepoint-0000000007-req1"
    write_savepoint(final)
    driver.complete("req1", final)
    while bed.delete_step() is not None:
        pass
    assert not is_savepoint(old)
    assert is_savepoint(final) is not dispose_final


def test_a_savepoint_a_driver_reports_outside_the_directory_is_not_recorded(
    tmp_path: Path,
) -> None:
    """Issue 38: a driver runs the user's code; a location it reports elsewhere (to have the
    operator restore from it, or dispose of it later) is neither recorded nor restored."""
    bed = Bed(tmp_path)
    driver = bed.deploy()
    bed.edit_spec(replicas=4)
    bed.step()
    bed.step()
    elsewhere = f"file://{tmp_path}/other-team/savepoint-0000000007-req1"
    write_savepoint(elsewhere)
    driver.complete("req1", elsewhere)
    bed.step()
    assert all(sp["path"] != elsewhere for sp in bed.status.get("savepoints", []))
    op = bed.op
    assert op is None or op.restore != elsewhere
    assert any("outside" in message for _, _, message in bed.events)


def test_delete_never_waits_past_its_timeout(tmp_path: Path) -> None:
    bed = Bed(tmp_path, deletion={"finalSavepoint": True, "timeoutSeconds": 10})
    bed.deploy()
    bed.delete_step()
    bed.delete_step()  # the driver takes its time with the final savepoint
    bed.edit_operation(deleteStartedAt=LONG_AGO)
    assert bed.delete_step() is None
    assert bed.kube.deleted, "the driver is removed regardless"
    assert "DeleteTimedOut" in bed.reasons()


@pytest.mark.parametrize("holder", ["u-1", "u-of-another"])
def test_delete_releases_the_checkpoint_root_it_owns(tmp_path: Path, holder: str) -> None:
    """Issue 38: the pipeline's uid owns its checkpoint root (``checkpoint.owner``); its
    deletion removes the marker, so one created again under the name continues from the
    checkpoints, and leaves another owner's marker alone."""
    bed = Bed(tmp_path, deletion={"finalSavepoint": False})
    bed.deploy()
    job = yaml.safe_load(bed.kube.configs["counts-config"]["data"]["job.yaml"])
    assert job["checkpoint"]["owner"] == "u-1"
    root = open_store(f"file://{tmp_path}/ck/team.counts")
    Ownership(holder).claim(root)
    steps = 0
    while bed.delete_step() is not None:
        steps += 1
        assert steps < 10
    assert read_owner(root) == (None if holder == "u-1" else holder)


def test_delete_of_a_pipeline_that_never_ran(tmp_path: Path) -> None:
    bed = Bed(tmp_path, config={"epoch.max_recods": "1"})
    bed.step()
    bed.delete_step()
    assert bed.op is not None and bed.op.step is Step.REMOVE_DRIVER
    assert bed.delete_step() == 0.0
    assert bed.delete_step() is None


# ---------------------------------------------------------------------- the stored operation

STORED = {
    "kind": "rescale",
    "startedAt": "2026-11-20T10:00:00Z",
    "id": "ab12cd34",
    "target": {"image": "stator-runtime:1", "replicas": 4},
    "mode": "savepoint",
    "rescales": True,
    "step": 2,
    "stepName": "await-savepoint",
    "stepStartedAt": "2026-11-20T10:00:01Z",
    "savepointRequest": "0123456789ab",
}


def test_a_stored_operation_is_read_back_and_written_with_the_same_keys() -> None:
    op = Operation.from_json(STORED)
    assert (op.kind, op.step, op.mode, op.savepoint_request, op.id, op.rescales) == (
        OpKind.RESCALE,
        Step.AWAIT_SAVEPOINT,
        UpgradeMode.SAVEPOINT,
        "0123456789ab",
        "ab12cd34",
        True,
    )
    assert op.to_json() == STORED, "written back with the same keys"
    restart = {
        "kind": "restart",
        "startedAt": "2026-11-20T10:00:00Z",
        "id": "ff00ff00",
        "target": {},
        "restore": "latest",
        "notBefore": 1795000000.5,
        "step": 3,
        "stepName": "remove-driver",
        "stepStartedAt": "2026-11-20T10:00:00Z",
    }
    assert Operation.from_json(restart).not_before == 1795000000.5
    assert Operation.from_json(restart).to_json() == restart
    deleting = {
        **restart,
        "kind": "delete",
        "deleteStartedAt": "2026-11-20T10:00:00Z",
        "done": True,
    }
    assert Operation.from_json(deleting).done is True
    patch = Operation.from_json(STORED).to_patch()
    assert patch["notBefore"] is None and patch["savepointRequest"] == "0123456789ab"
    assert json.loads(json.dumps(patch)) == patch


def test_an_operator_restarted_mid_flow_finishes_the_flow(tmp_path: Path) -> None:
    bed = Bed(tmp_path)
    driver = bed.deploy()
    bed.edit_spec(replicas=4)
    driver.trigger_savepoint(stop=True)
    stored = {
        **STORED,
        "target": bed.kube.pipeline["spec"],
        "savepointRequest": "req1",
        "stepStartedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    bed.kube.pipeline["status"].update(operation=stored, phase="Rescaling")
    location = f"file://{tmp_path}/sp/team.counts/savepoint-0000000007-req1"
    driver.complete("req1", location)
    bed.finish()
    s = bed.status
    assert (s["replicas"], s["deployment"]["id"]) == (4, "ab12cd34")
    assert s["deployment"]["restoredFrom"] == location


# ---------------------------------------------------------------------- executors as pods

LOCAL = {"volume": {"storageClassName": "local-ssd", "size": "10Gi"}}


def executor_pods(bed: Bed, nodes: list[str]) -> list[str]:
    """Executor pods (and their state claims) of the pipeline's StatefulSet, one per node."""
    app = spark_app_id("team", "counts")
    pods = [f"spark-s-{app}-0-{i}" for i in range(len(nodes))]
    bed.kube.executor_pods = dict(zip(pods, nodes, strict=True))
    bed.kube.claims = {f"stator-state-{p}" for p in pods}
    return pods


def test_a_rescale_waits_for_the_old_executors_and_drops_claims_it_no_longer_needs(
    tmp_path: Path,
) -> None:
    """The next driver's executor StatefulSet has the old one's name (and takes its claims
    back): the new driver starts only once the old executors are gone. Rescaled from 4 to 2
    executors, the claims of executors 2 and 3 are deleted once the new driver runs."""
    bed = Bed(tmp_path, replicas=4, executor={"cores": 1}, localRecovery=LOCAL)
    driver = bed.deploy()
    executor_pods(bed, ["n0", "n1", "n2", "n0"])
    bed.edit_spec(replicas=2)
    bed.step()
    stopped_with_savepoint(bed, driver, f"file://{tmp_path}/sp/team.counts/savepoint-7-req1")
    bed.step()  # step 3: the driver is asked to go
    bed.step()  # the driver is gone, its executors not yet
    assert bed.op is not None and bed.op.step is Step.REMOVE_DRIVER
    bed.kube.executor_pods.clear()  # garbage-collected with their driver
    bed.step()
    assert bed.op is not None and bed.op.step is Step.DEPLOY
    bed.finish()
    app = spark_app_id("team", "counts")
    assert bed.kube.claims == {f"stator-state-spark-s-{app}-0-{i}" for i in (0, 1)}
    assert "ClaimsDeleted" in bed.reasons()
    conf = job_yaml(bed)["spark"]["conf"]
    assert conf["spark.executor.instances"] == "2"
    assert conf["spark.app.id"] == app


@pytest.mark.parametrize(("pinning", "moved"), [("preferred", True), ("required", False)])
def test_an_executor_on_a_lost_node_moves_only_when_pinning_is_preferred(
    tmp_path: Path, pinning: str, moved: bool
) -> None:
    bed = Bed(tmp_path, executor={}, localRecovery={**LOCAL, "pinning": pinning})
    bed.deploy()
    pods = executor_pods(bed, ["n0", "n1"])
    bed.step()
    assert "ExecutorsMoved" not in bed.reasons()  # every node is there
    bed.kube.lost_nodes = {"n1"}
    bed.step()
    assert ("ExecutorsMoved" in bed.reasons()) is moved
    assert (pods[1] in bed.kube.executor_pods) is not moved
    assert (f"stator-state-{pods[1]}" in bed.kube.claims) is not moved
    assert pods[0] in bed.kube.executor_pods and f"stator-state-{pods[0]}" in bed.kube.claims


def test_deleting_the_pipeline_deletes_the_executors_claims(tmp_path: Path) -> None:
    bed = Bed(tmp_path, executor={}, localRecovery=LOCAL, deletion={"finalSavepoint": False})
    bed.deploy()
    executor_pods(bed, ["n0", "n1"])
    bed.kube.executor_pods.clear()
    while bed.delete_step() is not None:
        pass
    assert not bed.kube.claims
    assert bed.reasons()[-2:] == ["ClaimsDeleted", "Deleted"]


@pytest.mark.parametrize("method", ["ensure", "apply", "delete_drivers", "executors_left"])
def test_an_api_error_at_any_step_is_retried_without_a_second_driver(
    tmp_path: Path, method: str
) -> None:
    """A Kubernetes call that fails mid-step (kopf retries the handler) leaves the operation
    where it was: the retried step finishes it, with one driver and nothing lost."""
    bed = Bed(tmp_path)
    bed.deploy()
    bed.kube.set_phase(bed.driver_pod(), "Failed", exit_code=137)
    bed.step()
    bed.edit_operation(notBefore=0)
    bed.kube.failing[method] = 2
    failures = 0
    for _ in range(30):
        if bed.op is not None and bed.op.step is Step.AWAIT_READY:
            break
        try:
            bed.step()
        except ApiException:
            failures += 1
    assert failures == 2, f"{method} was called and failed twice"
    op = bed.op
    assert op is not None and (op.kind, op.step) == (OpKind.RESTART, Step.AWAIT_READY)
    live = [p for p, pod in bed.kube.pods.items() if not pod["metadata"].get("deleting")]
    assert live == [f"counts-driver-{op.id}"], "exactly one driver for the restart"
    bed.start_driver()
    bed.until(lambda: not bed.op)
    assert bed.status["phase"] == "Running" and restore_arg(bed) == "latest"


# ---------------------------------------------------------------------- changes that lose state


def test_a_pipeline_created_suspended_runs_nothing_until_it_is_resumed(tmp_path: Path) -> None:
    bed = Bed(tmp_path, state="suspended")
    for _ in range(3):
        assert bed.step() == 30.0
    assert bed.op is None and not bed.kube.pods and bed.status["phase"] == "Suspended"
    assert bed.reasons().count("Suspended") == 1
    bed.edit_spec(state="running")
    bed.step()
    op = bed.op
    assert op is not None and (op.kind, op.restore) == (OpKind.DEPLOY, "latest")


def test_a_last_state_upgrade_to_other_checkpoint_storage_is_refused(tmp_path: Path) -> None:
    # latest would be looked up under the new storage, which holds none of the job's
    # checkpoints: the job would start empty.
    bed = Bed(tmp_path, upgradeMode="last-state")
    bed.deploy()
    first = bed.driver_pod()
    bed.edit_spec(checkpointing={"storage": f"file://{tmp_path}/ck-new"})
    bed.step()
    assert bed.op is None and not bed.kube.deleted and bed.driver_pod() == first
    status, reason = conditions(bed)["SpecValid"]
    assert (status, reason) == ("False", "InvalidSpec")
    assert conditions_message(bed, "SpecValid") == (
        f"spec.checkpointing.storage changed from file://{tmp_path}/ck to file://{tmp_path}/"
        f"ck-new: a last-state upgrade resumes from the latest checkpoint, and this job's "
        f"checkpoints are under file://{tmp_path}/ck; set upgradeMode: savepoint (the savepoint "
        f"carries the state over) or stateless (start empty), or put the storage back"
    )
    bed.edit_spec(upgradeMode="savepoint")  # the savepoint carries the state over
    bed.step()
    assert bed.op is not None and (bed.op.kind, bed.op.step) == (OpKind.UPGRADE, Step.SAVEPOINT)


def test_a_failed_savepoint_gives_up_an_upgrade_to_other_storage(tmp_path: Path) -> None:
    bed = Bed(tmp_path)
    driver = bed.deploy()
    first = bed.driver_pod()
    new_storage = {"storage": f"file://{tmp_path}/ck-new"}
    bed.edit_spec(checkpointing=new_storage)
    bed.step()  # 1
    bed.step()  # 1 -> 2
    driver.fail("req1", "disk full")
    bed.step()
    assert bed.op is None and not bed.kube.deleted and bed.driver_pod() == first
    assert bed.status["failedSpec"] == attempt_fingerprint(bed.kube.pipeline["spec"])
    assert conditions(bed)["UpgradeSucceeded"] == ("False", "NotStarted")
    assert bed.status["lastError"] == (
        f"savepoint failed: disk full; the new spec's checkpoint storage holds none of the "
        f"job's checkpoints (they are under file://{tmp_path}/ck), so the upgrade needs the "
        f"savepoint"
    )
    bed.step()  # the running job is watched, the failed spec not retried
    assert bed.op is None and bed.driver_pod() == first


def test_a_new_driver_that_refuses_to_start_leaves_the_running_job_alone(tmp_path: Path) -> None:
    bed = Bed(tmp_path, driver={"prestart": True})
    old, first, new_pod = prestarted_rescale(bed)
    bed.kube.set_phase(new_pod, "Failed", exit_code=2)  # e.g. replicas above maxParallelism
    bed.step()
    assert bed.op is None and not old.requests, "the running job was not asked to stop"
    assert bed.kube.pods[new_pod]["metadata"].get("deleting") and not bed.kube.deleted
    assert not bed.kube.pods[first]["metadata"].get("deleting")
    assert bed.status["phase"] == "Running"
    assert bed.status["failedSpec"] == attempt_fingerprint(bed.kube.pipeline["spec"])
    assert bed.events[-1][:2] == ("Warning", "UpgradeFailed")


def test_an_upgrade_that_also_changes_replicas_takes_a_canonical_savepoint(
    tmp_path: Path,
) -> None:
    bed = Bed(tmp_path, savepoints={"directory": f"file://{tmp_path}/sp", "formatType": "native"})
    driver = bed.deploy()
    bed.edit_spec(image="stator-runtime:2")  # the same replicas: native, as the spec says
    bed.step()
    bed.step()
    assert [r["format_type"] for r in driver.requests.values()] == ["native"]

    bed = Bed(
        tmp_path / "2", savepoints={"directory": f"file://{tmp_path}/sp", "formatType": "native"}
    )
    driver = bed.deploy()
    bed.edit_spec(image="stator-runtime:2", replicas=3)
    bed.step()
    assert bed.status["operation"]["rescales"] is True, "decided once, recorded write-ahead"
    bed.step()
    assert bed.op is not None and bed.op.kind is OpKind.UPGRADE
    assert [r["format_type"] for r in driver.requests.values()] == ["canonical"]

    # The flow reads the recorded decision; it does not compare the specs again.
    bed = Bed(
        tmp_path / "3", savepoints={"directory": f"file://{tmp_path}/sp", "formatType": "native"}
    )
    driver = bed.deploy()
    bed.edit_spec(image="stator-runtime:2", replicas=3)
    bed.step()
    del bed.kube.pipeline["status"]["operation"]["rescales"]
    bed.step()
    assert [r["format_type"] for r in driver.requests.values()] == ["native"]


def test_a_stopped_driver_s_savepoint_is_looked_for_where_it_wrote_it(tmp_path: Path) -> None:
    # The upgrade also moves the savepoint directory: the old driver wrote into its own.
    bed = Bed(tmp_path)
    driver = bed.deploy()
    bed.edit_spec(image="stator-runtime:2", savepoints={"directory": f"file://{tmp_path}/sp2"})
    bed.step()
    bed.step()
    location = f"file://{tmp_path}/sp/team.counts/savepoint-0000000009-req1"
    write_savepoint(location)
    driver.reachable = False
    bed.step()
    op = bed.op
    assert op is not None and (op.step, op.restore) == (Step.REMOVE_DRIVER, location)


# ---------------------------------------------------------------------- restarts resume their run


def set_arg(bed: Bed, key: str, pod: str | None = None) -> str | None:
    """The value of ``--set key=...`` in the driver pod's arguments, as the driver reads it."""
    args = args_of(bed, pod)
    found = [a.split("=", 1)[1] for a in args if a.startswith(f"{key}=")]
    return str(yaml.safe_load(found[-1])).lower() if found else None


def test_a_restart_before_the_first_checkpoint_resumes_the_initial_savepoint(
    tmp_path: Path,
) -> None:
    # "latest" would find no checkpoint (or another run's) and start the job empty.
    initial = f"file://{tmp_path}/old/savepoint-1"
    write_savepoint(initial)
    bed = Bed(tmp_path, restore={"initialSavepoint": initial})
    bed.until(lambda: bed.op is not None and bed.op.step is Step.AWAIT_READY)
    run = bed.op.id if bed.op else ""
    assert set_arg(bed, "restore.lineage") == run
    bed.edit_operation(stepStartedAt=LONG_AGO)  # e.g. a large restore, OOM-killed
    bed.step()
    op = bed.op
    assert op is not None and (op.kind, op.restore, op.lineage) == (OpKind.RESTART, initial, run)
    bed.edit_operation(notBefore=0)
    bed.finish()
    assert restore_arg(bed) == initial and set_arg(bed, "restore.lineage") == run
    assert bed.status["deployment"]["lineage"] == run

    # The running deployment fails later: the restart continues the same run again (its
    # driver resumes the run's latest checkpoint, else the savepoint it began from).
    bed.kube.set_phase(bed.driver_pod(), "Failed", exit_code=137)
    bed.step()
    op = bed.op
    assert op is not None and (op.kind, op.restore, op.lineage) == (OpKind.RESTART, initial, run)


def test_a_restart_of_a_stateless_upgrade_resumes_its_own_run_not_the_old_one(
    tmp_path: Path,
) -> None:
    bed = Bed(tmp_path, upgradeMode="stateless")
    bed.deploy()
    bed.edit_spec(image="stator-runtime:2")
    bed.finish()
    run = bed.status["deployment"]["id"]
    assert restore_arg(bed) == "none" and set_arg(bed, "restore.force_empty") == "true"
    bed.kube.set_phase(bed.driver_pod(), "Failed", exit_code=137)
    bed.step()
    bed.edit_operation(notBefore=0)
    bed.finish()
    # Its own checkpoints if it has any, else empty again: never the old run's "latest".
    assert restore_arg(bed) == "none" and set_arg(bed, "restore.lineage") == run


def test_a_deployment_status_without_a_lineage_restarts_from_latest(tmp_path: Path) -> None:
    bed = Bed(tmp_path)
    bed.deploy()
    deployment = {k: v for k, v in bed.status["deployment"].items() if k != "lineage"}
    bed.kube.pipeline["status"]["deployment"] = deployment  # a status edited by hand
    bed.kube.set_phase(bed.driver_pod(), "Failed", exit_code=137)
    bed.step()
    op = bed.op
    assert op is not None and (op.restore, op.lineage) == ("latest", None)


def test_a_resume_brings_up_the_last_good_spec_not_one_rolled_back(tmp_path: Path) -> None:
    bed = Bed(tmp_path)
    driver = bed.deploy()
    stable = bed.status["lastStableSpec"]
    bed.edit_spec(entrypoint="pipelines.counts:missing")
    bed.step()
    stopped_with_savepoint(bed, driver, f"file://{tmp_path}/sp/team.counts/savepoint-1-req1")
    bed.until(lambda: bed.op is not None and bed.op.step is Step.AWAIT_READY)
    bed.kube.set_phase(bed.driver_pod(), "Failed", exit_code=1)
    bed.step()
    assert bed.op is not None and bed.op.kind is OpKind.ROLLBACK
    driver = bed.finish()
    assert bed.status["lastReconciledSpec"] == stable
    bed.edit_spec(state="suspended")
    bed.step()
    stopped_with_savepoint(bed, driver, f"file://{tmp_path}/sp/team.counts/savepoint-2-req1")
    bed.until(lambda: bed.status["phase"] == "Suspended")
    bed.edit_spec(state="running")  # the failed entrypoint is still in the spec
    bed.step()
    op = bed.op
    assert op is not None and op.kind is OpKind.RESUME
    assert op.target is not None and op.target["entrypoint"] == stable["entrypoint"]
    assert op.changes_spec is False, "the last good spec: a failure restarts it"


def test_a_resume_of_a_spec_changed_while_suspended_rolls_back_if_it_fails(
    tmp_path: Path,
) -> None:
    """The resume records that it changes the spec (classify's decision), and its failure
    rolls back because of that record."""
    bed = Bed(tmp_path)
    driver = bed.deploy()
    stable = bed.status["lastStableSpec"]
    bed.edit_spec(state="suspended")
    bed.step()
    location = f"file://{tmp_path}/sp/team.counts/savepoint-0000000007-req1"
    stopped_with_savepoint(bed, driver, location)
    bed.until(lambda: bed.status["phase"] == "Suspended")
    bed.edit_spec(state="running", entrypoint="pipelines.counts:missing")
    bed.until(lambda: bed.op is not None and bed.op.step is Step.AWAIT_READY)
    assert bed.op is not None and bed.op.changes_spec is True
    bed.kube.set_phase(bed.driver_pod(), "Failed", exit_code=1)
    bed.step()
    op = bed.op
    assert op is not None and (op.kind, op.restore) == (OpKind.ROLLBACK, location)
    assert op.target is not None and op.target["entrypoint"] == stable["entrypoint"]


def test_observed_generation_is_the_one_the_flow_brought_up(tmp_path: Path) -> None:
    bed = Bed(tmp_path, upgradeMode="last-state")
    bed.deploy()
    bed.kube.pipeline["metadata"]["generation"] = 2
    bed.edit_spec(image="stator-runtime:2")
    bed.until(lambda: bed.op is not None and bed.op.step is Step.AWAIT_READY)
    bed.kube.pipeline["metadata"]["generation"] = 3  # applied while the upgrade runs
    bed.edit_spec(image="stator-runtime:3")
    bed.finish()
    assert bed.status["observedGeneration"] == 2
    assert bed.status["lastReconciledSpec"]["image"] == "stator-runtime:2"


def test_a_resumed_last_good_spec_is_not_upgraded_again_to_the_failed_one(
    tmp_path: Path,
) -> None:
    bed = Bed(tmp_path)
    driver = bed.deploy()
    bed.edit_spec(entrypoint="pipelines.counts:missing")
    bed.step()
    stopped_with_savepoint(bed, driver, f"file://{tmp_path}/sp/team.counts/savepoint-1-req1")
    bed.until(lambda: bed.op is not None and bed.op.step is Step.AWAIT_READY)
    bed.kube.set_phase(bed.driver_pod(), "Failed", exit_code=1)
    bed.step()
    driver = bed.finish()  # rolled back
    bed.edit_spec(state="suspended")
    bed.step()
    stopped_with_savepoint(bed, driver, f"file://{tmp_path}/sp/team.counts/savepoint-2-req1")
    bed.until(lambda: bed.status["phase"] == "Suspended")
    bed.edit_spec(state="running")
    bed.finish()  # the last good spec resumed
    assert bed.status["failedSpec"], "still the failed spec's: not retried"
    for _ in range(3):
        bed.step()
    assert bed.op is None, "no upgrade to the failed spec right after the resume"
    bed.edit_spec(entrypoint="pipelines.counts:build2")  # a new spec is tried
    bed.step()
    assert bed.op is not None and bed.op.kind is OpKind.UPGRADE


def test_a_longer_savepoint_timeout_retries_an_upgrade_given_up(tmp_path: Path) -> None:
    bed = Bed(tmp_path)
    driver = bed.deploy()
    bed.edit_spec(checkpointing={"storage": f"file://{tmp_path}/ck-new"})
    bed.step()
    bed.step()
    driver.fail("req1", "timed out in the store")
    bed.step()
    assert bed.op is None and bed.status["failedSpec"]
    bed.edit_spec(savepoints={"directory": f"file://{tmp_path}/sp", "timeoutSeconds": 900})
    bed.step()
    assert bed.op is not None and bed.op.kind is OpKind.UPGRADE, "any change tries again"


def test_a_stop_for_an_upgrade_to_other_storage_is_waited_out_past_the_timeout(
    tmp_path: Path,
) -> None:
    # Given up, the stop would still land and end the running job: it is waited for.
    bed = Bed(tmp_path)
    bed.deploy()
    bed.edit_spec(checkpointing={"storage": f"file://{tmp_path}/ck-new"})
    bed.step()
    bed.step()
    bed.edit_operation(stepStartedAt=LONG_AGO)
    bed.step()
    op = bed.op
    assert op is not None and op.step is Step.AWAIT_SAVEPOINT


def test_a_drivers_answer_reaches_status_bounded(tmp_path: Path) -> None:
    """Issue 38: a driver runs the user's code; what it answers is cut to sizes etcd and the
    operator can hold, and a malformed answer is an error in status, not a crash per tick."""
    bed = Bed(tmp_path)
    driver = bed.deploy()
    entry = {"subtask": 0, "executor": "e" * 5000, "parallelism": 2}
    subtasks = {f"op{i}": [entry] * 100 for i in range(100)}
    region = {"id": "r", "state": "RUNNING", "epoch": 5, "restarts": 0, "last_error": "y" * 99_999}
    driver.job_info = {
        "job": "team.counts",
        "epoch": 5,
        "parallelism": {f"op{i}": 2 for i in range(100)},
        "last_error": "x" * 1_000_000,
        "regions": [region] * 5000,
        "placement": {"keyed_tasks": 1, "subtasks": subtasks},
    }
    bed.step()
    status = bed.status
    assert len(json.dumps(status)) < 1_000_000
    assert status["lastError"].endswith("(cut)") and len(status["lastError"]) < 3000
    assert len(status["regions"]) <= 256
    driver.job_info = {"job": "team.counts", "epoch": 6, "latest_checkpoint": {"id": 1}}
    bed.step()
    assert "the driver's status could not be read" in bed.status["lastError"]


def test_a_stored_spec_is_checked_again_before_a_pod_is_made_of_it(tmp_path: Path) -> None:
    """Issue 38: a flow's target (e.g. started by an older operator that accepted more) is
    checked by today's rules before anything is created from it."""
    bed = Bed(tmp_path)
    bed.step()  # the deploy flow starts; its target is written ahead
    status = bed.kube.pipeline["status"]
    template = {"kind": "RoleBinding", "subjects": [{"kind": "User", "name": "mallory"}]}
    status["operation"]["target"]["driver"] = {"podTemplate": template}
    bed.step()
    assert not bed.kube.pods and not bed.kube.objects
    assert conditions(bed)["SpecValid"] == ("False", "InvalidSpec")
    assert (
        "the operation's spec: spec.driver.podTemplate.kind: not allowed"
        in (bed.status["lastError"])
    )


def test_checkpoint_health_is_a_condition_and_each_failover_an_event(tmp_path: Path) -> None:
    """Issue 42: the driver's checkpoint health reaches status (``checkpointHealth``), the
    ``CheckpointsHealthy`` condition says why it is not, and each failover its rules caused
    is one Warning event with the driver's reason, however often the operator looks."""
    bed = Bed(tmp_path)
    driver = bed.deploy()
    checkpoint = {
        "id": 5,
        "epoch": 11,
        "created_ms": 1_700_000_000_000,
        "state_bytes": 1,
        "incremental_bytes": 1,
        "duration_ms": 1,
        "incremental": True,
    }
    health = {"healthy": True, "tolerable_failures": 2, "progress_window_ms": 120_000}
    driver.job_info = {"epoch": 12, "latest_checkpoint": checkpoint, "checkpoint_health": health}
    bed.step()
    assert conditions(bed)["CheckpointsHealthy"] == ("True", "CheckpointsCompleting")
    assert conditions_message(bed, "CheckpointsHealthy") == (
        "checkpoints complete: failures in a row are tolerated up to 2, an epoch's output "
        "waits at most 120 s for one"
    )
    failing = {**health, "healthy": False, "consecutive_failures": 3, "problem": "3 failed"}
    driver.job_info = {**driver.job_info, "checkpoint_health": failing}
    bed.step()
    assert conditions(bed)["CheckpointsHealthy"] == ("False", "TooManyFailedCheckpoints")
    assert conditions_message(bed, "CheckpointsHealthy").startswith(
        "3 checkpoints failed in a row, up to 2 tolerated"
    )
    reason = "3 consecutive checkpoints failed (checkpoint.tolerable_failures is 2): refused"
    failed_over = {
        **health,
        "failovers": 1,
        "last_failover": reason,
        "last_failover_ms": 1_700_000_000_500,
    }
    driver.job_info = {
        **driver.job_info,
        "checkpoint_health": failed_over,
        "last_error": reason,
    }
    for _ in range(3):
        bed.step()
    warnings = [m for _, r, m in bed.events if r == "CheckpointFailover"]
    assert warnings == [
        f"the job failed over to its latest checkpoint (failover 1 of this driver): {reason}"
    ], "one event per failover"
    assert conditions(bed)["CheckpointsHealthy"] == ("False", "FailedOver")
    assert bed.status["lastError"] == reason
    assert bed.status["checkpointHealth"] == {
        "healthy": True,
        "consecutiveFailures": 0,
        "failovers": 1,
        "lastFailover": reason,
        "lastFailoverMs": 1_700_000_000_500,
    }
    newer = {**checkpoint, "id": 6, "created_ms": 1_700_000_001_000}
    driver.job_info = {**driver.job_info, "latest_checkpoint": newer}
    bed.step()
    assert conditions(bed)["CheckpointsHealthy"] == ("True", "CheckpointsCompleting")
    window = {**failed_over, "healthy": False, "problem": "no checkpoint completed in 120 s"}
    driver.job_info = {**driver.job_info, "checkpoint_health": window}
    bed.step()
    assert conditions(bed)["CheckpointsHealthy"] == ("False", "NoCheckpointProgress")
    assert len([r for _, r, _ in bed.events if r == "CheckpointFailover"]) == 1


def test_a_driver_whose_checkpoints_stay_unhealthy_is_restarted(tmp_path: Path) -> None:
    """The driver fails over by itself at its next step; a verdict that stays means its loop
    cannot act (an epoch that does not end): past failover.readinessTimeoutSeconds the
    operator restarts it from the latest checkpoint, as the Flink operator restarts a job
    whose checkpoints do not progress."""
    bed = Bed(tmp_path)
    driver = bed.deploy()
    health = {
        "healthy": False,
        "tolerable_failures": 3,
        "progress_window_ms": 60_000,
        "problem": "no checkpoint completed in 60 s (checkpoint.progress_window_ms): ...",
    }
    driver.job_info = {"epoch": 12, "checkpoint_health": health}
    bed.step()
    assert conditions(bed)["CheckpointsHealthy"] == ("False", "NoCheckpointProgress")
    bed.step()
    assert bed.op is None, "within failover.readinessTimeoutSeconds: the driver may act"
    for c in bed.kube.pipeline["status"]["conditions"]:
        if c["type"] == "CheckpointsHealthy":
            c["lastTransitionTime"] = LONG_AGO
    bed.step()
    op = bed.op
    assert op is not None and (op.kind, op.step) == (OpKind.RESTART, Step.REMOVE_DRIVER)
    assert bed.status["lastError"].startswith(
        "the driver's checkpoints have been unhealthy for "
    ) and bed.status["lastError"].endswith(
        "without it failing over (failover.readinessTimeoutSeconds is 300): an epoch's output "
        "has waited more than 60 s for a checkpoint (checkpointing.progressWindowSeconds): "
        "the job fails over to its latest checkpoint"
    )
    assert "DriverFailed" in bed.reasons()
