"""The objects the operator creates for a StatefulPipeline, all owned by it: a service account
that may manage pods only in its namespace, the job's config, a Service for the driver's
control API, and the driver pod. No spec field reaches a shell: commands are argument lists."""

from __future__ import annotations

import secrets
from typing import Any

import yaml

from stator.config import JobConfig, build
from stator.errors import ConfigError

from .podsecurity import pod_violations, template_violations
from .spec import CONTROL_PORT, SpecError, get, savepoint_dir

RUNTIME_UID = 185
STATE_MOUNT = "/var/lib/stator"
CONFIG_MOUNT = "/etc/stator"
EXECUTOR_TEMPLATE = "executor-pod.yaml"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
CONTROL_MOUNT = "/etc/stator-control"
STOPPED_EXIT_CODE = 3  # the driver stopped with a savepoint (not: finished its input)
JOB_FAILED_EXIT_CODE = 2  # `stator run`: refused, or ended by a failure no restart fixes
CONTROL_TOKEN_KEY = "token"  # noqa: S105 - the key in the Secret, not a secret


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


def labels(name: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "stator",
        "app.kubernetes.io/managed-by": "stator-operator",
        "stator.dev/pipeline": name,
        "stator.dev/component": component,
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


def control_secret_name(name: str) -> str:
    return f"{name}-control"


def control_secret(body: dict[str, Any]) -> dict[str, Any]:
    """The bearer token of the driver's control API, one per pipeline (created once, kept
    across deployments; only the driver, by its mount, and the operator read it)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": _meta(body, control_secret_name(body["metadata"]["name"]), "control"),
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


def role(body: dict[str, Any]) -> dict[str, Any]:
    """What Spark's Kubernetes backend needs for executors, in this namespace only."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(body, f"{body['metadata']['name']}-stator", "rbac"),
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["pods"],
                "verbs": ["get", "list", "watch", "create", "delete", "deletecollection"],
            },
            {
                "apiGroups": [""],
                "resources": ["services", "configmaps", "persistentvolumeclaims"],
                "verbs": ["get", "list", "watch", "create", "delete", "deletecollection"],
            },
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


def job_config(spec: dict[str, Any], name: str, namespace: str) -> dict[str, Any]:
    """The Stator job configuration (stator config keys) for this spec. Only what the spec
    sets: the defaults are the runtime's (``JobConfig``), in one place."""
    ck = spec.get("checkpointing", {})
    cfg: dict[str, Any] = {
        "name": f"{namespace}.{name}",
        "checkpoint": {
            "storage": ck["storage"],
            "retained": int(ck.get("retained", 3)),
            "incremental": bool(ck.get("incremental", True)),
            "every_epochs": int(ck.get("intervalEpochs", 1)),
            "interval_ms": int(ck.get("intervalSeconds", 0)) * 1000,
        },
        "state": {"local_dir": f"{STATE_MOUNT}/state"},
        "control": {"port": CONTROL_PORT},
        "restart": {
            "strategy": get(spec, "failover", "restartStrategy", default="exponential-backoff"),
            "attempts": int(get(spec, "failover", "maxRestarts", default=10)),
        },
        "spark": _spark(spec, name),
        "savepoint": {"dir": savepoint_dir(spec)},
    }
    if "replicas" in spec:
        cfg["parallelism"] = int(spec["replicas"])
    if "maxParallelism" in spec:
        cfg["max_parallelism"] = int(spec["maxParallelism"])
    if ck.get("endpoint"):
        cfg["s3"] = {"endpoint_url": ck["endpoint"]}
    for key, value in (spec.get("config") or {}).items():  # dotted keys, YAML values
        node = cfg
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = yaml.safe_load(value)
    return cfg


def _spark(spec: dict[str, Any], name: str) -> dict[str, Any]:
    """Spark in the driver pod (``local[*]``), or executors as pods when ``spec.executor`` is
    set: the settings known here; what only the running pod knows (API server, pod name
    and IP, token) the driver derives itself (``stator.cluster.kubernetes``)."""
    conf = dict(spec.get("sparkConf") or {})
    executor = spec.get("executor")
    if executor is None:
        return {"master": "local[*]", "conf": conf}
    cores = int(executor.get("cores", 1))
    replicas = int(spec.get("replicas", JobConfig.parallelism))
    instances = int(executor.get("instances", -(-replicas // cores)))
    pods: dict[str, str] = {
        "spark.executor.instances": str(instances),
        "spark.executor.cores": str(cores),
        "spark.executor.memory": str(executor.get("memory", "1g")),
        "spark.kubernetes.container.image": spec["image"],
        "spark.kubernetes.container.image.pullPolicy": spec.get("imagePullPolicy", "IfNotPresent"),
        "spark.kubernetes.executor.podNamePrefix": name,  # pods NAME-exec-N
        # Every executor before the first epoch, so keyed tasks spread over all of them.
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
    }
    for key, value in labels(name, "executor").items():
        pods[f"spark.kubernetes.executor.label.{key}"] = value
    secret = get(spec, "checkpointing", "credentialsSecret")
    if secret:  # executors read and write checkpoints and sink output too
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            pods[f"spark.kubernetes.executor.secretKeyRef.{key}"] = f"{secret}:{key}"
    for item in executor.get("env") or []:
        pods[f"spark.executorEnv.{item['name']}"] = str(item["value"])
    return {"master": "kubernetes", "conf": {**pods, **conf}}


def executor_pod_template(name: str) -> dict[str, Any]:
    """The executor pods' template (spark.kubernetes.executor.podTemplateFile): non-root,
    no privilege escalation, all capabilities dropped; spread evenly over the nodes (at most
    one more on any node than on another schedulable one), so that one lost node takes as
    few key-group ranges as possible with it."""
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
                    "labelSelector": {"matchLabels": labels(name, "executor")},
                }
            ],
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": RUNTIME_UID,
                "fsGroup": RUNTIME_UID,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "executor",
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }


def check_pod_security(spec: dict[str, Any], name: str, namespace: str) -> None:
    """The driver pod this spec gives, user template merged, against the restricted Pod
    Security Standard (podsecurity.py); every violation named with its field."""
    where = "spec.driver.podTemplate"
    template = get(spec, "driver", "podTemplate", default=None) or {}
    problems = template_violations(template, where)
    body = {"metadata": {"name": name, "namespace": namespace, "uid": "-"}}
    problems += pod_violations(driver_pod(body, spec, "check", "none", False), where)
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise SpecError("; ".join(problems[:3]) + more)


def check_job_config(spec: dict[str, Any], name: str, namespace: str) -> None:
    """The runtime's own config check, before a driver runs with it: an unknown or ill-typed
    spec.config key is reported with its name, not found later in a crash-looping pod."""
    try:
        build(JobConfig, job_config(spec, name, namespace), "")
    except (ConfigError, yaml.YAMLError, AttributeError, TypeError) as exc:
        raise SpecError(f"spec.config: {exc}") from exc


def config_map(body: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    meta = body["metadata"]
    cfg = job_config(spec, meta["name"], meta["namespace"])
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(body, f"{meta['name']}-config", "config"),
        "data": {
            "job.yaml": yaml.safe_dump(cfg, sort_keys=True),
            EXECUTOR_TEMPLATE: yaml.safe_dump(executor_pod_template(meta["name"]), sort_keys=True),
        },
    }


def service(body: dict[str, Any]) -> dict[str, Any]:
    name = body["metadata"]["name"]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(body, f"{name}-driver", "driver"),
        "spec": {
            "selector": labels(name, "driver"),
            "clusterIP": "None",
            "ports": [{"name": "control", "port": CONTROL_PORT}],
        },
    }


def driver_pod(
    body: dict[str, Any],
    spec: dict[str, Any],
    deployment: str,
    restore: str,
    allow_non_restored: bool,
) -> dict[str, Any]:
    meta = body["metadata"]
    name = meta["name"]
    env: list[dict[str, Any]] = [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "HOME", "value": f"{STATE_MOUNT}/home"},
    ]
    if spec.get("executor") is not None:  # what stator.cluster.kubernetes reads
        env += [
            {"name": "STATOR_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "STATOR_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {
                "name": "STATOR_POD_NAMESPACE",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
            },
            {"name": "STATOR_SERVICE_ACCOUNT_DIR", "value": SERVICE_ACCOUNT_DIR},
            {
                "name": "STATOR_EXECUTOR_POD_TEMPLATE",
                "value": f"{CONFIG_MOUNT}/{EXECUTOR_TEMPLATE}",
            },
        ]
    secret = get(spec, "checkpointing", "credentialsSecret")
    if secret:
        env += [
            {"name": k, "valueFrom": {"secretKeyRef": {"name": secret, "key": k}}}
            for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
        ]
    reserved = {e["name"] for e in env}
    env += [
        e for e in (get(spec, "driver", "env", default=None) or []) if e.get("name") not in reserved
    ]
    # No "command": the image's entrypoint (tini -> entrypoint.sh) stays PID 1, reaps Spark's
    # children and passes these arguments through.
    args = [
        "stator",
        "run",
        spec["entrypoint"],
        "--config",
        f"{CONFIG_MOUNT}/job.yaml",
        "--restore",
        restore,
        "--set",
        "control.host=$(POD_IP)",
        "--set",
        f"control.token_file={CONTROL_MOUNT}/{CONTROL_TOKEN_KEY}",
        "--set",
        f"control.stopped_exit_code={STOPPED_EXIT_CODE}",
    ]
    if restore == "none":
        args += ["--set", "restore.force_empty=true"]
    if allow_non_restored:
        args += ["--set", "restore.allow_non_restored_state=true"]
    resources = get(spec, "driver", "resources", default=None) or {
        "requests": {"cpu": "500m", "memory": "1Gi"}
    }
    pod_labels = {**labels(name, "driver"), "stator.dev/deployment": deployment}
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**_meta(body, f"{name}-driver-{deployment}", "driver"), "labels": pod_labels},
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
                    "image": spec["image"],
                    "imagePullPolicy": spec.get("imagePullPolicy", "IfNotPresent"),
                    "args": args,
                    "env": env,
                    "ports": [{"name": "control", "containerPort": CONTROL_PORT}],
                    "readinessProbe": {
                        "httpGet": {"path": "/readyz", "port": CONTROL_PORT},
                        "periodSeconds": 5,
                    },
                    "livenessProbe": {
                        "httpGet": {"path": "/healthz", "port": CONTROL_PORT},
                        "initialDelaySeconds": 60,
                        "periodSeconds": 10,
                    },
                    "resources": resources,
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "volumeMounts": [
                        {"name": "config", "mountPath": CONFIG_MOUNT},
                        {"name": "control", "mountPath": CONTROL_MOUNT, "readOnly": True},
                        {"name": "state", "mountPath": STATE_MOUNT},
                        {"name": "tmp", "mountPath": "/tmp"},  # noqa: S108 - an emptyDir,
                    ],
                }
            ],
            "volumes": [
                {"name": "config", "configMap": {"name": f"{name}-config"}},
                {
                    "name": "control",
                    "secret": {"secretName": control_secret_name(name), "defaultMode": 0o440},
                },
                {"name": "state", "emptyDir": {}},
                {"name": "tmp", "emptyDir": {}},
            ],
        },
    }
    template = get(spec, "driver", "podTemplate", default=None)
    if template:
        _merge(pod, template)
    return pod


def _merge(base: dict[str, Any], overlay: dict[str, Any]) -> None:
    """Strategic enough merge of a pod template: dicts merge, other values replace; the
    command, args and service account stay the operator's."""
    for key, value in overlay.items():
        if key in ("command", "args", "serviceAccountName", "ownerReferences", "containers"):
            continue
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value
