"""The operator's lifecycle flows, as numbered steps recorded in status before they are taken.

``status.operation`` is a write-ahead log (operation.py): kind, step, target spec, restore
source, and what earlier steps learned. Each call of :meth:`Flows.advance` takes at most one
step; the next step (and anything learned, such as a savepoint's path) is written to status
before it starts. Every step is idempotent, so an operator killed at any point and restarted
continues the flow exactly once. The reconciler (reconciler.py) decides which flow to start
and what a failed driver means; these are the steps.

Steps of a redeploy (upgrade, rescale, suspend, resume, restart, rollback, delete), each with
what a failure or a crash of the operator leaves behind:

0. ``prestart`` (upgrades and rescales by savepoint, unless ``driver.prestart`` is false):
   create the new driver pod, named by the operation id, with ``--await-handover``; it starts
   its interpreter, pipeline and Spark while the old driver still processes, then waits.
   With executor pods, Spark (and its executors) start here only when the new driver runs an
   executor set of its own (a rescale: ``_with_executor_set``); one that takes the running
   set over starts Spark after the hand-over. Go on once it reports ``STANDBY``. If it fails,
   or is not waiting within ``failover.readinessTimeoutSeconds``, go on without it (a Warning
   event says why): step 3 removes it and step 4 creates a driver the usual way. If it refused
   to start (exit 2: its configuration, pipeline or storage), the upgrade is given up before
   the running job is touched (``failedSpec``: not retried until the spec changes).
   -> The pod is named by the operation id: a crash repeats the step and finds it.
1. ``savepoint``: ask the running driver to stop with a savepoint (savepoint upgrades,
   rescales, suspends, deletes with a final savepoint; on-demand and periodic savepoints
   without stopping). If the driver is unreachable or refuses, fall back to the latest
   completed checkpoint (an event and a condition say so) instead of blocking the upgrade;
   but an upgrade to another checkpoint storage (which holds none of the job's checkpoints)
   is given up as in 0: the running driver, if it still runs, keeps running.
   -> A crash after the request leaves a pending stop-with-savepoint; asked again, the driver
   answers 409 and the pending request is adopted rather than a second one made.
2. ``await-savepoint``: poll the request until it completes (the path is recorded as the
   restore source and in the savepoint history) or fails (fall back as in 1). If the driver
   is gone before it answered, the savepoint is looked for in storage by request id.
   -> A crash leaves the request id in status; the next operator polls the same request.
3. ``remove-driver``: delete the driver pod(s) and wait until none is left, nor any
   executor of the set the next driver takes over (after the restart backoff, for
   restarts): its executor StatefulSet has the same name and takes the same claims back. The
   pre-started driver of step 0 stays. Suspend and delete end here. A pre-started driver
   whose Spark runs in its pod, or on an executor set of its own, is handed the completed
   stop-with-savepoint first (as in step 4): the old driver has ended its loop and touches
   neither state nor sinks again, and its pod's (and executors') exit is then no downtime.
   -> Deletion is idempotent; a crash repeats it. A crash after the hand-over but before it
   was recorded sends it again, which the driver accepts again.
4. ``deploy``: ensure RBAC, config and service; create the driver pod of this operation's id,
   restoring from the savepoint, the latest checkpoint (``latest``) or nothing (``none``).
   With a pre-started driver, hand it over instead (``POST /v1/handover`` with the same
   restore source); if it is gone or refuses, go back to step 3 without it.
   -> Objects are created unless they exist, and the pod is named by the operation id: a
   crash between creating the pod and recording step 5 never creates a second driver; a
   hand-over sent twice is accepted twice.
5. ``await-ready``: wait until the new driver reports ready, then record it as the running
   deployment (``lastReconciledSpec``, ``lastStableSpec``, ``deployment`` with its executor
   set) and delete the state claims of executors it no longer has (another set's, and those
   past its executors after a rescale to fewer). A driver that
   fails, or is not ready within ``failover.readinessTimeoutSeconds``, is handed back to the
   reconciler: an upgrade or rescale rolls back to the last stable spec (restoring the
   savepoint of step 2), anything else restarts from the latest checkpoint with backoff. A
   driver that ends successfully (a bounded job with nothing left to read) is the running
   deployment, and the pipeline is Finished.

Kinds use these steps: deploy 4-5; upgrade/rescale 0-5 (without pre-start 1-5; last-state
and stateless: 3-5, the latter without state); suspend 1-3; resume 4-5; restart 3-5;
rollback 3-5; delete 1-3 (3 alone without a final savepoint); savepoint 1-2.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any

from stator.control.client import ControlHTTPError, ControlUnreachable
from stator.control.schema import SavepointRequest

from .admission import check_pods
from .naming import (
    JOB_FAILED_EXIT_CODE,
    driver_lease_name,
    driver_pod_name,
    new_executor_set,
    running_executor_set,
    spark_app_id,
)
from .observer import Observation, PrestartedDriver
from .operation import PERIODIC, Operation, OpKind, Step
from .outcomes import (
    ConditionReason,
    ConditionType,
    DriverState,
    EventReason,
    Phase,
    PodPhase,
    Restore,
    SavepointStatus,
)
from .pipeline_spec import Pinning, PipelineSpec
from .pipeline_status import Deployment, LastOperation, SavepointRecord
from .ports import DriverApi, EventSink, KubeApi
from .resources import (
    config_map,
    control_secret,
    driver_lease,
    driver_pod,
    network_policy,
    read_secret,
    role,
    role_binding,
    service,
    service_account,
)
from .spec import attempt_fingerprint
from .status import StatusWriter, age_s, now
from .storage import SavepointStorage, is_under

log = logging.getLogger("stator.operator.flows")
# Look again this soon while the old driver stops and until the new one restores: every
# second is downtime (handlers.py looks again within the same call).
QUICK_S = 0.25
MAX_LOCATION = 1024  # the longest savepoint location recorded from a driver's answer
HANDOVER_TIMEOUT_S = 60  # a waiting driver that does not answer the hand-over this long


@dataclass(frozen=True)
class DriverFailed:
    """Step 5 ended without a ready driver; the reconciler decides what follows."""

    reason: str


@dataclass
class Flows:
    pipeline: StatusWriter
    kube: KubeApi
    storage: SavepointStorage
    event: EventSink

    def start(self, kind: OpKind, step: Step, **fields: Any) -> Operation:
        """Record a new operation (replacing any in flight) at its first step."""
        stamp = now()
        op = Operation(
            kind=kind,
            id=uuid.uuid4().hex[:8],
            step=step,
            started_at=stamp,
            step_started_at=stamp,
            step_started=time.time(),
            generation=self.pipeline.body["metadata"].get("generation"),
            **fields,
        )
        op = self._with_executor_set(op)
        self.pipeline.write(phase=kind.phase, operation=op)
        self._announce(op)
        return op

    def _with_executor_set(self, op: Operation) -> Operation:
        """The executors the flow's new driver runs, decided before any step is taken.

        A rescale by savepoint with a pre-started driver (and an upgrade from Spark in the
        driver pod to executor pods) gets a set of its own: none of the running executors'
        local state would be of use to the new driver (each new subtask reads its key-groups
        from the savepoint), so its executors start while the old driver still processes,
        and the old set's claims are deleted once it runs. Every other flow takes over the
        running deployment's set: its executors come back to their volumes and restore
        locally, after the old driver's executors are gone."""
        p = self.pipeline
        if _target(op).executor is None or op.kind in (OpKind.SAVEPOINT, OpKind.DELETE):
            return op
        running = self._last_reconciled()
        own = (
            op.kind in (OpKind.UPGRADE, OpKind.RESCALE)
            and op.step is Step.PRESTART
            and (running is None or running.executor is None or op.rescales)
        )
        if own:
            return replace(
                op,
                executor_set=new_executor_set(p.namespace, p.name, op.id),
                new_executor_set=True,
            )
        deployment = p.status.deployment
        recorded = deployment.executor_set if deployment else None
        return replace(op, executor_set=running_executor_set(recorded, p.namespace, p.name))

    def advance(self, op: Operation, obs: Observation) -> float | DriverFailed:
        """Take the operation's current step; seconds until the next look, or DriverFailed."""
        if op.step is Step.PRESTART:
            return self._prestart(op, obs.next or PrestartedDriver())
        if op.step is Step.SAVEPOINT:
            return self._request_savepoint(op, obs)
        if op.step is Step.AWAIT_SAVEPOINT:
            return self._await_savepoint(op, obs)
        if op.step is Step.REMOVE_DRIVER:
            return self._remove_driver(op, obs.next)
        if op.step is Step.DEPLOY:
            return self._deploy(op, obs.next)
        return self._await_ready(op, obs)

    def _goto(self, op: Operation, step: Step, **changes: Any) -> Operation:
        op = op.at(step, now(), **changes)
        self.pipeline.write(operation=op)
        self._announce(op)
        return op

    def _announce(self, op: Operation) -> None:
        step = f"step {int(op.step)} ({op.step.label})"
        self.event("Normal", op.kind.step_reason, f"{op.kind}: {step}")

    # ------------------------------------------------------------------ 0: pre-start

    def _prestart(self, op: Operation, nxt: PrestartedDriver) -> float:
        p = self.pipeline
        pod = driver_pod_name(p.name, op.id)
        if nxt.pod is None:
            spec = _target(op)
            body = self._ensure_objects(spec, op.executor_set)
            start = op.new_executor_set
            self.kube.ensure(
                driver_pod(body, spec, op.id, None, False, lineage=op.id, start_executors=start)
            )
            executors = f", with executor set {op.executor_set} of its own" if start else ""
            self.event(
                "Normal",
                EventReason.DRIVER_PRESTARTED,
                f"driver pod {pod} started ahead of the savepoint{executors}; it waits for "
                "the hand-over",
            )
            return 1.0
        if nxt.state == DriverState.STANDBY:
            self._goto(op, Step.SAVEPOINT, prestarted=True)
            return 0.0
        if nxt.ended and nxt.exit_code == JOB_FAILED_EXIT_CODE:
            # The new spec's driver refused to start (its configuration, its pipeline, its
            # storage): the running job is not stopped for a spec that cannot run.
            return self._abort(op, f"the new driver refused to start: {nxt.termination_message}")
        timeout = _target(op).failover.readiness_timeout_seconds
        problem = None
        if nxt.ended:
            problem = f"it ended: {nxt.termination_message or 'no message'}"
        elif nxt.state not in (None, DriverState.CREATED):  # CREATED: still starting
            problem = f"it reports {nxt.state}, not STANDBY"
        elif age_s(op.step_started_at) > timeout:
            problem = f"it was not waiting for the hand-over within {timeout:.0f}s"
        if problem is None:
            return 1.0
        self.event(
            "Warning",
            EventReason.PRESTART_FAILED,
            f"pre-started driver pod {pod}: {problem}; it is removed, and the new driver "
            "starts once the old one has stopped",
        )
        self._goto(op, Step.SAVEPOINT)
        return 0.0

    # ------------------------------------------------------------------ 1, 2: savepoint

    def _request_savepoint(self, op: Operation, obs: Observation) -> float:
        if obs.driver is None:
            return self._fallback(op, "no running driver to take a savepoint")
        stop = op.kind is not OpKind.SAVEPOINT
        # A rescale reads only the key-groups each new subtask owns from a canonical
        # savepoint, whole overlapping databases from a native one (docs/savepoints.md):
        # also an upgrade that changes replicas with other fields (``op.rescales``).
        # Named on every request: the running driver's default is the format of the spec it
        # was deployed with, and a change of formatType alone does not redeploy.
        chosen = self.pipeline.spec.savepoints.format_type or "canonical"
        format_type = "canonical" if op.rescales else chosen
        try:
            request = obs.driver.trigger_savepoint(stop=stop, format_type=format_type)
        except ControlUnreachable as exc:
            return self._fallback(op, f"the driver is unreachable: {exc}")
        except ControlHTTPError as exc:
            pending = _pending_stop(obs.driver) if exc.status == 409 and stop else None
            if pending is None:
                return self._fallback(op, f"the driver refused the savepoint: {exc.error}")
            request = pending  # ours, requested before the operator restarted
        self._goto(op, Step.AWAIT_SAVEPOINT, savepoint_request=request.id)
        return QUICK_S if stop else 1.0

    def _await_savepoint(self, op: Operation, obs: Observation) -> float:
        request = obs.savepoint
        if request is not None:
            status = request.status
            if status == SavepointStatus.COMPLETED:
                # When the old driver's last epoch ended (a stop's).
                stopped = request.started_ms if request.stop else None
                path, epoch = str(request.location), request.epoch
                return self._savepoint_completed(op, path, epoch, stopped)
            if status == SavepointStatus.FAILED:
                return self._fallback(op, f"savepoint failed: {request.error}")
            timeout = self.pipeline.spec.savepoints.timeout_seconds
            if age_s(op.step_started_at) > timeout and not (
                request.stop and self._storage_moved(op)
            ):
                return self._fallback(op, f"savepoint still {status} after {timeout:.0f}s")
            return QUICK_S if request.stop else 1.0
        if obs.savepoint_error is not None:
            return self._fallback(op, f"savepoint failed: {obs.savepoint_error}")
        if obs.found_savepoint is not None:
            return self._savepoint_completed(op, obs.found_savepoint, None)
        gone = obs.pod is None or obs.ended
        if gone or age_s(op.step_started_at) > self.pipeline.spec.savepoints.timeout_seconds:
            return self._fallback(op, f"the driver is unreachable: {obs.unreachable}")
        return 2.0  # the driver may be busy: ask again

    def _savepoint_completed(
        self, op: Operation, path: str, epoch: int | None, stopped_ms: int | None = None
    ) -> float:
        # A driver runs the user's code: what it reports is not recorded, restored from or
        # disposed of unless it is where the operator's savepoints go (the running spec's
        # directory, or the one an upgrade moves them to).
        specs = (self.pipeline.status.last_reconciled_spec, op.target, self.pipeline.raw_spec)
        roots = [PipelineSpec.read(s).savepoint_dir for s in specs if s]
        root = next((r for r in roots if is_under(path, r)), None)
        if root is None or len(path) > MAX_LOCATION:
            return self._fallback(
                op, f"the driver reported a savepoint at {path[:200]!r}, outside {roots[-1]}"
            )
        taken = SavepointRecord(path, now(), op.trigger or op.kind.value, root, epoch)
        history = (*self.pipeline.status.savepoints, taken)
        self.pipeline.write(savepoints=self.prune(history))
        self.event("Normal", EventReason.SAVEPOINT_COMPLETED, f"savepoint at {path}")
        self.pipeline.condition(
            ConditionType.SAVEPOINT_SUCCEEDED, True, ConditionReason.COMPLETED, path
        )
        if op.kind is OpKind.SAVEPOINT:
            self._end_savepoint(op)
            return 5.0
        self._goto(
            op, Step.REMOVE_DRIVER, restore=path, savepoint=path, processing_stopped_ms=stopped_ms
        )
        return 0.0

    def _storage_moved(self, op: Operation) -> bool:
        """An upgrade or rescale to another checkpoint storage: without its savepoint the new
        driver finds none of the job's checkpoints. (A stop asked for is waited out, past the
        timeout: given up, the stop would still land and end the running job.)"""
        running = self._last_reconciled()
        return (
            op.kind in (OpKind.UPGRADE, OpKind.RESCALE)
            and running is not None
            and _target(op).checkpointing.storage != running.checkpointing.storage
        )

    def _fallback(self, op: Operation, reason: str) -> float:
        """No savepoint: continue from the latest checkpoint instead of blocking; but not
        where the new spec's checkpoint storage is another (it holds none of the job's
        checkpoints: the new driver would start empty), then the upgrade is given up."""
        if self._storage_moved(op):
            running = self._last_reconciled()
            old = running.checkpointing.storage if running else ""
            return self._abort(
                op,
                f"{reason}; the new spec's checkpoint storage holds none of the job's "
                f"checkpoints (they are under {old}), so the upgrade "
                f"needs the savepoint",
            )
        self.event(
            "Warning",
            EventReason.SAVEPOINT_FAILED,
            f"{reason}; continuing from the latest completed checkpoint",
        )
        self.pipeline.condition(
            ConditionType.SAVEPOINT_SUCCEEDED,
            False,
            ConditionReason.FELL_BACK_TO_CHECKPOINT,
            reason,
        )
        if op.kind is OpKind.SAVEPOINT:  # a savepoint on its own: nothing to redeploy
            self._end_savepoint(op, lastError=reason)
            return 5.0
        self._goto(op, Step.REMOVE_DRIVER, restore=Restore.LATEST)
        return 0.0

    def _abort(self, op: Operation, reason: str) -> float:
        """Give an upgrade or rescale up before the running job was stopped: the pre-started
        driver (if any) is removed, the running driver keeps running (if it is gone, the
        reconciler restarts it as for any lost driver), and the spec is remembered as failed
        so it is not retried until it changes."""
        p = self.pipeline
        self.kube.delete_pod(p.namespace, driver_pod_name(p.name, op.id))
        if op.new_executor_set and op.executor_set:  # its executors went with its pod
            self.kube.delete_claims(p.namespace, op.executor_set, 0)
        self.event(
            "Warning", EventReason.UPGRADE_FAILED, f"{reason}; the running job is left as it is"
        )
        p.condition(
            ConditionType.UPGRADE_SUCCEEDED,
            False,
            ConditionReason.NOT_STARTED,
            f"{reason}; the running job was not changed. Change the spec to try again",
        )
        p.write(
            operation=None,
            phase=Phase.RUNNING,
            lastError=reason,
            failedSpec=attempt_fingerprint(op.target or {}),
        )
        return 1.0

    def _end_savepoint(self, op: Operation, **fields: Any) -> None:
        if op.nonce is not None:  # answered, even if it failed: not retried
            fields["savepointNonce"] = op.nonce
        self.pipeline.write(operation=None, phase=Phase.RUNNING, **fields)

    def prune(self, history: tuple[SavepointRecord, ...]) -> tuple[SavepointRecord, ...]:
        """Keep ``historyMaxCount`` within ``historyMaxAgeSeconds``; dispose of the pruned
        savepoints this operator took on its own (those of upgrades belong to their owner).
        At each savepoint, and while the pipeline runs (a lowered limit, an entry growing
        past the age limit)."""
        spec = self.pipeline.spec
        keep = spec.savepoints.history_max_count
        max_age = spec.savepoints.history_max_age_seconds
        kept = tuple(h for h in history if not max_age or age_s(h.time) <= max_age)[-keep:]
        for old in history:
            if old not in kept and old.trigger in (OpKind.SAVEPOINT, PERIODIC):
                self.storage.dispose(self.pipeline.namespace, spec, old.path, old.root)
        return kept

    # ------------------------------------------------------------------ 3: remove the driver

    def _remove_driver(self, op: Operation, nxt: PrestartedDriver | None) -> float:
        wait = (op.not_before or 0.0) - time.time()
        if wait > 0:  # restart backoff
            return min(wait, 5.0)
        if self._hands_over_early(op):
            allow = _target(op).restore.allow_non_restored_state
            return self._hand_over(op, nxt or PrestartedDriver(), str(op.restore), allow)
        p = self.pipeline
        keep = op.id if op.prestarted else None
        if self.kube.delete_drivers(p.namespace, p.name, keep=keep):
            return 1.0  # every deployment's driver (but a pre-started one), until none is left
        # The new driver's executors: a set of its own that the pre-started driver already
        # runs, or the old driver's, whose StatefulSet and claims it takes over once they are
        # garbage-collected with their driver pod.
        executors = op.executor_set or spark_app_id(p.namespace, p.name)
        if not (op.prestarted and op.new_executor_set) and self.kube.executors_left(
            p.namespace, executors
        ):
            return 1.0
        # Every old driver's pod is gone: a Lease one of them still holds (killed, or removed
        # from a lost node after its Lease lapsed) is released, so the next driver does not
        # wait out its duration.
        kept = driver_pod_name(p.name, op.id) if op.prestarted else None
        released = self.kube.clear_driver_lease(p.namespace, driver_lease_name(p.name), kept)
        if released:
            log.info("released the driver lease of %s, whose pod is gone", released)
        if op.kind is OpKind.SUSPEND:
            self.pipeline.write(operation=None, phase=Phase.SUSPENDED, suspendedWith=op.restore)
            self.event("Normal", EventReason.SUSPENDED, f"suspended with {op.restore}")
            return 30.0
        if op.kind is OpKind.DELETE:
            self.pipeline.write(operation=replace(op, done=True))
            return 0.0
        self._goto(op, Step.DEPLOY)
        return 0.0

    def _hands_over_early(self, op: Operation) -> bool:
        """Step 3 hands over before the old driver is removed: the new driver is waiting,
        the old one completed its stop-with-savepoint (its loop has ended: a fallback to the
        latest checkpoint may have a driver still processing), and the new one runs Spark in
        its pod or executors of its own (the old driver's executors would hold the
        StatefulSet and claims its new ones take over)."""
        return (
            op.prestarted
            and op.handed_over_ms is None
            and op.savepoint is not None
            and op.restore == op.savepoint
            and op.processing_stopped_ms is not None
            and (_target(op).executor is None or op.new_executor_set)
        )

    # ------------------------------------------------------------------ 4, 5: deploy

    def _last_reconciled(self) -> PipelineSpec | None:
        """The running deployment's spec (``lastReconciledSpec``), if any."""
        raw = self.pipeline.status.last_reconciled_spec
        return None if raw is None else PipelineSpec.read(raw)

    def _ensure_objects(self, spec: PipelineSpec, executor_set: str | None) -> dict[str, Any]:
        """RBAC, Secret, Service, NetworkPolicy and config a driver of ``spec`` needs (running
        executor set ``executor_set``); the pipeline object with that spec."""
        # The spec a flow deploys was checked when the flow began; a stored one (a rollback's
        # lastStableSpec, a flow an older operator started) is checked again before any
        # object is made from it.
        check_pods(spec, self.pipeline.name, self.pipeline.namespace)
        body = {**self.pipeline.body, "spec": spec.raw}
        # Executor rules while the new or the running driver has executor pods (the running
        # one still works during a pre-start); cut to the Lease at the next flow after.
        running = self._last_reconciled()
        executors = spec.executor is not None or (
            running is not None and running.executor is not None
        )
        self.kube.apply(role(body, executors))  # before its binding: binding needs the Role
        objects = (service_account(body), role_binding(body), service(body))
        policy = network_policy(body, os.environ.get("STATOR_OPERATOR_NAMESPACE"))
        for obj in (*objects, control_secret(body), read_secret(body), policy, driver_lease(body)):
            self.kube.ensure(obj)
        self.kube.apply(config_map(body, spec, executor_set))
        return body

    def _deploy(self, op: Operation, nxt: PrestartedDriver | None) -> float:
        spec = _target(op)
        restore = op.restore or Restore.LATEST
        allow = spec.restore.allow_non_restored_state
        if op.handed_over_ms is not None:
            return self._deployed(op, restore, " (pre-started, handed over at step 3)")
        if op.prestarted:
            return self._hand_over(op, nxt or PrestartedDriver(), restore, allow)
        body = self._ensure_objects(spec, op.executor_set)
        self.kube.ensure(
            driver_pod(body, spec, op.id, restore, allow, op.avoid_node, op.lineage or op.id)
        )
        return self._deployed(op, restore, "")

    def _deployed(self, op: Operation, restore: str, how: str) -> float:
        """The new driver restores from ``restore``: on to step 5."""
        pod = driver_pod_name(self.pipeline.name, op.id)
        self.event(
            "Normal", EventReason.DRIVER_CREATED, f"driver pod {pod} restoring from {restore}{how}"
        )
        self._goto(op, Step.AWAIT_READY, deployed_at=time.time())
        return 0.5

    def _hand_over(self, op: Operation, nxt: PrestartedDriver, restore: str, allow: bool) -> float:
        pod = driver_pod_name(self.pipeline.name, op.id)
        problem = "it is gone" if nxt.pod is None else None
        if nxt.ended:
            problem = f"it ended: {nxt.termination_message or 'no message'}"
        elif nxt.driver is not None and problem is None:
            try:
                nxt.driver.handover(restore, allow)
            except ControlUnreachable as exc:
                if age_s(op.step_started_at) <= HANDOVER_TIMEOUT_S:
                    return 1.0
                problem = f"it did not answer the hand-over: {exc}"
            except ControlHTTPError as exc:
                problem = f"it refused the hand-over: {exc.error}"
            else:
                if op.step is Step.REMOVE_DRIVER:  # early: now remove the old driver
                    handed = int(time.time() * 1000)
                    self.pipeline.write(operation=replace(op, handed_over_ms=handed))
                    return 0.0
                return self._deployed(op, restore, " (pre-started)")
        elif problem is None:
            return 1.0  # no address yet
        self.event(
            "Warning",
            EventReason.PRESTART_FAILED,
            f"pre-started driver pod {pod}: {problem}; it is removed and a new one created",
        )
        self._goto(op, Step.REMOVE_DRIVER, prestarted=False)
        return 0.0

    def _await_ready(self, op: Operation, obs: Observation) -> float | DriverFailed:
        if obs.ready or obs.phase == PodPhase.SUCCEEDED:  # Succeeded: a bounded job with nothing
            self._running(op)  # left to read ran to its end at once; the watch sees it
            return 2.0
        timeout = _target(op).failover.readiness_timeout_seconds
        failed = obs.pod is None or obs.ended
        if failed:
            return DriverFailed(f"driver pod {obs.phase or 'missing'}")
        if age_s(op.step_started_at) > timeout:
            return DriverFailed(f"driver not ready within {timeout:.0f}s")
        return 1.0

    def _running(self, op: Operation) -> None:
        """The new driver is ready: it is the running deployment now."""
        spec = _target(op)
        p = self.pipeline
        steps = op.timings()
        p.write(
            # A merge patch: the steps this operation skipped are nulled, not left over.
            # The start-up split and the downtime follow once the new driver has run its
            # first epoch (reconciler.py).
            lastOperation=LastOperation(
                kind=op.kind,
                id=op.id,
                step_seconds=steps,
                total_seconds=round(sum(steps.values()), 2),
                ready_at_ms=int(time.time() * 1000),
                processing_stopped_at_ms=op.processing_stopped_ms,
                handed_over_at_ms=op.handed_over_ms,
            ),
            operation=None,
            phase=Phase.RUNNING,
            lastReconciledSpec=spec.raw,
            lastStableSpec=spec.raw,
            replicas=spec.parallelism,
            selector=f"stator.dev/pipeline={p.name}",
            # The generation this flow brings up, not one applied while it ran.
            observedGeneration=op.generation or p.body["metadata"].get("generation"),
            deployment=Deployment(
                id=op.id,
                restored_from=op.restore,
                lineage=op.lineage or op.id,
                driver_pod=driver_pod_name(p.name, op.id),
                ready_at=now(),
                executor_set=op.executor_set,
            ),
            # What the previous driver reported: the new one reports its own.
            restores=None,
            placement=None,
        )
        # The spec asked for runs (not a rollback's, nor a resume's of the last good one while
        # the spec still holds a failed one): its error and its failure are over.
        if op.kind is not OpKind.ROLLBACK and attempt_fingerprint(spec.raw) == attempt_fingerprint(
            p.raw_spec
        ):
            p.write(lastError=None, failedSpec=None)
        if spec.executor is None:  # the old driver's executor rules are not needed now
            self.kube.apply(role({**p.body, "spec": spec.raw}, executors=False))
        # The claims of executors the deployment no longer has: those of other sets (a
        # rescale's old one) and of ordinals past its executors (a rescale to fewer).
        keep = spec.executor_instances if spec.pinning is not Pinning.OFF else 0
        surplus = []
        for executors in self.kube.executor_sets(p.namespace, spark_app_id(p.namespace, p.name)):
            kept = keep if executors == op.executor_set else 0
            surplus += self.kube.delete_claims(p.namespace, executors, kept)
        if surplus:
            self.event(
                "Normal", EventReason.CLAIMS_DELETED, f"state claims no executor uses: {surplus}"
            )
        if op.kind in (OpKind.UPGRADE, OpKind.RESCALE):
            p.condition(
                ConditionType.UPGRADE_SUCCEEDED, True, ConditionReason.COMPLETED, f"running {op.id}"
            )
        p.condition(
            ConditionType.READY, True, ConditionReason.DRIVER_READY, f"driver {op.id} is running"
        )
        split = ", ".join(f"{label} {seconds:.1f} s" for label, seconds in steps.items())
        self.event(
            "Normal",
            op.kind.completed_reason,
            f"{op.kind} complete: running {op.id} from {op.restore} ({split})",
        )


def _target(op: Operation) -> PipelineSpec:
    """The spec the flow brings up (or stops), as recorded when it began."""
    return PipelineSpec.read(op.target or {})


def _pending_stop(driver: DriverApi) -> SavepointRequest | None:
    """The stop-with-savepoint the driver is already taking (409 to a second one)."""
    try:
        pending = [s for s in driver.savepoints() if s.stop]
    except (ControlUnreachable, ControlHTTPError):
        return None
    return pending[-1] if pending else None
