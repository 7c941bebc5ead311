"""The operator's lifecycle flows, as numbered steps recorded in status before they are taken.

``status.operation`` is a write-ahead log: ``{kind, step, target, restore, ...}``. Each call
of :meth:`Reconciler.advance` performs at most one step; the step (and anything it learned,
such as a savepoint's path) is written to status before the next one starts. Every step is
idempotent, so an operator killed at any point and restarted continues the flow exactly once.

Steps of a redeploy (upgrade, rescale, suspend, resume, restart, rollback, delete):

1. ``savepoint``: ask the running driver to stop with a savepoint (savepoint upgrades,
   rescales, suspends, deletes with a final savepoint). If the driver is unreachable or the
   savepoint fails, fall back to the latest completed checkpoint when one exists (an event
   and a condition say so) instead of blocking the upgrade.
2. ``await-savepoint``: poll the request until it completes or fails (then as in 1).
3. ``remove-driver``: delete the driver pod and wait until it is gone.
4. ``deploy``: ensure RBAC, config and service; create the new driver pod restoring from the
   savepoint, the latest checkpoint (``latest``) or nothing (``none``).
5. ``await-ready``: wait until the driver reports ready. Past the readiness timeout an upgrade
   rolls back to the last stable spec (restoring the savepoint taken in step 1); a first
   deployment is restarted under the restart strategy.

Kinds use these steps: deploy 4-5; upgrade/rescale 1-5 (last-state: 3-5, stateless: 3-5
without state); suspend 1-3; resume 4-5; restart 3-5; rollback 3-5; delete 1-3.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import driver_api
from .k8s import Kube
from .resources import (
    check_job_config,
    config_map,
    driver_pod,
    role,
    role_binding,
    service,
    service_account,
)
from .spec import classify, fingerprint, get, validate

log = logging.getLogger("stator.operator")

SAVEPOINT, AWAIT_SAVEPOINT, REMOVE_DRIVER, DEPLOY, AWAIT_READY = 1, 2, 3, 4, 5
STEP_NAMES = {
    SAVEPOINT: "savepoint",
    AWAIT_SAVEPOINT: "await-savepoint",
    REMOVE_DRIVER: "remove-driver",
    DEPLOY: "deploy",
    AWAIT_READY: "await-ready",
}
SAVEPOINT_TIMEOUT_S = 300


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _age_s(stamp: str | None) -> float:
    if not stamp:
        return 0.0
    t = dt.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    return (dt.datetime.now(dt.UTC) - t).total_seconds()


@dataclass
class Reconciler:
    """One StatefulPipeline: reads its body, advances its flow, writes status through Kube."""

    kube: Kube
    body: dict[str, Any]
    event: Callable[[str, str, str], None]  # (type, reason, message)

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.body["metadata"]["namespace"])

    @property
    def spec(self) -> dict[str, Any]:
        return dict(self.body.get("spec") or {})

    @property
    def status(self) -> dict[str, Any]:
        return dict(self.body.get("status") or {})

    # ------------------------------------------------------------------ status writes

    def write(self, **fields: Any) -> None:
        """Patch status now (write-ahead), and keep the local copy in step."""
        self.kube.patch_status(self.namespace, self.name, fields)
        status = self.status
        for key, value in fields.items():
            if value is None:
                status.pop(key, None)
            else:
                status[key] = value
        self.body["status"] = status

    def set_step(self, op: dict[str, Any], step: int, **extra: Any) -> dict[str, Any]:
        op = {**op, **extra, "step": step, "stepName": STEP_NAMES[step], "stepStartedAt": now()}
        self.write(operation=op)
        self.event(
            "Normal",
            f"{op['kind'].capitalize()}Step",
            f"{op['kind']}: step {step} ({STEP_NAMES[step]})",
        )
        return op

    def condition(self, ctype: str, ok: bool, reason: str, message: str) -> None:
        conditions = [c for c in self.status.get("conditions", []) if c.get("type") != ctype]
        conditions.append(
            {
                "type": ctype,
                "status": "True" if ok else "False",
                "reason": reason,
                "message": message[:1000],
                "lastTransitionTime": now(),
            }
        )
        self.write(conditions=conditions)

    def _spec_valid(self) -> bool:
        """The checks the CRD schema cannot express, reported as the SpecValid condition."""
        try:
            validate(self.spec)
            check_job_config(self.spec, self.name, self.namespace)
        except ValueError as exc:
            self._spec_invalid("InvalidSpec", str(exc))
            return False
        return True

    def _spec_invalid(self, reason: str, message: str) -> None:
        """Report a spec that cannot run: condition, lastError, one event per new message;
        ``phase: Failed`` only if nothing runs (a running job keeps its last good spec)."""
        if self.status.get("lastError") != message:
            self.event("Warning", "InvalidSpec", message)
        self.condition("SpecValid", False, reason, message)
        if self.status.get("lastReconciledSpec") is None:
            self.write(phase="Failed")
        self.write(lastError=message)

    def _spec_accepted(self) -> None:
        """A spec that was reported invalid has been fixed: say so once."""
        conditions = {c.get("type"): c for c in self.status.get("conditions", [])}
        if conditions.get("SpecValid", {}).get("status") == "False":
            self.condition("SpecValid", True, "Valid", "the spec is accepted")
            self.write(lastError=None)

    # ------------------------------------------------------------------ entry point

    def advance(self) -> float:
        """Take the next step; returns seconds until the operator should look again."""
        op = self.status.get("operation")
        if op:
            return self._step(op)
        return self._plan()

    def _plan(self) -> float:
        """No flow in progress: start one if the spec asks for it, else watch the driver."""
        spec, status = self.spec, self.status
        if not self._spec_valid():
            if status.get("lastReconciledSpec") is not None:
                self._observe()  # the last good spec keeps running meanwhile
            return 30.0
        running = status.get("lastReconciledSpec")
        suspended = status.get("phase") == "Suspended"
        if running is None:
            return self._first_deploy(spec)
        self._spec_accepted()
        if spec.get("state") == "suspended" and not suspended:
            return self._start("suspend", SAVEPOINT, target=running)
        if spec.get("state", "running") == "running" and suspended:
            return self._start(
                "resume", DEPLOY, target=spec, restore=status.get("suspendedWith") or "latest"
            )
        if suspended:
            return 30.0
        change = classify(running, spec)
        if status.get("phase") == "Finished" and change.kind == "none":
            return 10.0
        if change.kind != "none" and status.get("failedSpec") == fingerprint(spec):
            return self._observe()  # this spec failed and was rolled back: wait for a new one
        if change.kind != "none":
            mode = spec.get("upgradeMode", "savepoint")
            kind = "rescale" if change.kind == "rescale" else "upgrade"
            self.event("Normal", "SpecChanged", f"{kind} ({mode}): {', '.join(change.fields)}")
            if kind == "rescale" or mode == "savepoint":
                return self._start(kind, SAVEPOINT, target=spec, mode="savepoint")
            restore = "latest" if mode == "last-state" else "none"
            return self._start(kind, REMOVE_DRIVER, target=spec, mode=mode, restore=restore)
        nonce = get(spec, "savepoints", "triggerNonce")
        if nonce is not None and nonce != status.get("savepointNonce"):
            return self._start("savepoint", SAVEPOINT, target=running, nonce=nonce)
        if self._periodic_due():
            self.write(periodicSavepointAt=now())
            return self._start("savepoint", SAVEPOINT, target=running, trigger="periodic")
        return self._observe()

    def _first_deploy(self, spec: dict[str, Any]) -> float:
        """Step 1 of the first deployment, once the initial savepoint is known readable."""
        restore = get(spec, "restore", "initialSavepoint") or "latest"
        if restore != "latest":
            problem = self.kube.check_restore_source(self.namespace, spec, restore)
            if problem:
                self._spec_invalid(
                    "UnreadableSavepoint", f"spec.restore.initialSavepoint: {problem}"
                )
                return 30.0
        self._spec_accepted()
        return self._start("deploy", DEPLOY, restore=restore, target=spec)

    def _start(self, kind: str, step: int, **fields: Any) -> float:
        op = {"kind": kind, "startedAt": now(), "id": uuid.uuid4().hex[:8], **fields}
        phase = {
            "deploy": "Deploying",
            "upgrade": "Upgrading",
            "rescale": "Rescaling",
            "suspend": "Suspending",
            "resume": "Deploying",
            "restart": "Restarting",
            "rollback": "RollingBack",
            "savepoint": "Running",
            "delete": "Deleting",
        }[kind]
        self.write(phase=phase)
        self.set_step(op, step)
        return 0.0

    # ------------------------------------------------------------------ steps

    def _step(self, op: dict[str, Any]) -> float:
        step = int(op["step"])
        if step == SAVEPOINT:
            return self._request_savepoint(op)
        if step == AWAIT_SAVEPOINT:
            return self._await_savepoint(op)
        if step == REMOVE_DRIVER:
            return self._remove_driver(op)
        if step == DEPLOY:
            return self._deploy(op)
        return self._await_ready(op)

    def driver(self) -> dict[str, Any] | None:
        """The driver pod of the deployment that is current: the one being brought up while an
        operation awaits readiness, else the one that was last ready."""
        op = self.status.get("operation") or {}
        if int(op.get("step", 0)) == AWAIT_READY:
            deployment = op["id"]
        else:
            deployment = (self.status.get("deployment") or {}).get("id")
        if not deployment:
            return None
        return self.kube.driver_pod(self.namespace, self.name, deployment)

    def _fallback(self, op: dict[str, Any], reason: str) -> float:
        """No savepoint: continue from the latest checkpoint instead of blocking."""
        self.event(
            "Warning",
            "SavepointFailed",
            f"{reason}; continuing from the latest completed checkpoint",
        )
        self.condition("SavepointSucceeded", False, "FellBackToCheckpoint", reason)
        if op["kind"] == "savepoint":  # a savepoint on its own: nothing to redeploy
            self._end_savepoint(op, lastError=reason)
            return 5.0
        self.set_step(op, REMOVE_DRIVER, restore="latest")
        return 0.0

    def _end_savepoint(self, op: dict[str, Any], **fields: Any) -> None:
        if op.get("nonce") is not None:  # answered, even if it failed: not retried
            fields["savepointNonce"] = op["nonce"]
        self.write(operation=None, phase="Running", **fields)

    def _periodic_due(self) -> bool:
        """``savepoints.periodicSeconds`` since the last savepoint, periodic attempt or
        deployment, whichever is latest."""
        every = int(get(self.spec, "savepoints", "periodicSeconds", default=0) or 0)
        if not every or self.status.get("phase") != "Running":
            return False
        stamps = [h.get("time") or "" for h in self.status.get("savepoints", [])]
        stamps += [
            (self.status.get("deployment") or {}).get("readyAt") or "",
            self.status.get("periodicSavepointAt") or "",
        ]
        latest = max(stamps)
        return bool(latest) and _age_s(latest) >= every

    def _request_savepoint(self, op: dict[str, Any]) -> float:
        url = driver_api.base_url(self.driver())
        if url is None:
            return self._fallback(op, "no running driver to take a savepoint")
        stop = op["kind"] != "savepoint"
        try:
            code, body = driver_api.call(url, "/v1/savepoints", {"stop": stop})
        except driver_api.DriverUnreachable as exc:
            return self._fallback(op, f"the driver is unreachable: {exc}")
        if code == 409 and stop:  # a stop-with-savepoint of ours is already running
            code, body = driver_api.call(url, "/v1/savepoints")
            pending = [s for s in body.get("savepoints", []) if s.get("stop")]
            if pending:
                body, code = pending[-1], 202
        if code != 202:
            return self._fallback(op, f"the driver refused the savepoint: {body.get('error')}")
        self.set_step(op, AWAIT_SAVEPOINT, savepointRequest=body["id"])
        return 1.0

    def _await_savepoint(self, op: dict[str, Any]) -> float:
        pod = self.driver()
        url = driver_api.base_url(pod)
        try:
            if url is None:
                raise driver_api.DriverUnreachable("no driver pod")
            code, body = driver_api.call(url, f"/v1/savepoints/{op['savepointRequest']}")
        except driver_api.DriverUnreachable as exc:
            # The driver may have stopped before we read the result: look in storage.
            found = self.kube.find_savepoint(self.namespace, op["target"], op["savepointRequest"])
            if found is not None:
                code, body = 200, {"status": "COMPLETED", "location": found}
            elif (
                pod is None or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
            ) or _age_s(op.get("stepStartedAt")) > SAVEPOINT_TIMEOUT_S:
                return self._fallback(op, f"the driver is unreachable: {exc}")
            else:
                return 2.0
        status = body.get("status")
        if code == 200 and status == "COMPLETED":
            path = body["location"]
            history = [
                *self.status.get("savepoints", []),
                {
                    "path": path,
                    "time": now(),
                    "trigger": op.get("trigger", op["kind"]),
                    "epoch": body.get("epoch"),
                },
            ]
            self.write(savepoints=self._prune(history))
            self.event("Normal", "SavepointCompleted", f"savepoint at {path}")
            self.condition("SavepointSucceeded", True, "Completed", path)
            if op["kind"] == "savepoint":
                self._end_savepoint(op)
                return 5.0
            self.set_step(op, REMOVE_DRIVER, restore=path, savepoint=path)
            return 0.0
        if code != 200 or status == "FAILED":
            return self._fallback(op, f"savepoint failed: {body.get('error')}")
        if _age_s(op.get("stepStartedAt")) > SAVEPOINT_TIMEOUT_S:
            return self._fallback(op, f"savepoint still {status} after {SAVEPOINT_TIMEOUT_S}s")
        return 1.0

    def _prune(self, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
        keep = int(get(self.spec, "savepoints", "historyMaxCount", default=5) or 5)
        max_age = get(self.spec, "savepoints", "historyMaxAgeSeconds")
        kept = [h for h in history if not max_age or _age_s(h.get("time")) <= max_age][-keep:]
        for old in history:
            if old not in kept and old.get("trigger") in ("savepoint", "periodic"):
                self.kube.dispose_savepoint(self.namespace, self.spec, old["path"])
        return kept

    def _remove_driver(self, op: dict[str, Any]) -> float:
        wait = float(op.get("notBefore", 0)) - time.time()
        if wait > 0:  # restart backoff
            return min(wait, 5.0)
        if self.kube.delete_drivers(self.namespace, self.name):  # every deployment's
            return 1.0
        if op["kind"] == "suspend":
            self.write(operation=None, phase="Suspended", suspendedWith=op.get("restore"))
            self.event("Normal", "Suspended", f"suspended with {op.get('restore')}")
            return 30.0
        if op["kind"] == "delete":
            self.write(operation={**op, "done": True})
            return 0.0
        self.set_step(op, DEPLOY)
        return 0.0

    def _deploy(self, op: dict[str, Any]) -> float:
        spec = op["target"]
        body = {**self.body, "spec": spec}
        k = self.kube
        for obj in (service_account(body), role(body), role_binding(body), service(body)):
            k.ensure(obj)
        k.apply_config(config_map(body, spec))
        deployment = op["id"]
        restore = op.get("restore", "latest")
        allow = bool(get(spec, "restore", "allowNonRestoredState", default=False))
        k.ensure(driver_pod(body, spec, deployment, restore, allow))
        self.event(
            "Normal",
            "DriverCreated",
            f"driver pod {self.name}-driver-{deployment} restoring from {restore}",
        )
        self.set_step(op, AWAIT_READY, deployedAt=time.time())
        return 0.5

    def _await_ready(self, op: dict[str, Any]) -> float:
        pod = self.driver()
        phase = ((pod or {}).get("status") or {}).get("phase")
        url = driver_api.base_url(pod)
        ready = False
        if url is not None and phase == "Running":
            try:
                ready = driver_api.call(url, "/readyz", timeout=2)[0] == 200
            except driver_api.DriverUnreachable:
                ready = False
        if ready:
            spec = op["target"]
            self.write(
                operation=None,
                phase="Running",
                lastReconciledSpec=spec,
                lastStableSpec=spec,
                replicas=int(spec.get("replicas", 2)),
                selector=f"stator.dev/pipeline={self.name}",
                observedGeneration=self.body["metadata"].get("generation"),
                deployment={
                    "id": op["id"],
                    "restoredFrom": op.get("restore"),
                    "driverPod": f"{self.name}-driver-{op['id']}",
                    "readyAt": now(),
                },
            )
            if op["kind"] != "rollback":  # a rollback keeps the error that caused it in view
                self.write(lastError=None, failedSpec=None)
            if op["kind"] in ("upgrade", "rescale"):
                self.condition("UpgradeSucceeded", True, "Completed", f"running {op['id']}")
            self.condition("Ready", True, "DriverReady", f"driver {op['id']} is running")
            self.event(
                "Normal",
                f"{op['kind'].capitalize()}Completed",
                f"{op['kind']} complete: running {op['id']} from {op.get('restore')}",
            )
            return 2.0
        timeout = float(get(op["target"], "failover", "readinessTimeoutSeconds", default=300))
        failed = phase in ("Failed", "Succeeded") or pod is None
        if failed or _age_s(op.get("stepStartedAt")) > timeout:
            reason = (
                f"driver pod {phase or 'missing'}"
                if failed
                else f"driver not ready within {timeout:.0f}s"
            )
            return self._not_ready(op, reason)
        return 1.0

    def _not_ready(self, op: dict[str, Any], reason: str) -> float:
        stable = self.status.get("lastStableSpec")
        self.write(lastError=reason)
        if op["kind"] in ("upgrade", "rescale") and stable is not None:
            self.event("Warning", "UpgradeFailed", f"{reason}; rolling back")
            self.condition(
                "UpgradeSucceeded",
                False,
                "RolledBack",
                f"{reason}; rolled back to the last stable spec. Change the spec to try again",
            )
            self.write(failedSpec=fingerprint(op["target"]))
            self._start(
                "rollback", REMOVE_DRIVER, target=stable, restore=op.get("savepoint") or "latest"
            )
            return 0.0
        restarts = int(self.status.get("restarts", 0)) + 1
        limit = int(get(op["target"], "failover", "maxRestarts", default=10))
        if restarts > limit:
            self.write(operation=None, phase="Failed", restarts=restarts)
            self.event("Warning", "Failed", f"{reason}; gave up after {limit} restarts")
            self.condition("Ready", False, "RestartsExhausted", reason)
            return 60.0
        self.write(restarts=restarts)
        self.event("Warning", "DriverFailed", f"{reason}; restart {restarts} of {limit}")
        self._start(
            "restart",
            REMOVE_DRIVER,
            target=op["target"],
            restore="latest",
            notBefore=time.time() + min(60, 2 ** min(restarts, 6)),
        )
        return 0.0

    # ------------------------------------------------------------------ steady state

    def _observe(self) -> float:
        """Running: mirror the driver's progress into status; restart a failed driver."""
        pod = self.driver()
        phase = ((pod or {}).get("status") or {}).get("phase")
        if phase == "Succeeded":  # a bounded job read all its input
            if self.status.get("phase") != "Finished":
                self.write(phase="Finished")
                self.event("Normal", "Finished", "the job finished its input")
            return 10.0
        if pod is None or phase == "Failed":
            code = _exit_code(pod)
            return self._not_ready(
                {"kind": "restart", "target": self.status.get("lastReconciledSpec"), "id": "x"},
                f"driver pod {'gone' if pod is None else phase} (exit {code})",
            )
        url = driver_api.base_url(pod)
        if url is None:
            return 2.0
        if phase == "Running" and self.status.get("phase") != "Running":
            self.write(phase="Running")  # the phase follows the driver that runs now
        try:
            _, job = driver_api.call(url, "/v1/job", timeout=3)
        except driver_api.DriverUnreachable:
            return 2.0
        latest = job.get("latest_checkpoint")
        fields: dict[str, Any] = {
            "epoch": job.get("epoch"),
            "jobState": job.get("state"),
            "parallelism": job.get("parallelism"),
        }
        if latest:
            fields["latestCheckpoint"] = {
                "id": latest["id"],
                "epoch": latest["epoch"],
                "time": dt.datetime.fromtimestamp(latest["created_ms"] / 1000, dt.UTC).strftime(
                    "%Y-%m-%dT%H:%M:%SZ"
                ),
                "stateBytes": latest["state_bytes"],
                "incrementalBytes": latest["incremental_bytes"],
            }
        if job.get("last_error"):
            fields["lastError"] = job["last_error"]
        if any(self.status.get(k) != v for k, v in fields.items()):
            self.write(**fields)
        return 2.0


def _exit_code(pod: dict[str, Any] | None) -> Any:
    for cs in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term:
            return term.get("exitCode")
    return None
