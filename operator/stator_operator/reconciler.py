"""The reconciler: given the pipeline and an observation of it (observer.py), decide what to do
and do it — start a flow, take the next step of the one in flight (flows.py), mirror the
driver's progress, restart or roll back a failed driver, or delete the pipeline."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

from stator.control.schema import JobInfo, mirror
from stator.control.wire import Json
from stator.driver.restart import History, decide

from . import checkpoint_health
from .admission import (
    check_job_config,
    check_name,
    check_namespace,
    check_pods,
    check_storage_roots,
)
from .autoscaling import autoscaler
from .autoscaling.autoscaler import Autoscaler
from .flows import DriverFailed, Flows
from .job_config import restart_config
from .metrics_summary import metrics_summary
from .naming import (
    JOB_FAILED_EXIT_CODE,
    STATE_VOLUME,
    STOPPED_EXIT_CODE,
    console_hint,
    running_executor_set,
    spark_app_id,
)
from .observer import Observation
from .operation import PERIODIC, OpKind, Step
from .outcomes import ConditionReason, ConditionType, EventReason, Phase, PodPhase, Restore
from .pipeline_spec import Pinning, PipelineSpec, SpecError, UpgradeMode
from .pipeline_status import LastOperation, PipelineStatus
from .ports import EventSink, KubeApi, NotOwned
from .spec import (
    Change,
    attempt_fingerprint,
    check_transition,
    classify,
)
from .status import StatusWriter, age_s, now, stamp_ms
from .storage import SavepointStorage
from .untrusted import bounded_fields


@dataclass
class Reconciler:
    pipeline: StatusWriter
    kube: KubeApi
    storage: SavepointStorage
    event: EventSink
    # Refuse pipelines in namespaces whose Pod Security admission is not "restricted".
    require_restricted: bool = True
    flows: Flows = field(init=False)

    def __post_init__(self) -> None:
        self.flows = Flows(self.pipeline, self.kube, self.storage, self.event)

    def reconcile(self, obs: Observation) -> float:
        """Take the next step; returns seconds until the operator should look again (0: at
        once)."""
        op = self.pipeline.operation
        if op is None:
            return self._plan(obs)
        # What the observer asked the running driver, if anything (step 0, pre-start: it
        # still processes): the observer alone decides when.
        self._mirror(obs)
        try:
            result = self.flows.advance(op, obs)
        except NotOwned as exc:  # the step waits (its status says where) until that is fixed
            self._spec_invalid(ConditionReason.NAME_TAKEN, str(exc))
            return NOT_OWNED_WAIT_S
        except SpecError as exc:  # a stored spec the checks of today refuse
            self._spec_invalid(ConditionReason.INVALID_SPEC, f"the operation's spec: {exc}")
            return NOT_OWNED_WAIT_S
        valid = self.pipeline.has_condition(ConditionType.SPEC_VALID, False)
        if valid and self._invalid_reason() == ConditionReason.NAME_TAKEN:
            self._spec_accepted()
        if isinstance(result, DriverFailed):
            target = PipelineSpec.read(op.target) if op.target else self.pipeline.spec
            # A restart continues the run this flow started (or continued).
            run = (op.restore or Restore.LATEST, op.lineage or op.id)
            savepoint = op.savepoint
            if op.kind is OpKind.RESUME and op.restore not in (None, *Restore):
                savepoint = op.restore  # what a rollback of the resumed spec restores
            # classify's decision as the flow recorded it (unset for the flows classify
            # does not start: restart, rollback, savepoint, delete)
            rolls_back = bool(op.changes_spec)
            return self._driver_failed(rolls_back, target, savepoint, result.reason, run=run)
        return result

    def delete(self, obs: Observation) -> float | None:
        """One step of deleting the pipeline (its finalizer): a final savepoint if
        ``deletion.finalSavepoint`` and a driver is there, then remove the driver, then
        dispose the savepoint history if ``savepoints.disposeOnDelete``. Returns None once
        the pipeline may go, else seconds until the next step. Past
        ``deletion.timeoutSeconds`` the driver is removed regardless."""
        spec = self.pipeline.spec
        op = self.pipeline.operation
        if op is None or op.kind is not OpKind.DELETE:
            final = spec.deletion.final_savepoint
            self.flows.start(
                OpKind.DELETE,
                Step.SAVEPOINT if final and obs.pod is not None else Step.REMOVE_DRIVER,
                target=self.pipeline.status.last_reconciled_spec or spec.raw,
                delete_started_at=now(),
            )
            return 0.0
        if not op.done:
            timeout = spec.deletion.timeout_seconds
            if age_s(op.delete_started_at) <= timeout:
                result = self.flows.advance(op, obs)  # steps 1-3: no driver to await
                return 0.0 if isinstance(result, DriverFailed) else result
            self.event(
                "Warning",
                EventReason.DELETE_TIMED_OUT,
                f"final savepoint not done after {timeout:.0f}s; removing the driver",
            )
            self.kube.delete_drivers(self.pipeline.namespace, self.pipeline.name)
        p = self.pipeline
        claims = []
        for executors in self.kube.executor_sets(p.namespace, spark_app_id(p.namespace, p.name)):
            claims += self.kube.delete_claims(p.namespace, executors, 0)
        if claims:
            self.event("Normal", EventReason.CLAIMS_DELETED, f"executors' state claims: {claims}")
        ran = PipelineSpec.read(op.target) if op.target else spec
        problem = self.storage.release_checkpoints(p.namespace, ran, p.name, p.uid)
        if problem:  # a pipeline created again under the name needs checkpointing.adopt
            self.event("Warning", EventReason.CHECKPOINTS_NOT_RELEASED, problem)
        if spec.savepoints.dispose_on_delete:
            # The final savepoint this deletion took is kept unless asked: it is the state.
            final = spec.deletion.dispose_final_savepoint
            kept = []
            for sp in self.pipeline.status.savepoints:
                if sp.trigger == OpKind.DELETE and not final:
                    kept.append(sp.path)
                    continue
                self.storage.dispose(self.pipeline.namespace, spec, sp.path, sp.root)
            also = f"; kept the final savepoint {kept[-1]}" if kept else ""
            self.event(
                "Normal", EventReason.SAVEPOINTS_DISPOSED, f"disposed the savepoint history{also}"
            )
        self.event("Normal", EventReason.DELETED, "pipeline deleted")
        autoscaler.forget(p.namespace, p.name)
        return None

    # ------------------------------------------------------------------ no flow in flight

    def _plan(self, obs: Observation) -> float:
        """Start a flow if the spec asks for one, else watch the driver."""
        status = self.pipeline.status
        ran = status.last_reconciled_spec
        running = None if ran is None else PipelineSpec.read(ran)
        spec = self._valid_spec()
        if spec is None:
            if running is not None and not status.suspended:
                self._watch(obs, running)  # the last good spec keeps running meanwhile
            return 30.0
        change = classify(ran, spec.raw, suspended=status.suspended)
        if ran is None or running is None:
            return self._first_deploy(spec, change, obs)
        self._spec_accepted()
        if change.kind is OpKind.SUSPEND:
            return self._start(OpKind.SUSPEND, Step.SAVEPOINT, target=ran)
        if change.kind is OpKind.RESUME:
            restore = status.suspended_with or Restore.LATEST
            # A spec rolled back before is not tried again by a resume: the last good one
            # resumes (as it would have kept running), until the spec changes.
            failed = status.failed_spec == attempt_fingerprint(spec.raw)
            target = ran if failed else spec.raw
            return self._start(
                OpKind.RESUME,
                Step.DEPLOY,
                target=target,
                restore=restore,
                changes_spec=bool(change.fields) and not failed,
            )
        if status.suspended:
            return 30.0
        if change.kind is None and status.phase in (Phase.FINISHED, Phase.FAILED):
            return 10.0  # the job ended (or gave up): nothing to do until the spec changes
        if change.kind in (OpKind.UPGRADE, OpKind.RESCALE):
            if status.failed_spec == attempt_fingerprint(spec.raw):
                return self._watch(obs, running)  # this spec was rolled back: wait for another
            return self._redeploy(spec, change)
        nonce = spec.savepoints.trigger_nonce
        if nonce is not None and nonce != status.savepoint_nonce:
            return self._start(OpKind.SAVEPOINT, Step.SAVEPOINT, target=ran, nonce=nonce)
        if self._periodic_due():
            self.pipeline.write(periodicSavepointAt=now())
            return self._start(OpKind.SAVEPOINT, Step.SAVEPOINT, target=ran, trigger=PERIODIC)
        wait = self._watch(obs, running)
        steady = self.pipeline.operation is None and self.pipeline.status.phase is Phase.RUNNING
        if obs.job is not None and steady:
            Autoscaler(self.pipeline, self.kube, self.event).step(spec, running, obs.job)
        return wait

    def _redeploy(self, spec: PipelineSpec, change: Change) -> float:
        """A rescale always goes through a savepoint; an upgrade by ``upgradeMode``. The
        flow records the change's decision (``rescales``) for its steps to read."""
        mode = spec.upgrade_mode
        kind = change.kind or OpKind.UPGRADE
        self.event(
            "Normal", EventReason.SPEC_CHANGED, f"{kind} ({mode}): {', '.join(change.fields)}"
        )
        self.pipeline.write(restartHistory=None)  # a new spec gets a fresh restart budget
        fields: dict[str, Any] = {
            "target": spec.raw,
            "rescales": change.rescales,
            "changes_spec": True,
        }
        if kind is OpKind.RESCALE or mode is UpgradeMode.SAVEPOINT:
            first = Step.PRESTART if spec.driver.prestart else Step.SAVEPOINT
            return self._start(kind, first, mode=UpgradeMode.SAVEPOINT, **fields)
        restore = Restore.LATEST if mode is UpgradeMode.LAST_STATE else Restore.NONE
        return self._start(kind, Step.REMOVE_DRIVER, mode=mode, restore=restore, **fields)

    def _first_deploy(self, spec: PipelineSpec, change: Change, obs: Observation) -> float:
        """Deploy, once the initial savepoint (if any) is known readable; a pipeline created
        suspended waits for ``state: running``."""
        if change.kind is not OpKind.DEPLOY:  # created suspended
            if not self.pipeline.status.suspended:
                self._spec_accepted()
                self.pipeline.write(phase=Phase.SUSPENDED)
                self.event(
                    "Normal",
                    EventReason.SUSPENDED,
                    "created suspended: nothing runs until spec.state is running",
                )
            return 30.0
        restore = spec.restore.initial_savepoint or Restore.LATEST
        if restore != Restore.LATEST and obs.restore_problem is not None:
            self._spec_invalid(
                ConditionReason.UNREADABLE_SAVEPOINT,
                f"spec.restore.initialSavepoint: {obs.restore_problem}",
            )
            return 30.0
        self._spec_accepted()
        return self._start(OpKind.DEPLOY, Step.DEPLOY, restore=restore, target=spec.raw)

    def _start(self, kind: OpKind, step: Step, **fields: Any) -> float:
        self.flows.start(kind, step, **fields)
        return 0.0

    def _periodic_due(self) -> bool:
        """``savepoints.periodicSeconds`` since the last savepoint, periodic attempt or
        deployment, whichever is latest."""
        status = self.pipeline.status
        every = self.pipeline.spec.savepoints.periodic_seconds
        if not every or status.phase is not Phase.RUNNING:
            return False
        stamps = [h.time or "" for h in status.savepoints]
        stamps += [
            (status.deployment.ready_at if status.deployment else None) or "",
            status.periodic_savepoint_at or "",
        ]
        latest = max(stamps)
        return bool(latest) and age_s(latest) >= every

    # ------------------------------------------------------------------ the running driver

    def _watch(self, obs: Observation, running: PipelineSpec) -> float:
        """Mirror the driver's progress into status; a failed, vanished or lost driver
        restarts."""
        status = self.pipeline.status
        ended = self._ended(obs, running)
        if ended is not None:
            return ended
        if running.pinning is Pinning.PREFERRED:
            self._release_lost_executors()
        history = status.savepoints
        kept = self.flows.prune(history)
        if kept != history:
            self.pipeline.write(savepoints=kept)
        if obs.driver is None:
            return 2.0
        if obs.phase == PodPhase.RUNNING and status.phase is not Phase.RUNNING:
            self.pipeline.write(phase=Phase.RUNNING)  # the phase follows the driver that runs now
        hint = console_hint(self.pipeline.name, self.pipeline.namespace)
        if (self.pipeline.body.get("status") or {}).get("console") != hint:
            self.pipeline.write(console=hint)  # once: how to open the web console
        job = self._mirror(obs)
        if job is None:
            return 2.0
        self._report_processing_again(status, job)
        self._report_checkpoint_health(status, job)
        held = self.pipeline.status.condition(ConditionType.CHECKPOINTS_HEALTHY)
        limit = running.failover.readiness_timeout_seconds
        stuck = checkpoint_health.stuck(held, limit)
        if stuck is not None:
            return self._driver_failed(False, running, None, stuck)
        return 2.0

    def _mirror(self, obs: Observation) -> JobInfo | None:
        """The driver's answer into status (bounded, written when it changed); a malformed
        answer is an error in status, no crash."""
        job = obs.job
        fields: dict[str, Json]
        if obs.job_invalid is not None:
            fields = {"lastError": f"the driver's status could not be read: {obs.job_invalid:.300}"}
        elif job is not None:
            fields = bounded_fields(_job_fields(job))
        else:
            return None
        if any(self.pipeline.status.mirrored.get(k) != v for k, v in fields.items()):
            self.pipeline.write(**fields)
        return job

    def _report_checkpoint_health(self, status: PipelineStatus, job: JobInfo) -> None:
        """The ``CheckpointsHealthy`` condition (written when it changes) and an event for
        each failover the driver's checkpoint health caused (``checkpoint_health.py``)."""
        failover = checkpoint_health.new_failover(
            job.checkpoint_health, status.mirrored.get("checkpointHealth")
        )
        if failover is not None:
            self.event("Warning", EventReason.CHECKPOINT_FAILOVER, failover)
        verdict = checkpoint_health.condition(job)
        if verdict is None:
            return
        now_is = status.condition(ConditionType.CHECKPOINTS_HEALTHY)
        if now_is is None or (now_is.ok, now_is.reason, now_is.message) != (
            verdict.ok,
            verdict.reason,
            verdict.message[:1000],
        ):
            self.pipeline.condition(
                ConditionType.CHECKPOINTS_HEALTHY, verdict.ok, verdict.reason, verdict.message
            )

    def _report_processing_again(self, status: PipelineStatus, job: JobInfo) -> None:
        """The new driver processes (``processing_again``): the flow's downtime and start-up
        split."""
        again = processing_again(status, job)
        if not again or status.deployment is None:
            return
        self.pipeline.write(lastOperation=again)
        startup = again.driver_startup_seconds or {}
        split = ", ".join(f"{k} {v:.1f} s" for k, v in startup.items())
        downtime = again.downtime_seconds
        after = "" if downtime is None else f" {downtime:.1f} s after the operation began"
        idle = job.startup.caught_up_ms is not None
        did = "was caught up (nothing to read)" if idle else "ran its first epoch"
        self.event(
            "Normal",
            EventReason.PROCESSING_AGAIN,
            f"driver {status.deployment.id} {did}{after} (start-up: {split})",
        )

    def _ended(self, obs: Observation, running: PipelineSpec) -> float | None:
        """The driver finished, stopped, failed, vanished or is lost: what follows."""
        if obs.phase == PodPhase.SUCCEEDED:  # a bounded job read all its input
            if self.pipeline.status.phase is not Phase.FINISHED:
                self.pipeline.write(phase=Phase.FINISHED)
                self.event("Normal", EventReason.FINISHED, "the job finished its input")
            return 10.0
        if obs.phase == PodPhase.FAILED and obs.exit_code == STOPPED_EXIT_CODE:
            return self._stopped_outside(running)
        if obs.phase == PodPhase.FAILED and obs.exit_code == JOB_FAILED_EXIT_CODE:
            return self._job_failed(obs)
        if obs.pod is None or obs.phase == PodPhase.FAILED:
            gone = "gone" if obs.pod is None else obs.phase
            reason = f"driver pod {gone} (exit {obs.exit_code})"
            return self._driver_failed(False, running, None, reason)
        pod = (obs.pod or {}).get("metadata", {}).get("name")
        if obs.lease is not None and obs.lease.lapsed and obs.lease.holder == pod:
            return self._driver_lost(obs, running)
        return None

    def _driver_lost(self, obs: Observation, running: PipelineSpec) -> float:
        """The driver stopped renewing its Lease: its node is lost (powered off, or cut off)
        or it hangs. Kubernetes cannot tell whether it still runs, so its pod is removed at
        once (no kubelet may ever confirm it) and a new driver restarts from the latest
        checkpoint; the old one, should it still run, writes nothing more (its Lease lapsed:
        ``stator.ha.fencing``)."""
        assert obs.lease is not None and obs.pod is not None
        pod = obs.pod["metadata"]["name"]
        node = (obs.pod.get("spec") or {}).get("nodeName") or "?"
        reason = (
            f"driver pod {pod} on node {node} has not renewed its lease for "
            f"{obs.lease.silent_s:.0f} s (lease duration {obs.lease.duration_s} s): its node is "
            f"lost or it hangs"
        )
        self.event("Warning", EventReason.DRIVER_LOST, f"{reason}; removing it")
        self.kube.delete_pod(self.pipeline.namespace, pod, grace_s=0)
        avoid = None if node == "?" else node
        return self._driver_failed(False, running, None, reason, avoid_node=avoid)

    def _release_lost_executors(self) -> None:
        """``localRecovery.pinning: preferred``: an executor whose node is unreachable gives
        up its volume there and starts on another node (its key-groups restore from the
        object store); ``required`` waits for the node instead."""
        p = self.pipeline
        deployment = p.status.deployment
        recorded = deployment.executor_set if deployment else None
        executors = running_executor_set(recorded, p.namespace, p.name)
        moved = self.kube.release_lost(p.namespace, executors, STATE_VOLUME)
        if moved:
            self.event(
                "Warning",
                EventReason.EXECUTORS_MOVED,
                f"executor pod(s) {moved} were on an unreachable node; their local volumes "
                f"are released and they start on another node (pinning: preferred)",
            )

    def _job_failed(self, obs: Observation) -> float:
        """The driver ended the job itself (exit 2): a failure restarting cannot fix (bad
        configuration, incompatible state, a user function that raises on the same record),
        or its own restart strategy gave up. Restarting the pod would only repeat it: the
        pipeline is Failed, with the driver's cause, until its spec changes."""
        p = self.pipeline
        cause = obs.termination_message or p.status.last_error or "the job failed (exit 2)"
        p.write(operation=None, phase=Phase.FAILED, lastError=cause)
        p.condition(ConditionType.READY, False, ConditionReason.JOB_FAILED, cause)
        self.event("Warning", EventReason.JOB_FAILED, cause)
        return 60.0

    def _stopped_outside(self, running: PipelineSpec) -> float:
        """The job stopped with a savepoint that no flow of the operator asked for (another
        holder of the control token): not Finished; it runs again from its latest checkpoint
        (the stop took one with the savepoint), as the spec says it should be running."""
        message = (
            "the job was stopped with a savepoint the operator did not request; "
            "redeploying from its latest checkpoint"
        )
        self.event("Warning", EventReason.STOPPED_OUTSIDE_OPERATOR, message)
        self.pipeline.write(lastError=message)
        restore, lineage = self._running_run()
        return self._start(
            OpKind.RESTART, Step.REMOVE_DRIVER, target=running.raw, restore=restore, lineage=lineage
        )

    def _driver_failed(
        self,
        rolls_back: bool,
        target: PipelineSpec,
        savepoint: str | None,
        reason: str,
        avoid_node: str | None = None,
        run: tuple[str, str | None] | None = None,
    ) -> float:
        """A driver failed (or never became ready). A flow that brought up a new spec
        (``rolls_back``: an upgrade, a rescale, a resume of a spec changed while suspended)
        rolls back to the last stable spec and remembers the failed one, so it is not
        retried; anything else restarts from the latest checkpoint when the job's restart strategy
        (``spec.failover``, the same rules as the driver's) says, or gives up."""
        p = self.pipeline
        stable = p.status.last_stable_spec
        p.write(lastError=reason)
        if rolls_back and stable is not None:
            self.event("Warning", EventReason.UPGRADE_FAILED, f"{reason}; rolling back")
            p.condition(
                ConditionType.UPGRADE_SUCCEEDED,
                False,
                ConditionReason.ROLLED_BACK,
                f"{reason}; rolled back to the last stable spec. Change the spec to try again",
            )
            p.write(failedSpec=attempt_fingerprint(target.raw))
            restore = savepoint or Restore.LATEST
            return self._start(OpKind.ROLLBACK, Step.REMOVE_DRIVER, target=stable, restore=restore)
        restarts = p.status.restarts + 1
        strategy = restart_config(target, p.name, p.namespace)
        history = History.from_json(p.status.restart_history)
        decision = decide(strategy, history, time.time())
        if decision.delay_ms is None:
            gave_up = f"{reason}; gave up: {decision.why}"
            p.write(
                operation=None,
                phase=Phase.FAILED,
                restarts=restarts,
                restartHistory=decision.history.to_json(),
            )
            self.event("Warning", EventReason.FAILED, gave_up)
            p.condition(ConditionType.READY, False, ConditionReason.RESTARTS_EXHAUSTED, gave_up)
            return 60.0
        p.write(restarts=restarts, restartHistory=decision.history.to_json())
        delay_s = decision.delay_ms / 1000
        self.event(
            "Warning", EventReason.DRIVER_FAILED, f"{reason}; {decision.why}, in {delay_s:.1f}s"
        )
        restore, lineage = run or self._running_run()
        return self._start(
            OpKind.RESTART,
            Step.REMOVE_DRIVER,
            target=target.raw,
            restore=restore,
            lineage=lineage,
            not_before=time.time() + delay_s,
            avoid_node=avoid_node,
        )

    def _running_run(self) -> tuple[str, str | None]:
        """What a restart of the running deployment restores: its own run's latest checkpoint
        (``restore.lineage``), else where that run began (a savepoint, empty state). Not
        ``latest`` alone: before the run's first checkpoint that is the storage's newest
        checkpoint of another run, or none at all, and the job would start empty. A
        deployment whose lineage is unreadable (a status edited by hand): ``latest``."""
        deployment = self.pipeline.status.deployment
        if deployment is None or not deployment.lineage:
            return Restore.LATEST, None
        return deployment.restored_from or Restore.LATEST, deployment.lineage

    # ------------------------------------------------------------------ spec validity

    def _valid_spec(self) -> PipelineSpec | None:
        """The spec, parsed with the checks the CRD schema cannot express; None if one
        fails (reported as the SpecValid condition)."""
        p = self.pipeline
        try:
            check_name(p.name)
            if self.require_restricted:
                check_namespace(p.namespace, self.kube.namespace_labels(p.namespace))
            spec = PipelineSpec.parse(p.raw_spec)
            check_storage_roots(spec, p.name, p.namespace)
            check_job_config(spec, p.name, p.namespace)
            check_pods(spec, p.name, p.namespace)
            running = p.status.last_reconciled_spec
            if running is not None:
                suspended = p.status.suspended
                with_ = (p.status.suspended_with or Restore.LATEST) if suspended else None
                check_transition(PipelineSpec.read(running), spec, with_)
        except ValueError as exc:
            self._spec_invalid(ConditionReason.INVALID_SPEC, str(exc))
            return None
        return spec

    def _spec_invalid(self, reason: ConditionReason, message: str) -> None:
        """Report a spec that cannot run: condition, lastError, one event per new message;
        ``phase: Failed`` only if nothing runs (a running job keeps its last good spec)."""
        p = self.pipeline
        if p.status.last_error != message:
            self.event("Warning", EventReason.INVALID_SPEC, message)
        p.condition(ConditionType.SPEC_VALID, False, reason, message)
        if p.status.last_reconciled_spec is None:
            # One patch: no reader sees the phase without its cause.
            p.write(phase=Phase.FAILED, lastError=message)
        else:
            p.write(lastError=message)

    def _invalid_reason(self) -> str | None:
        found = self.pipeline.status.condition(ConditionType.SPEC_VALID)
        return None if found is None else found.reason

    def _spec_accepted(self) -> None:
        """A spec that was reported invalid has been fixed: say so once."""
        if self.pipeline.has_condition(ConditionType.SPEC_VALID, False):
            self.pipeline.condition(
                ConditionType.SPEC_VALID, True, ConditionReason.VALID, "the spec is accepted"
            )
            self.pipeline.write(lastError=None)


def _job_fields(job: JobInfo) -> dict[str, Json]:
    """The status fields a running driver's answer gives (bounded by the caller): the
    answer's fields under their camelCase names (``stator.control.schema.mirror``)."""
    fields: dict[str, Json] = {
        **mirror(job, "epoch", "parallelism", "lag_records", "lag_ms"),
        "jobState": job.state,
    }
    latest = job.latest_checkpoint
    if latest:
        fields["latestCheckpoint"] = {
            **mirror(latest, "id", "epoch", "state_bytes", "incremental_bytes"),
            "time": stamp_ms(latest.created_ms),
        }
    if job.last_error:
        fields["lastError"] = job.last_error
    if job.checkpoint_health is not None:
        fields["checkpointHealth"] = checkpoint_health.status_field(job.checkpoint_health)
    fields.update(_restores_and_placement(job))
    fields.update(metrics_summary(job))
    return fields


def _restores_and_placement(job: JobInfo) -> dict[str, Json]:
    """The driver's restores (counts, and the latest per subtask), its failover regions
    (state, epoch, restarts, latest checkpoint, last error of each), what its standby copies
    read (``localRecovery.standby``) and, with executors as pods, which node holds which
    key-group ranges at which checkpoint."""
    out: dict[str, Json] = {}
    standby = mirror(job.standby_copies, *STANDBY_FIELDS) if job.standby_copies else {}
    if any(standby.values()):
        out["standbyCopies"] = standby
    restores = job.restores
    if restores:
        out["restores"] = {
            **mirror(restores, "local", "remote", "local_bytes", "remote_bytes"),
            "latest": [mirror(r, *RESTORE_FIELDS) for r in restores.latest],
        }
    if job.regions:
        out["regions"] = [
            {
                **mirror(r, *REGION_FIELDS),
                "latestCheckpoint": r.latest_checkpoint.id if r.latest_checkpoint else None,
            }
            for r in job.regions
        ]
    placement = job.placement
    if placement:
        parallelism = job.parallelism or {}
        out["placement"] = {
            **mirror(placement, "keyed_tasks", "keyed_tasks_local"),
            "subtasks": [
                {
                    "operator": uid,
                    **mirror(e, *PLACED_FIELDS),
                    **(mirror(e, "standby") if e.standby else {}),
                }
                for uid, entries in sorted(placement.subtasks.items())
                for e in entries
                if e.parallelism == parallelism.get(uid)
            ],
        }
    return out


# The fields of each part of a driver's answer that the status mirrors (as camelCase).
STANDBY_FIELDS = ("copies", "bytes", "failed")
RESTORE_FIELDS = (
    "operator",
    "subtask",
    "checkpoint_id",
    "source",
    "local_bytes",
    "remote_bytes",
    "node",
)
REGION_FIELDS = ("id", "state", "epoch", "restarts", "last_error")
PLACED_FIELDS = ("subtask", "node", "executor", "key_groups", "checkpoint_id")


# (label, mark it ends at) of the new driver's start-up, in order; each starts where the
# previous ended, the first at the end of the operator's deploy step (or at the hand-over, if
# step 3 sent it). A pre-started driver reached the first marks before that (0 s each: they
# were no downtime).
NOT_OWNED_WAIT_S = 10.0

STARTUP_STEPS = (
    ("pod-start", "process_started_ms"),  # scheduling, image, container start
    ("python-start", "driver_started_ms"),  # interpreter, imports, loading the pipeline
    ("handover", "handover_ms"),  # a pre-started driver: until it was told what to restore
    ("spark-session", "spark_ready_ms"),  # JVM, SparkContext, executors registering
    ("recovery", "recovered_ms"),  # finding and reading the checkpoint or savepoint
    ("caught-up", "caught_up_ms"),  # idle: nothing to read before a first epoch
    ("first-epoch", "first_epoch_ms"),  # the state restore and the first records
)
DOWNTIME_KINDS = (OpKind.UPGRADE, OpKind.RESCALE)  # flows that stop the old driver at once


def processing_again(status: PipelineStatus, job: JobInfo) -> LastOperation | None:
    """Once the driver a flow brought up processes (its first epoch ended, or before one it
    found nothing to read: no input waits for it): the flow's record with when, how its
    start-up split, and for an upgrade or rescale the downtime: from the moment the old
    driver stopped processing (its stop-with-savepoint's epoch began, after its last epoch of
    records) to that moment; without the first (no savepoint: a fallback to the latest
    checkpoint), from the savepoint step. Driver and operator clocks are compared: on one
    cluster they agree to well under these seconds."""
    last = status.last_operation
    startup = job.startup
    first = startup.processing_ms
    deployment = status.deployment.id if status.deployment else None
    if last is None or not first or last.processing_again_at or last.id != deployment:
        return None
    steps = last.step_seconds
    ready_at = last.ready_at_ms
    # The hand-over at step 3 (before the old driver was removed), else the deploy step's end.
    mark = last.handed_over_at_ms or ready_at - 1000 * (steps.get("await-ready") or 0.0)
    split: dict[str, float] = {}
    for label, key in STARTUP_STEPS:
        at = getattr(startup, key)
        if at:
            split[label] = round(max(0.0, (at - mark) / 1000), 2)
            mark = max(mark, at)
    downtime = None
    if last.kind in DOWNTIME_KINDS:  # step 0 (pre-start) is no downtime
        total = last.total_seconds - (steps.get("prestart") or 0.0)
        stopped = last.processing_stopped_at_ms
        began = stopped / 1000 if stopped else ready_at / 1000 - total
        downtime = round(first / 1000 - began, 2)
    return replace(
        last,
        processing_again_at=stamp_ms(first),
        driver_startup_seconds=split,
        downtime_seconds=downtime,
    )
