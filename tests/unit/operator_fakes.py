"""In-memory fakes of the two interfaces the operator's observer and reconciler use
(``stator_operator.ports``): the Kubernetes API (status merge patches, driver pods, owned
objects, Secrets) and a driver's control API. Storage is real: ``file://`` under tmp_path."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes.client.rest import ApiException

from stator.control.client import ControlHTTPError, ControlUnreachable, read_answer
from stator.control.schema import (
    HandoverAnswer,
    JobInfo,
    Readiness,
    SavepointList,
    SavepointRequest,
)
from stator_operator.naming import is_executor_set_of
from stator_operator.operation import Operation, Step
from stator_operator.pipeline import Pipeline
from stator_operator.ports import NotOwned
from tests.unit.savepoints import write_savepoint


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386, as the API server applies a status patch: null removes a key."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _app_of(name: str) -> str:
    """The application id in an executor pod's (``spark-s-<app>-0-<n>``) or its claim's
    (``stator-state-spark-s-<app>-0-<n>``) name."""
    return name.partition("spark-s-")[2].rsplit("-", 2)[0]


class FakeKube:
    """One StatefulPipeline and what the operator creates for it."""

    def __init__(self, pipeline: dict[str, Any]) -> None:
        self.pipeline = pipeline
        self.pods: dict[str, dict[str, Any]] = {}
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.configs: dict[str, dict[str, Any]] = {}
        self.secrets: dict[str, dict[str, str]] = {}
        self.patches: list[dict[str, Any]] = []
        self.deleted: list[str] = []
        # Executors as the StatefulSet controller and the node lifecycle controller see them.
        self.executor_pods: dict[str, str] = {}  # pod -> node
        self.claims: set[str] = set()
        self.lost_nodes: set[str] = set()
        # Calls that fail (as the API server or the network would) the next N times.
        self.failing: dict[str, int] = {}
        # The driver's Lease: (holder, renewTime, leaseDurationSeconds); force-deleted pods.
        self.lease: tuple[str | None, object, int] | None = None
        self.force_deleted: list[str] = []
        # Objects of the names the pipeline needs that someone else owns: (kind, name).
        self.foreign: set[tuple[str, str]] = set()
        self.namespace: dict[str, str] = {"pod-security.kubernetes.io/enforce": "restricted"}

    def _call(self, method: str) -> None:
        if self.failing.get(method, 0) > 0:
            self.failing[method] -= 1
            raise ApiException(status=503, reason=f"{method}: the API server is unavailable")

    def patch_status(self, namespace: str, name: str, fields: dict[str, Any]) -> None:
        self.patches.append(copy.deepcopy(fields))
        self.pipeline["status"] = merge_patch(self.pipeline.get("status"), fields)

    def scale_pipeline(self, namespace: str, name: str, replicas: int) -> None:
        """As the scale subresource: spec.replicas, nothing else."""
        self._call("scale_pipeline")
        self.pipeline.setdefault("spec", {})["replicas"] = replicas

    def namespace_labels(self, namespace: str) -> dict[str, str]:
        self._call("namespace_labels")
        return dict(self.namespace)

    def read_secret(self, namespace: str, name: str) -> dict[str, str]:
        return self.secrets[name]

    def driver_pod(self, namespace: str, name: str, deployment: str) -> dict[str, Any] | None:
        for pod in self.pods.values():
            if pod["metadata"]["labels"].get("stator.dev/deployment") == deployment:
                return copy.deepcopy(pod)
        return None

    def delete_drivers(self, namespace: str, name: str, keep: str | None = None) -> bool:
        """Pods asked to go before are gone now; the others (but ``keep``'s) are asked to go."""
        self._call("delete_drivers")
        for pod_name in [n for n, p in self.pods.items() if p["metadata"].get("deleting")]:
            del self.pods[pod_name]
        left = {
            n: p
            for n, p in self.pods.items()
            if keep is None or p["metadata"]["labels"].get("stator.dev/deployment") != keep
        }
        for pod_name, pod in left.items():
            if not pod["metadata"].get("deleting"):
                pod["metadata"]["deleting"] = True
                self.deleted.append(pod_name)
        return bool(left)

    def delete_pod(self, namespace: str, pod: str, grace_s: int = 30) -> None:
        if grace_s == 0:
            self.pods.pop(pod, None)
            self.force_deleted.append(pod)
        elif pod in self.pods:
            self.pods[pod]["metadata"]["deleting"] = True

    def driver_lease(self, namespace: str, lease: str) -> tuple[str | None, object, int] | None:
        return self.lease

    def clear_driver_lease(self, namespace: str, lease: str, keep: str | None = None) -> str | None:
        if self.lease is None or not self.lease[0] or self.lease[0] == keep:
            return None
        holder = self.lease[0]
        self.lease = (None, self.lease[1], self.lease[2])
        return holder

    def _not_foreign(self, obj: dict[str, Any]) -> None:
        kind, name = obj["kind"], obj["metadata"]["name"]
        if (kind, name) in self.foreign:
            raise NotOwned(f"{kind} {name} already exists and is not owned by this pipeline")

    def ensure(self, obj: dict[str, Any]) -> None:
        self._call("ensure")
        self._not_foreign(obj)
        kind, name = obj["kind"], obj["metadata"]["name"]
        if kind == "Pod":
            self.pods.setdefault(name, {**copy.deepcopy(obj), "status": {"phase": "Pending"}})
        elif kind == "Secret":
            self.secrets.setdefault(name, dict(obj["stringData"]))
        else:
            self.objects.setdefault((kind, name), copy.deepcopy(obj))

    def apply(self, obj: dict[str, Any]) -> None:
        self._call("apply")
        self._not_foreign(obj)
        if obj["kind"] == "ConfigMap":
            self.configs[obj["metadata"]["name"]] = copy.deepcopy(obj)
        else:
            self.objects[(obj["kind"], obj["metadata"]["name"])] = copy.deepcopy(obj)

    def executors_left(self, namespace: str, app_id: str) -> bool:
        self._call("executors_left")
        return any(_app_of(p) == app_id for p in self.executor_pods)

    def delete_claims(self, namespace: str, app_id: str, keep: int) -> list[str]:
        gone = sorted(
            c for c in self.claims if _app_of(c) == app_id and int(c.rpartition("-")[2]) >= keep
        )
        self.claims -= set(gone)
        return gone

    def executor_sets(self, namespace: str, base: str) -> list[str]:
        apps = {_app_of(c) for c in self.claims}
        return sorted(a for a in apps if is_executor_set_of(a, base))

    def release_lost(self, namespace: str, app_id: str, claim_prefix: str) -> list[str]:
        moved = sorted(p for p, node in self.executor_pods.items() if node in self.lost_nodes)
        for pod in moved:
            self.claims.discard(f"{claim_prefix}-{pod}")
            del self.executor_pods[pod]
        return moved

    # ------------------------------------------------------------------ what the kubelet does

    def set_phase(self, pod: str, phase: str, ip: str | None = None, exit_code: int = 0) -> None:
        status = self.pods[pod]["status"]
        status["phase"] = phase
        if ip:
            status["podIP"] = ip
        if phase in ("Succeeded", "Failed"):
            terminated = {"exitCode": exit_code}
            status["containerStatuses"] = [{"name": "driver", "state": {"terminated": terminated}}]


@dataclass
class FakeDriver:
    """A driver's control API: answers as the real one does (docs/control-api.md). It keeps
    its answers as JSON data, which the client's reading (``read_answer``) turns into the
    schema's objects, refusing what does not fit."""

    url: str
    state: str = "RUNNING"
    reachable: bool = True
    refuse: tuple[int, str] | None = None  # the answer to a savepoint trigger
    job_info: dict[str, Any] = field(default_factory=lambda: {"job": "team.counts", "epoch": 3})
    requests: dict[str, dict[str, Any]] = field(default_factory=dict)
    handed_over: list[tuple[str, bool]] = field(default_factory=list)

    def _check(self) -> None:
        if not self.reachable:
            raise ControlUnreachable(f"cannot reach the control API at {self.url}: refused")

    def ready(self) -> Readiness:
        self._check()
        return Readiness(ready=self.state == "RUNNING", state=self.state)

    def job(self) -> JobInfo:
        self._check()
        return read_answer(JobInfo, self.job_info, self.url + "/v1/job")

    def trigger_savepoint(
        self, stop: bool = False, target: str | None = None, format_type: str | None = None
    ) -> SavepointRequest:
        self._check()
        if self.refuse is not None:
            raise ControlHTTPError(self.url + "/v1/savepoints", *self.refuse)
        if stop and any(r["stop"] for r in self.requests.values()):
            raise ControlHTTPError(
                self.url + "/v1/savepoints", 409, "a stop-with-savepoint is already in progress"
            )
        request = {
            "id": f"req{len(self.requests) + 1}",
            "status": "PENDING",
            "stop": stop,
            "target": target,
            "format_type": format_type,
        }
        self.requests[request["id"]] = request
        return read_answer(SavepointRequest, request, self.url + "/v1/savepoints")

    def savepoint(self, request_id: str) -> SavepointRequest:
        self._check()
        if request_id not in self.requests:
            raise ControlHTTPError(self.url, 404, f"no savepoint request with id {request_id!r}")
        return read_answer(SavepointRequest, self.requests[request_id], self.url)

    def savepoints(self) -> tuple[SavepointRequest, ...]:
        self._check()
        listed = {"savepoints": list(self.requests.values())}
        return read_answer(SavepointList, listed, self.url + "/v1/savepoints").savepoints

    def handover(self, restore: str, allow_non_restored_state: bool = False) -> HandoverAnswer:
        self._check()
        if self.state != "STANDBY" and not self.handed_over:
            raise ControlHTTPError(self.url, 409, "not started with --await-handover")
        if self.handed_over and self.handed_over[0] != (restore, allow_non_restored_state):
            raise ControlHTTPError(self.url, 409, "handed over to restore from elsewhere")
        self.handed_over.append((restore, allow_non_restored_state))
        self.state = "RECOVERING"
        return HandoverAnswer(restore=restore, allow_non_restored_state=allow_non_restored_state)

    # ------------------------------------------------------------------ what the job does

    def complete(
        self, request_id: str, location: str, epoch: int = 7, started_ms: int | None = None
    ) -> None:
        """The savepoint of ``request_id`` was taken; its epoch began at ``started_ms``
        (default: a second ago)."""
        write_savepoint(location, epoch)
        request = self.requests[request_id]
        request["status"], request["location"], request["epoch"] = "COMPLETED", location, epoch
        request["started_ms"] = started_ms or int(time.time() * 1000) - 1000

    def fail(self, request_id: str, error: str) -> None:
        request = self.requests[request_id]
        request["status"], request["error"] = "FAILED", error


class FakeDrivers:
    """``connect``: the fake driver at a URL; one that never answers if none listens there."""

    def __init__(self, kube: FakeKube) -> None:
        self.by_url: dict[str, FakeDriver] = {}
        self.kube = kube

    def __call__(self, url: str, *, token: str | None = None) -> FakeDriver:
        """As the real API: a client without the pipeline's token gets nowhere."""
        expected = self.kube.secrets.get("counts-control", {}).get("token")
        assert token is not None and token == expected, "the control API token is required"
        return self.by_url.get(url) or FakeDriver(url, reachable=False)

    def start(self, ip: str) -> FakeDriver:
        driver = FakeDriver(f"http://{ip}:8081")
        self.by_url[driver.url] = driver
        return driver


Event = tuple[str, str, str]


class Bed:
    """A pipeline, the fakes around it, and the operator's loop: each :meth:`step` reads the
    stored object afresh (as the kopf handlers do), observes, and reconciles once."""

    def __init__(self, tmp_path: Path, **spec: Any) -> None:
        self.root = tmp_path
        base: dict[str, Any] = {
            "image": "stator-runtime:1",
            "entrypoint": "pipelines.counts:build",
            "replicas": 2,
            "maxParallelism": 64,
            "checkpointing": {"storage": f"file://{tmp_path}/ck"},
            "savepoints": {"directory": f"file://{tmp_path}/sp"},
            # The flows as they were before pre-started drivers; tests of those turn it on.
            "driver": {"prestart": False},
        }
        base.update(spec)
        self.kube = FakeKube(
            {
                "metadata": {"name": "counts", "namespace": "team", "uid": "u-1", "generation": 1},
                "spec": base,
                "status": {},
            }
        )
        self.drivers = FakeDrivers(self.kube)
        self.events: list[Event] = []
        self._ips = 0
        self.pipeline_options: dict[str, Any] = {}  # Pipeline.build's, as the handlers pass

    # ------------------------------------------------------------------ the operator loop

    def _pipeline(self) -> Pipeline:
        """As the handlers build it, from the stored object read afresh."""

        def event(etype: str, reason: str, message: str) -> None:
            self.events.append((etype, reason, message))

        return Pipeline.build(
            self.kube,
            copy.deepcopy(self.kube.pipeline),
            event,
            self.drivers,
            allow_file_storage=True,
            **self.pipeline_options,
        )

    def step(self) -> float:
        return self._pipeline().reconcile()

    def delete_step(self) -> float | None:
        return self._pipeline().delete()

    def until(self, done: Callable[[], bool], steps: int = 30) -> None:
        for _ in range(steps):
            if done():
                return
            self.step()
        raise AssertionError(f"not reached in {steps} steps; status: {self.status}")

    # ------------------------------------------------------------------ reading and editing

    @property
    def status(self) -> dict[str, Any]:
        return dict(self.kube.pipeline.get("status") or {})

    @property
    def op(self) -> Operation | None:
        raw = self.status.get("operation")
        return Operation.from_json(raw) if raw else None

    def edit_spec(self, **fields: Any) -> None:
        self.kube.pipeline["spec"] = {**self.kube.pipeline["spec"], **fields}

    def edit_operation(self, **fields: Any) -> None:
        """Change the stored operation (e.g. to date a step back)."""
        self.kube.pipeline["status"]["operation"].update(fields)

    def reasons(self) -> list[str]:
        return [reason for _, reason, _ in self.events]

    def driver_pod(self) -> str:
        """The name of the newest driver pod."""
        return list(self.kube.pods)[-1]

    def start_driver(self, pod: str | None = None) -> FakeDriver:
        """The kubelet runs the pod and the job in it reports RUNNING."""
        pod = pod or self.driver_pod()
        self._ips += 1
        ip = f"10.0.0.{self._ips}"
        self.kube.set_phase(pod, "Running", ip)
        return self.drivers.start(ip)

    def finish(self) -> FakeDriver:
        """Run the flow in flight until it created its driver, start that, and run the flow
        to its end."""
        self.until(lambda: self.op is not None and self.op.step is Step.AWAIT_READY)
        assert self.op is not None
        driver = self.start_driver(f"counts-driver-{self.op.id}")
        self.until(lambda: not self.op)
        return driver

    def deploy(self) -> FakeDriver:
        """The first deployment, up to a running driver."""
        driver = self.finish()
        assert self.status["phase"] == "Running"
        return driver
