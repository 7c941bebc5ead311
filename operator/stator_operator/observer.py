"""The observer: what is true now about one pipeline, read before every decision.

It reads, never writes, and reads only what the next decision needs (as the Flink operator's
observer does): the driver pod of the current deployment always; then, by the operation in
flight, the job's progress (none: steady state), its readiness (await-ready), the savepoint
request (await-savepoint, and storage when the driver cannot say), the pre-started driver
(prestart, and deploy when it is handed over), or whether the initial savepoint is readable
(before the first deployment)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from stator.control.client import (
    ControlAnswerInvalid,
    ControlClient,
    ControlHTTPError,
    ControlUnreachable,
)
from stator.control.schema import JobInfo, SavepointRequest
from stator.ha.lease import Silence

from .naming import CONTROL_PORT, CONTROL_TOKEN_KEY, control_secret_name, driver_lease_name
from .operation import Operation, Step
from .outcomes import PodPhase, Restore
from .pipeline_spec import PipelineSpec
from .ports import Connect, DriverApi, KubeApi
from .status import StatusWriter
from .storage import SavepointStorage

ENDED = (PodPhase.SUCCEEDED, PodPhase.FAILED)

# How long each driver's Lease has been silent, on this operator's clock. An operator that
# restarts starts counting afresh, which only delays a verdict.
clock: Callable[[], float] = time.monotonic
_SILENCE: dict[tuple[str, str], Silence] = {}


@dataclass(frozen=True)
class LeaseSilence:
    """How long the holder of a driver's Lease has not renewed it."""

    holder: str | None
    silent_s: float
    duration_s: int

    @property
    def lapsed(self) -> bool:
        return bool(self.holder) and self.duration_s > 0 and self.silent_s > self.duration_s


def control_url(pod: dict[str, Any] | None) -> str | None:
    """The control API of a driver pod, once it has an address."""
    ip = ((pod or {}).get("status") or {}).get("podIP")
    return f"http://{ip}:{CONTROL_PORT}" if ip else None


@dataclass(frozen=True)
class PrestartedDriver:
    """The driver an operation started ahead of stopping the old one (flows.py step 0)."""

    pod: dict[str, Any] | None = None
    driver: DriverApi | None = None
    state: str | None = None  # its job's state; STANDBY while it waits for the hand-over
    unreachable: str | None = None

    @property
    def ended(self) -> bool:
        return ((self.pod or {}).get("status") or {}).get("phase") in ENDED

    @property
    def termination_message(self) -> str | None:
        return Observation(pod=self.pod).termination_message

    @property
    def exit_code(self) -> int | None:
        return Observation(pod=self.pod).exit_code


@dataclass(frozen=True)
class Observation:
    pod: dict[str, Any] | None = None  # the driver pod of the current deployment
    driver: DriverApi | None = None  # its control API, once the pod has an address
    ready: bool = False  # the pod runs and the job reports RUNNING
    job: JobInfo | None = None  # GET /v1/job (steady state)
    job_invalid: str | None = None  # why that answer did not fit the schema
    savepoint: SavepointRequest | None = None  # the operation's savepoint request
    savepoint_error: str | None = None  # the driver's answer when it could not give it
    unreachable: str | None = None  # why the control API did not answer
    found_savepoint: str | None = None  # the request's savepoint, found in storage
    restore_problem: str | None = None  # why restore.initialSavepoint cannot be read
    # The operation's pre-started driver (steps 0 and 4), beside the running one above.
    next: PrestartedDriver | None = None
    lease: LeaseSilence | None = None  # the driver's Lease (steady state)

    @property
    def phase(self) -> str | None:
        return ((self.pod or {}).get("status") or {}).get("phase")

    @property
    def ended(self) -> bool:
        return self.phase in ENDED

    @property
    def termination_message(self) -> str | None:
        """What the driver wrote to /dev/termination-log: its final error line."""
        for cs in ((self.pod or {}).get("status") or {}).get("containerStatuses") or []:
            message = ((cs.get("state") or {}).get("terminated") or {}).get("message")
            if message:
                return str(message).strip()
        return None

    @property
    def exit_code(self) -> int | None:
        for cs in ((self.pod or {}).get("status") or {}).get("containerStatuses") or []:
            term = (cs.get("state") or {}).get("terminated")
            if term:
                code = term.get("exitCode")
                return None if code is None else int(code)
        return None


@dataclass
class Observer:
    kube: KubeApi
    storage: SavepointStorage
    connect: Connect = ControlClient

    def observe(self, pipeline: StatusWriter) -> Observation:
        op = pipeline.operation
        pod = self._current_pod(pipeline, op)
        url = control_url(pod)
        driver = self.connect(url, token=self._token(pipeline)) if url else None
        base = Observation(pod=pod, driver=driver)
        if op is None:
            return self._steady(pipeline, base)
        if op.step is Step.PRESTART and driver is not None:
            # The running driver processes until the new one waits (tens of seconds on a
            # loaded machine): its lag and rates stay live in status meanwhile.
            base = self._job(driver, base)
        if op.step is Step.PRESTART or (
            op.prestarted and op.step in (Step.REMOVE_DRIVER, Step.DEPLOY)
        ):
            base = replace(base, next=self._prestarted(pipeline, op))
        if op.step is Step.AWAIT_READY:
            return self._readiness(base)
        if op.step is Step.AWAIT_SAVEPOINT and op.savepoint_request:
            return self._savepoint(pipeline, op, op.savepoint_request, base)
        return base

    def _token(self, pipeline: StatusWriter) -> str | None:
        """The control API's bearer token; None if its Secret is gone (deleted by hand: the
        operator makes it before any driver, which then refuses the calls, as a wrong token)."""
        try:
            data = self.kube.read_secret(pipeline.namespace, control_secret_name(pipeline.name))
        except LookupError:
            return None
        return data.get(CONTROL_TOKEN_KEY)

    def _current_pod(self, pipeline: StatusWriter, op: Operation | None) -> dict[str, Any] | None:
        """The driver being brought up while an operation awaits readiness, else the one that
        was last ready."""
        if op is not None and op.step is Step.AWAIT_READY:
            deployment: str | None = op.id
        else:
            running = pipeline.status.deployment
            deployment = running.id if running else None
        if not deployment:
            return None
        return self.kube.driver_pod(pipeline.namespace, pipeline.name, deployment)

    def _prestarted(self, pipeline: StatusWriter, op: Operation) -> PrestartedDriver:
        pod = self.kube.driver_pod(pipeline.namespace, pipeline.name, op.id)
        url = control_url(pod)
        if pod is None or url is None:
            return PrestartedDriver(pod=pod)
        driver = self.connect(url, token=self._token(pipeline))
        try:
            return PrestartedDriver(pod, driver, state=driver.ready().state)
        except (ControlUnreachable, ControlHTTPError) as exc:
            return PrestartedDriver(pod, driver, unreachable=str(exc))

    def _steady(self, pipeline: StatusWriter, base: Observation) -> Observation:
        if pipeline.status.last_reconciled_spec is None:  # nothing deployed yet
            spec = pipeline.spec
            initial = spec.restore.initial_savepoint
            if initial and initial != Restore.LATEST:
                problem = self.storage.restore_problem(pipeline.namespace, spec, initial)
                return replace(base, restore_problem=problem)
            return base
        if base.pod is None or base.ended:
            return base
        base = replace(base, lease=self._lease(pipeline))
        return base if base.driver is None else self._job(base.driver, base)

    def _job(self, driver: DriverApi, base: Observation) -> Observation:
        try:
            return replace(base, job=driver.job())
        except ControlAnswerInvalid as exc:  # an error in status, not silence
            return replace(base, job_invalid=str(exc))
        except (ControlUnreachable, ControlHTTPError) as exc:
            return replace(base, unreachable=str(exc))

    def _lease(self, pipeline: StatusWriter) -> LeaseSilence | None:
        name = driver_lease_name(pipeline.name)
        found = self.kube.driver_lease(pipeline.namespace, name)
        if found is None:
            return None
        holder, renewed, duration = found
        silence = _SILENCE.setdefault((pipeline.namespace, name), Silence())
        return LeaseSilence(holder, silence.observe(holder, renewed, clock()), duration)

    def _readiness(self, base: Observation) -> Observation:
        if base.driver is None or base.phase != PodPhase.RUNNING:
            return base
        try:
            return replace(base, ready=base.driver.ready().ready)
        except (ControlUnreachable, ControlHTTPError) as exc:
            return replace(base, unreachable=str(exc))

    def _savepoint(
        self, pipeline: StatusWriter, op: Operation, request_id: str, base: Observation
    ) -> Observation:
        if base.driver is None:
            unreachable = "no driver pod" if base.pod is None else "the driver pod has no address"
        else:
            try:
                return replace(base, savepoint=base.driver.savepoint(request_id))
            except ControlHTTPError as exc:
                return replace(base, savepoint_error=exc.error)
            except ControlUnreachable as exc:
                unreachable = str(exc)
        # The driver may have stopped before it was asked: look in storage, where the
        # *running* spec's driver writes (an upgrade's target may name another directory).
        raw = pipeline.status.last_reconciled_spec or op.target
        spec = PipelineSpec.read(raw) if raw else pipeline.spec
        found = self.storage.find(pipeline.namespace, spec, request_id)
        return replace(base, unreachable=unreachable, found_savepoint=found)
