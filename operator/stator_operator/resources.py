"""The objects the operator creates for a StatefulPipeline, all owned by it: a service account
that may manage pods only in its namespace, the job's config, a Service for the driver's
control API, and the driver pod. No spec field reaches a shell: commands are argument lists."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Any

import yaml

from .job_config import job_config
from .naming import (
    CONFIG_MOUNT,
    CONTROL_MOUNT,
    CONTROL_PORT,
    CONTROL_TOKEN_KEY,
    CREDENTIALS_ANNOTATION,
    EXECUTOR_TEMPLATE,
    READ_MOUNT,
    RUNTIME_UID,
    SERVICE_ACCOUNT_DIR,
    STATE_MOUNT,
    STOPPED_EXIT_CODE,
    control_secret_name,
    driver_lease_name,
    driver_pod_name,
    driver_service_name,
    labels,
    read_secret_name,
    spark_app_id,
)
from .outcomes import EventReason
from .owned import reserved_env
from .pipeline_spec import PipelineSpec
from .podsecurity import OPERATOR_OWNED, TEMPLATE_METADATA, TEMPLATE_SPEC


def owner(body: dict[str, Any]) -> dict[str, Any]:
    meta = body["metadata"]
    return {
        "apiVersion": "stator.dev/v1alpha1",
        "kind": "StatefulPipeline",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def event(body: dict[str, Any], etype: str, reason: EventReason, message: str) -> dict[str, Any]:
    """A Kubernetes event on the pipeline (posted by ``Kube.post_event``)."""
    meta = body["metadata"]
    now = datetime.now(UTC)
    ref = {k: v for k, v in owner(body).items() if k not in ("controller", "blockOwnerDeletion")}
    return {
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {**ref, "namespace": meta["namespace"]},
        "type": etype,
        "reason": reason,
        "message": message[:1000],
        "source": {"component": "stator-operator"},
        "reportingComponent": "stator-operator",
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


def _meta(body: dict[str, Any], name: str, component: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": body["metadata"]["namespace"],
        "labels": labels(body["metadata"]["name"], component),
        "ownerReferences": [owner(body)],
    }


def service_account(body: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(body, f"{body['metadata']['name']}-stator", "rbac"),
        "automountServiceAccountToken": True,
    }


def control_secret(body: dict[str, Any]) -> dict[str, Any]:
    """The bearer token of the driver's control API, one per pipeline (created once, kept
    across deployments; only the driver, by its mount, and the operator read it)."""
    return _token_secret(body, control_secret_name(body["metadata"]["name"]), "control")


def read_secret(body: dict[str, Any]) -> dict[str, Any]:
    """The control API's read-only token (GETs only), one per pipeline, created once: for
    scrapers and consoles, which must not be able to stop or savepoint the job."""
    return _token_secret(body, read_secret_name(body["metadata"]["name"]), "read")


def _token_secret(body: dict[str, Any], name: str, component: str) -> dict[str, Any]:
    """A Secret holding one fresh random token under ``CONTROL_TOKEN_KEY``."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": _meta(body, name, component),
        "stringData": {CONTROL_TOKEN_KEY: secrets.token_urlsafe(32)},
    }


def network_policy(body: dict[str, Any], operator_namespace: str | None) -> dict[str, Any]:
    """Who may reach the pipeline's pods: each other (the driver and its executors talk on
    Spark's ports), and the operator's namespace the driver's control port (all namespaces if
    the operator's own is unknown: STATOR_OPERATOR_NAMESPACE unset). Enforced where the
    cluster's network plugin implements NetworkPolicy."""
    name = body["metadata"]["name"]
    selector = {"matchLabels": {"stator.dev/pipeline": name}}
    operator_peer: dict[str, Any] = {"namespaceSelector": {}}
    if operator_namespace:
        operator_peer = {
            "namespaceSelector": {
                "matchLabels": {"kubernetes.io/metadata.name": operator_namespace}
            }
        }
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(body, f"{name}-stator", "network"),
        "spec": {
            "podSelector": selector,
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": selector}]},
                {
                    "from": [operator_peer],
                    "ports": [{"protocol": "TCP", "port": CONTROL_PORT}],
                },
            ],
        },
    }


def driver_lease(body: dict[str, Any]) -> dict[str, Any]:
    """Created by the operator, held by nobody: the driver may only take and renew it."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": _meta(body, driver_lease_name(body["metadata"]["name"]), "driver"),
        "spec": {},
    }


def role(body: dict[str, Any], executors: bool) -> dict[str, Any]:
    """The driver's own Lease, by name: take and renew it, nothing else. With ``executors``
    (pods), what Spark's Kubernetes backend needs for them, in this namespace only: watch
    its executor pods, relabel and remove them, create their configuration (a ConfigMap) and
    the StatefulSet that runs them, and remove that set when it stops (the StatefulSet
    controller creates the pods and claims, so the driver never creates a pod). No
    ``deletecollection``, no update, no scale: what a stopping Spark would remove by label
    goes with the driver pod that owns it. Creation cannot be limited by name in RBAC;
    the chart's admission policies (templates/driver-policy.yaml) pin every one of these
    writes to this pipeline's executors and the shape Spark gives them. A driver that runs
    Spark in its own pod gets no rule on pods at all: the user code it runs could otherwise
    start any pod."""
    lease = {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "resourceNames": [driver_lease_name(body["metadata"]["name"])],
        "verbs": ["get", "update", "patch"],
    }
    meta = _meta(body, f"{body['metadata']['name']}-stator", "rbac")
    if not executors:
        return {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta,
            "rules": [lease],
        }
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": meta,
        "rules": [
            {
                # patch: a StatefulSet's executor pod is labelled with the id its executor
                # got when it registered; delete: a failed executor's pod.
                "apiGroups": [""],
                "resources": ["pods"],
                "verbs": ["get", "list", "watch", "patch", "delete"],
            },
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
            {"apiGroups": ["apps"], "resources": ["statefulsets"], "verbs": ["create", "delete"]},
            lease,
        ],
    }


def role_binding(body: dict[str, Any]) -> dict[str, Any]:
    name = f"{body['metadata']['name']}-stator"
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta(body, name, "rbac"),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [
            {"kind": "ServiceAccount", "name": name, "namespace": body["metadata"]["namespace"]}
        ],
    }


def executor_pod_template(name: str, app_id: str) -> dict[str, Any]:
    """The executor pods' template (spark.kubernetes.executor.podTemplateFile): non-root,
    no privilege escalation, all capabilities dropped; the executors of set ``app_id`` spread
    evenly over the nodes (at most one more on any node than on another schedulable one), so
    that one lost node takes as few key-group ranges as possible with it. (Per set: a
    rescale's new set starts while the old one runs, and outlives it.)"""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "spec": {
            "topologySpreadConstraints": [
                {
                    "maxSkew": 1,
                    "topologyKey": "kubernetes.io/hostname",
                    "whenUnsatisfiable": "DoNotSchedule",
                    # A lost (tainted) or excluded node is not a domain to balance against.
                    "nodeTaintsPolicy": "Honor",
                    "nodeAffinityPolicy": "Honor",
                    "labelSelector": {
                        "matchLabels": {**labels(name, "executor"), "spark-app-selector": app_id}
                    },
                }
            ],
            # Executors never call the API server (the chart's admission policy requires it).
            "automountServiceAccountToken": False,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": RUNTIME_UID,
                "fsGroup": RUNTIME_UID,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "executor",
                    # The node, for the placement the status shows (a task reports it).
                    "env": [
                        {
                            "name": "STATOR_NODE_NAME",
                            "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
                        }
                    ],
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }


def config_map(
    body: dict[str, Any], spec: PipelineSpec, app_id: str | None = None
) -> dict[str, Any]:
    """The job's configuration for the next driver of ``spec`` (``app_id``: its executor
    set; default the pipeline's first). Drivers read it when they start."""
    meta = body["metadata"]
    app_id = app_id or spark_app_id(meta["namespace"], meta["name"])
    cfg = job_config(spec, meta["name"], meta["namespace"], app_id, owner=meta.get("uid", ""))
    template = executor_pod_template(meta["name"], app_id)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            **_meta(body, f"{meta['name']}-config", "config"),
            "annotations": config_annotations(spec),
        },
        "data": {
            "job.yaml": yaml.safe_dump(cfg, sort_keys=True),
            EXECUTOR_TEMPLATE: yaml.safe_dump(template, sort_keys=True),
        },
    }


def config_annotations(spec: PipelineSpec) -> dict[str, str]:
    """What the chart's admission policy reads from the pipeline's ConfigMap: the one Secret
    its executors may take credentials from (none: they may take none)."""
    secret = spec.checkpointing.credentials_secret
    return {CREDENTIALS_ANNOTATION: secret} if secret else {}


def service(body: dict[str, Any]) -> dict[str, Any]:
    name = body["metadata"]["name"]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(body, driver_service_name(name), "driver"),
        "spec": {
            "selector": labels(name, "driver"),
            "clusterIP": "None",
            "ports": [{"name": "control", "port": CONTROL_PORT}],
        },
    }


def driver_probes() -> dict[str, Any]:
    """The driver answers ``/healthz`` once its control API serves: after it holds the job's
    lease (a replacement waits for its predecessor's to lapse) and its preflight, and then
    through a Spark start that takes tens of seconds on a loaded node. Found on real
    kubelets: a liveness probe from 60 s, with the default 1 s timeout, killed drivers that
    were still starting. A startup probe allows 5 minutes to start; liveness takes over
    after it, each probe with 5 s to answer and three misses before a restart. Readiness is
    ``/readyz``: processing and checkpointing (docs/control-api.md). A driver that is not
    ready (restarting after a failure, checkpoints unhealthy) keeps running: it fails over by
    itself, and the operator restarts one whose checkpoints stay unhealthy (reconciler)."""
    health = {"httpGet": {"path": "/healthz", "port": CONTROL_PORT}, "timeoutSeconds": 5}
    return {
        "startupProbe": {**health, "periodSeconds": 2, "failureThreshold": 150},
        "livenessProbe": {**health, "periodSeconds": 10, "failureThreshold": 3},
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": CONTROL_PORT},
            "periodSeconds": 5,
            "timeoutSeconds": 5,
        },
    }


def driver_pod(
    body: dict[str, Any],
    spec: PipelineSpec,
    deployment: str,
    restore: str | None,
    allow_non_restored: bool,
    avoid_node: str | None = None,
    lineage: str | None = None,
    start_executors: bool = False,
) -> dict[str, Any]:
    """The driver pod of one deployment, restoring from ``restore``; None: a pre-started
    driver, told what to restore from later (``POST /v1/handover``, flows.py step 4), which
    with ``start_executors`` starts its executor pods before the hand-over (they are a set of
    their own, not the running driver's).
    ``avoid_node``: the node a lost driver was on; any other is preferred. ``lineage``: the
    run the driver starts or continues (``restore.lineage``: its checkpoints record it, and a
    restarted driver resumes them instead of its starting point)."""
    meta = body["metadata"]
    name = meta["name"]
    env: list[dict[str, Any]] = [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "HOME", "value": f"{STATE_MOUNT}/home"},
    ]
    # What stator.ha.fencing (the driver's Lease) and stator.cluster.kubernetes read.
    env += [
        {"name": "STATOR_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {
            "name": "STATOR_POD_NAMESPACE",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
        },
        {"name": "STATOR_SERVICE_ACCOUNT_DIR", "value": SERVICE_ACCOUNT_DIR},
    ]
    if spec.executor is not None:
        env += [
            {"name": "STATOR_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {
                "name": "STATOR_EXECUTOR_POD_TEMPLATE",
                "value": f"{CONFIG_MOUNT}/{EXECUTOR_TEMPLATE}",
            },
        ]
    secret = spec.checkpointing.credentials_secret
    if secret:
        env += [
            {"name": k, "valueFrom": {"secretKeyRef": {"name": secret, "key": k}}}
            for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
        ]
    # Refused by check_pods; kept out here too for a spec accepted before that check.
    env += [e for e in spec.driver.env if reserved_env("driver", str(e.get("name"))) is None]
    # No "command": the image's entrypoint (tini -> entrypoint.sh) stays PID 1, reaps Spark's
    # children and passes these arguments through.
    args = [
        "stator",
        "run",
        spec.entrypoint,
        "--config",
        f"{CONFIG_MOUNT}/job.yaml",
        *(["--await-handover"] if restore is None else ["--restore", restore]),
        *(["--start-executors"] if restore is None and start_executors else []),
        "--set",
        "control.host=$(POD_IP)",
        "--set",
        f"control.token_file={CONTROL_MOUNT}/{CONTROL_TOKEN_KEY}",
        "--set",
        f"control.read_token_file={READ_MOUNT}/{CONTROL_TOKEN_KEY}",
        "--set",
        f"control.stopped_exit_code={STOPPED_EXIT_CODE}",
    ]
    if restore == "none":
        args += ["--set", "restore.force_empty=true"]
    if lineage:  # quoted: an id of digits alone would be read as a number (YAML)
        args += ["--set", f"restore.lineage='{lineage}'"]
    if allow_non_restored:
        args += ["--set", "restore.allow_non_restored_state=true"]
    resources = spec.driver.resources or {"requests": {"cpu": "500m", "memory": "1Gi"}}
    pod_labels = {**labels(name, "driver"), "stator.dev/deployment": deployment}
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            **_meta(body, driver_pod_name(name, deployment), "driver"),
            "labels": pod_labels,
        },
        "spec": {
            "serviceAccountName": f"{name}-stator",
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 30,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": RUNTIME_UID,
                "fsGroup": RUNTIME_UID,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "driver",
                    "image": spec.image,
                    "imagePullPolicy": spec.image_pull_policy,
                    "args": args,
                    "env": env,
                    "ports": [{"name": "control", "containerPort": CONTROL_PORT}],
                    **driver_probes(),
                    "resources": resources,
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "volumeMounts": [
                        {"name": "config", "mountPath": CONFIG_MOUNT},
                        {"name": "control", "mountPath": CONTROL_MOUNT, "readOnly": True},
                        {"name": "read", "mountPath": READ_MOUNT, "readOnly": True},
                        {"name": "state", "mountPath": STATE_MOUNT},
                        {"name": "tmp", "mountPath": "/tmp"},  # noqa: S108 - an emptyDir,
                    ],
                }
            ],
            "volumes": driver_volumes(name),
        },
    }
    if avoid_node:
        term = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": [avoid_node]}
        pod["spec"]["affinity"] = {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 100, "preference": {"matchExpressions": [term]}}
                ]
            }
        }
    template = spec.driver.pod_template
    if template:
        _merge(pod, template)
    return pod


def driver_volumes(name: str) -> list[dict[str, Any]]:
    """The driver pod's own volumes; a pod template's are added after them."""
    return [
        {"name": "config", "configMap": {"name": f"{name}-config"}},
        {
            "name": "control",
            "secret": {"secretName": control_secret_name(name), "defaultMode": 0o440},
        },
        {
            "name": "read",
            "secret": {"secretName": read_secret_name(name), "defaultMode": 0o440},
        },
        {"name": "state", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {}},
    ]


def _merge(base: dict[str, Any], overlay: dict[str, Any]) -> None:
    """Strategic enough merge of a pod template into the pod: only what a template may set
    (``podsecurity.TEMPLATE_METADATA``/``TEMPLATE_SPEC``, checked and refused by check_pods)
    is copied, so a spec accepted before a check was added still cannot set anything else;
    dicts merge, volumes are added, other values replace."""
    for section, allowed in (("metadata", TEMPLATE_METADATA), ("spec", TEMPLATE_SPEC)):
        fields = overlay.get(section)
        if not isinstance(fields, dict):
            continue
        target = base.setdefault(section, {})
        for key, value in fields.items():
            if key not in allowed or (section, key) in OPERATOR_OWNED:
                continue
            if (section, key) == ("spec", "volumes"):
                target[key] = [*target.get(key, []), *value]
            elif isinstance(value, dict) and isinstance(target.get(key), dict):
                _merge_dicts(target[key], value)
            else:
                target[key] = value


def _merge_dicts(base: dict[str, Any], overlay: dict[str, Any]) -> None:
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge_dicts(base[key], value)
        else:
            base[key] = value
