"""The Kubernetes calls the operator makes (through the kubernetes client, synchronously:
status is written before a step is taken, not when a handler returns). Nothing else: storage
is reached through storage.py, drivers through their control API."""

from __future__ import annotations

import base64
import logging
import re
import time
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from stator.ha.lease import RELEASED_FOR

from .naming import is_executor_set_of
from .ports import NotOwned

GROUP, VERSION, PLURAL = "stator.dev", "v1alpha1", "statefulpipelines"
UNREACHABLE = "node.kubernetes.io/unreachable"  # the node lifecycle controller's taint
log = logging.getLogger(__name__)


# The kinds the operator creates, each at the API version it writes.
API_VERSIONS = {
    "ServiceAccount": "v1",
    "Secret": "v1",
    "Service": "v1",
    "Pod": "v1",
    "ConfigMap": "v1",
    "NetworkPolicy": "networking.k8s.io/v1",
    "Role": "rbac.authorization.k8s.io/v1",
    "RoleBinding": "rbac.authorization.k8s.io/v1",
    "Lease": "coordination.k8s.io/v1",
}


def _kind_of(obj: dict[str, Any]) -> str:
    kind = str(obj.get("kind"))
    if API_VERSIONS.get(kind) != obj.get("apiVersion"):
        raise ValueError(f"the operator does not create {obj.get('apiVersion')}/{kind} objects")
    return kind


NAMESPACE_TTL_S = 10.0


class Kube:
    def __init__(self, api_client: client.ApiClient | None = None) -> None:
        self.client = api_client or client.ApiClient()
        self.core = client.CoreV1Api(self.client)
        self.rbac = client.RbacAuthorizationV1Api(self.client)
        self.networking = client.NetworkingV1Api(self.client)
        self.apps = client.AppsV1Api(self.client)
        self.custom = client.CustomObjectsApi(self.client)
        self.coordination = client.CoordinationV1Api(self.client)
        # namespace -> (read at, labels): every pipeline's every look checks its namespace.
        self._namespaces: dict[str, tuple[float, dict[str, str]]] = {}

    def patch_status(self, namespace: str, name: str, fields: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, name, {"status": fields}
        )

    def scale_pipeline(self, namespace: str, name: str, replicas: int) -> None:
        self.custom.patch_namespaced_custom_object_scale(
            GROUP, VERSION, namespace, PLURAL, name, {"spec": {"replicas": replicas}}
        )

    def post_event(self, event: dict[str, Any]) -> None:
        """Post ``event`` (``resources.event``) now, before the step that follows it is
        written: kopf's own events wait in a queue that a killed operator loses, and the
        flow's events are its audit trail (which driver was created, from which savepoint).
        An event that cannot be posted is logged, never fails the step."""
        meta = event["metadata"]
        try:
            self.core.create_namespaced_event(meta["namespace"], event)
        except ApiException as exc:
            log.warning(
                "event %s (%s) not posted: %s", event["reason"], meta["generateName"], exc.reason
            )

    def get_pipeline(self, namespace: str, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name
        )
        return obj

    def driver_pods(
        self, namespace: str, name: str, deployment: str | None = None
    ) -> list[dict[str, Any]]:
        selector = f"stator.dev/pipeline={name},stator.dev/component=driver"
        if deployment:
            selector += f",stator.dev/deployment={deployment}"
        pods = self.core.list_namespaced_pod(namespace, label_selector=selector)
        out: list[dict[str, Any]] = [self.client.sanitize_for_serialization(p) for p in pods.items]
        return out

    def driver_pod(self, namespace: str, name: str, deployment: str) -> dict[str, Any] | None:
        pods = self.driver_pods(namespace, name, deployment)
        return pods[0] if pods else None

    def delete_drivers(self, namespace: str, name: str, keep: str | None = None) -> bool:
        """Delete every driver pod of the pipeline (of any deployment but ``keep``); whether
        any is left. A pod on an unreachable node is removed at once (no kubelet will
        confirm its end): its driver, should it still run, is fenced by its lapsed Lease."""
        pods = [
            p
            for p in self.driver_pods(namespace, name)
            if keep is None or p["metadata"].get("labels", {}).get("stator.dev/deployment") != keep
        ]
        lost = self.unreachable_nodes() if pods else set()
        for pod in pods:
            if pod.get("spec", {}).get("nodeName") in lost:
                self.delete_pod(namespace, pod["metadata"]["name"], grace_s=0)
            elif not pod["metadata"].get("deletionTimestamp"):
                self.delete_pod(namespace, pod["metadata"]["name"])
        return bool(pods)

    def delete_pod(self, namespace: str, pod: str, grace_s: int = 30) -> None:
        """Delete a pod unless it is gone (``grace_s`` 0: at once, for a pod on a lost node)."""
        _ignore_missing(
            lambda: self.core.delete_namespaced_pod(pod, namespace, grace_period_seconds=grace_s)
        )

    def unreachable_nodes(self) -> set[str]:
        """Nodes the node lifecycle controller tainted unreachable."""
        return {
            n.metadata.name
            for n in self.core.list_node().items
            if any(t.key == UNREACHABLE for t in n.spec.taints or [])
        }

    # ------------------------------------------------------------------ the driver's Lease

    def driver_lease(self, namespace: str, lease: str) -> tuple[str | None, object, int] | None:
        """(holder, renewTime, leaseDurationSeconds) of a driver's Lease; None if missing."""
        obj = self._read_lease(namespace, lease)
        if obj is None:
            return None
        spec = obj.spec
        return spec.holder_identity, spec.renew_time, int(spec.lease_duration_seconds or 0)

    def _read_lease(self, namespace: str, lease: str) -> Any:
        try:
            return self.coordination.read_namespaced_lease(lease, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def clear_driver_lease(self, namespace: str, lease: str, keep: str | None = None) -> str | None:
        """Release a driver's Lease on behalf of a holder whose pod is gone (so that the
        next driver takes it at once instead of waiting out its duration), unless ``keep``
        holds it; the holder released."""
        obj = self._read_lease(namespace, lease)
        if obj is None:
            return None
        holder = obj.spec.holder_identity
        if not holder or holder == keep:
            return None
        body = {
            "metadata": {
                "resourceVersion": obj.metadata.resource_version,
                # The next driver knows its predecessor did not release it itself.
                "annotations": {RELEASED_FOR: holder},
            },
            "spec": {"holderIdentity": None},
        }
        try:  # conditional: a holder that renewed meanwhile keeps it
            self.coordination.patch_namespaced_lease(lease, namespace, body)
        except ApiException as exc:
            if exc.status in (404, 409):
                return None
            raise
        return str(holder)

    def ensure(self, obj: dict[str, Any]) -> None:
        """Create ``obj`` unless it exists. One of the kinds the operator makes, at its API
        version (nothing from a spec chooses what is created); an existing object of that
        name that the pipeline does not own is refused (:class:`NotOwned`), never adopted."""
        kind, ns = _kind_of(obj), obj["metadata"].get("namespace")
        create = {
            "ServiceAccount": lambda: self.core.create_namespaced_service_account(ns, obj),
            "Secret": lambda: self.core.create_namespaced_secret(ns, obj),
            "NetworkPolicy": lambda: self.networking.create_namespaced_network_policy(ns, obj),
            "Service": lambda: self.core.create_namespaced_service(ns, obj),
            "Pod": lambda: self.core.create_namespaced_pod(ns, obj),
            "Role": lambda: self.rbac.create_namespaced_role(ns, obj),
            "RoleBinding": lambda: self.rbac.create_namespaced_role_binding(ns, obj),
            "Lease": lambda: self.coordination.create_namespaced_lease(ns, obj),
        }[kind]
        try:
            create()  # type: ignore[no-untyped-call]
        except ApiException as exc:
            if exc.status != 409:
                raise
            self._check_owned(obj)

    def apply(self, obj: dict[str, Any]) -> None:
        """Create ``obj``, or replace it with this version (a ConfigMap, or a Role whose
        rules a newer operator changed), only if the pipeline owns the one there."""
        kind = _kind_of(obj)
        ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        create, replace = {
            "ConfigMap": (
                self.core.create_namespaced_config_map,
                self.core.replace_namespaced_config_map,
            ),
            "Role": (self.rbac.create_namespaced_role, self.rbac.replace_namespaced_role),
        }[kind]
        try:
            create(ns, obj)
        except ApiException as exc:
            if exc.status != 409:
                raise
            self._check_owned(obj)
            replace(name, ns, obj)

    def _check_owned(self, obj: dict[str, Any]) -> None:
        """``obj`` exists: it must be owned by the owner ``obj`` names (the pipeline)."""
        meta = obj["metadata"]
        owners = {o["uid"] for o in meta.get("ownerReferences") or []}
        if not owners:
            return
        ns, name, kind = meta["namespace"], meta["name"], obj["kind"]
        read = {
            "ServiceAccount": self.core.read_namespaced_service_account,
            "Secret": self.core.read_namespaced_secret,
            "NetworkPolicy": self.networking.read_namespaced_network_policy,
            "Service": self.core.read_namespaced_service,
            "Pod": self.core.read_namespaced_pod,
            "Role": self.rbac.read_namespaced_role,
            "RoleBinding": self.rbac.read_namespaced_role_binding,
            "Lease": self.coordination.read_namespaced_lease,
            "ConfigMap": self.core.read_namespaced_config_map,
        }[kind]
        existing = read(name, ns)
        theirs = {o.uid for o in existing.metadata.owner_references or []}
        if not owners & theirs:
            raise NotOwned(
                f"{kind} {ns}/{name} already exists and is not owned by this pipeline: the "
                f"operator neither adopts nor replaces it. Delete or rename that {kind}, or "
                f"give the pipeline another name"
            )

    # ------------------------------------------------------------------ executors

    def executors_left(self, namespace: str, app_id: str) -> bool:
        """Whether the executors of Spark application ``app_id`` (its StatefulSet, or any of
        its pods) are still there. Those being deleted on an unreachable node are removed at
        once: no kubelet will confirm their end, and without their driver they do nothing."""
        sets = self.apps.list_namespaced_stateful_set(namespace).items
        ours = re.compile(rf"spark-s-{re.escape(app_id)}-\d+")  # not another set's: id-<dep>-0
        if any(ours.fullmatch(s.metadata.name) for s in sets):
            return True
        pods = self.core.list_namespaced_pod(namespace, label_selector=_executors(app_id)).items
        stuck = [p for p in pods if p.metadata.deletion_timestamp]
        lost = self.unreachable_nodes() if stuck else set()
        for pod in stuck:
            if pod.spec.node_name in lost:
                self.delete_pod(namespace, pod.metadata.name, grace_s=0)
        return bool(pods)

    def delete_claims(self, namespace: str, app_id: str, keep: int) -> list[str]:
        """Delete the executors' state claims of ordinal ``keep`` and up (all with 0)."""
        claims = self.core.list_namespaced_persistent_volume_claim(
            namespace, label_selector=_executors(app_id)
        ).items
        deleted = []
        for claim in claims:
            ordinal = claim.metadata.name.rpartition("-")[2]
            if ordinal.isdigit() and int(ordinal) >= keep and not claim.metadata.deletion_timestamp:
                _ignore_missing(
                    lambda c=claim: self.core.delete_namespaced_persistent_volume_claim(
                        c.metadata.name, namespace
                    )
                )
                deleted.append(claim.metadata.name)
        return deleted

    def executor_sets(self, namespace: str, base: str) -> list[str]:
        """The application ids (``base``, or ``base-<deployment>``) that have state claims."""
        claims = self.core.list_namespaced_persistent_volume_claim(
            namespace, label_selector="spark-role=executor"
        ).items
        ids = {(c.metadata.labels or {}).get("spark-app-selector", "") for c in claims}
        return sorted(i for i in ids if is_executor_set_of(i, base))

    def release_lost(self, namespace: str, app_id: str, claim_prefix: str) -> list[str]:
        """Executor pods on unreachable nodes (the node lifecycle controller's
        ``node.kubernetes.io/unreachable`` taint): their claims are deleted and the pods
        removed, so that the StatefulSet starts them on another node with a new volume.
        Returns the pods released."""
        pods = self.core.list_namespaced_pod(namespace, label_selector=_executors(app_id)).items
        if not pods:
            return []
        lost = self.unreachable_nodes()
        released = []
        for pod in pods:
            if pod.spec.node_name not in lost:
                continue
            claim = f"{claim_prefix}-{pod.metadata.name}"
            _ignore_missing(
                lambda c=claim: self.core.delete_namespaced_persistent_volume_claim(c, namespace)
            )
            self.delete_pod(namespace, pod.metadata.name, grace_s=0)
            released.append(pod.metadata.name)
        return released

    def namespace_labels(self, namespace: str) -> dict[str, str]:
        """Read at most every NAMESPACE_TTL_S per namespace (a relabelled namespace is seen
        within that), not on every pipeline's every one-second look."""
        read_at, labels = self._namespaces.get(namespace, (-NAMESPACE_TTL_S, {}))
        if time.monotonic() - read_at >= NAMESPACE_TTL_S:
            labels = dict(self.core.read_namespace(namespace).metadata.labels or {})
            self._namespaces[namespace] = (time.monotonic(), labels)
        return dict(labels)

    def read_secret(self, namespace: str, name: str) -> dict[str, str]:
        """A Secret's data, decoded (the S3 credentials the operator reads storage with, the
        control API token). A missing Secret is a LookupError."""
        try:
            data = self.core.read_namespaced_secret(name, namespace).data or {}
        except ApiException as exc:
            if exc.status == 404:
                raise LookupError(f"no Secret {namespace}/{name}") from exc
            raise
        return {k: base64.b64decode(v).decode() for k, v in data.items()}


def _executors(app_id: str) -> str:
    """The labels Spark gives its executor pods (and the StatefulSet gives their claims)."""
    return f"spark-app-selector={app_id},spark-role=executor"


def _ignore_missing(call: Any) -> None:
    try:
        call()
    except ApiException as exc:
        if exc.status != 404:
            raise
