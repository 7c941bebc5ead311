"""The objects the operator creates for a StatefulPipeline, all owned by it: a service account
that may manage pods only in its namespace, the job's config, a Service for the driver's
control API, and the driver pod. No spec field reaches a shell: commands are argument lists."""

from __future__ import annotations

import hashlib
import secrets
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from typing import Any

import yaml

from stator.config import JobConfig, RestartConfig, build
from stator.errors import ConfigError

from .podsecurity import OPERATOR_OWNED, pod_violations, template_violations
from .spec import (
    CONTROL_PORT,
    Pinning,
    SpecError,
    executor_instances,
    get,
    pinning,
    savepoint_dir,
)

RUNTIME_UID = 185
STATE_MOUNT = "/var/lib/stator"
CONFIG_MOUNT = "/etc/stator"
EXECUTOR_TEMPLATE = "executor-pod.yaml"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
CONTROL_MOUNT = "/etc/stator-control"
STOPPED_EXIT_CODE = 3  # the driver stopped with a savepoint (not: finished its input)
JOB_FAILED_EXIT_CODE = 2  # `stator run`: refused, or ended by a failure no restart fixes
CONTROL_TOKEN_KEY = "token"  # noqa: S105 - the key in the Secret, not a secret
STATE_VOLUME = "stator-state"  # an executor's state volume (its claim, with a local volume)
# Executors are lost once they miss heartbeats for this long (Spark's default is 120 s,
# checked every 60 s), and a shuffle fetch from a vanished node gives up after 10 s without
# an answer (default 120 s): the job runs again well within a minute of losing a node.
# A deleted executor pod, or one whose container stopped or restarted in place, is noticed at
# once by the driver's own watch (stator.jvm.LostPodWatcher): Spark's watch reports a
# force-deleted pod as still running, and a restarted container keeps its pod Running. Should
# that watch not start, the pod list Spark's backend takes every ``apiPollingInterval``
# (default 30 s) notices it, later: the old executor is missing from it (every 2 s here).
# A block fetch (a broadcast piece, shuffle output) that finds its executor gone waits
# ``retryWait`` (default 5 s) before the retry that learns from the driver that it is dead
# and goes elsewhere: measured, a task retried on the surviving executor spent 7.8 s reading
# the epoch's broadcast this way. 1 s waits with twice the retries still ride out a 6 s blip.
FAILURE_DETECTION = {
    "spark.kubernetes.executor.apiPollingInterval": "2s",
    "spark.executor.heartbeatInterval": "3s",
    "spark.storage.blockManagerHeartbeatTimeoutMs": "15000",
    "spark.network.timeoutInterval": "3s",
    "spark.shuffle.io.connectionTimeout": "10s",
    "spark.shuffle.io.retryWait": "1s",
    "spark.shuffle.io.maxRetries": "6",
}
# What the operator sets for executor pods that spec.sparkConf may change: timings, not how the
# pods are made (those keys are refused, SPARK_CONF_OWNED).
EXECUTOR_DEFAULTS = {
    **FAILURE_DETECTION,
    # Every executor before the first epoch, so keyed tasks spread over all of them.
    "spark.scheduler.minRegisteredResourcesRatio": "1.0",
    "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
}


def spark_app_id(namespace: str, name: str) -> str:
    """The pipeline's Spark application id: its first executor set's, and the prefix of every
    later one's (``new_executor_set``). A driver that takes over a set (a restart, an
    upgrade at the same parallelism, a resume) runs under its id: Spark's StatefulSet of
    executors (``spark-s-<id>-0``) and its claims keep their names across drivers, so the new
    driver's executors come back to the same volumes and nodes."""
    digest = hashlib.sha256(f"{namespace}/{name}".encode()).hexdigest()[:10]
    return f"stator-{digest}"


def new_executor_set(namespace: str, name: str, deployment: str) -> str:
    """The application id of a set of executors of its own for one deployment (a rescale's
    new driver: it starts its executors before the old driver stops, as none of their local
    state would be of use to it)."""
    return f"{spark_app_id(namespace, name)}-{deployment}"


def is_executor_set_of(app_id: str, base: str) -> bool:
    """Whether ``app_id`` is one of the executor sets of the pipeline whose first set is
    ``base`` (``spark_app_id``)."""
    return app_id == base or app_id.startswith(f"{base}-")


def running_executor_set(status: dict[str, Any], namespace: str, name: str) -> str:
    """The executor set the running deployment runs (``status.deployment.executorSet``), or
    the pipeline's first (a deployment recorded before executor sets)."""
    recorded = (status.get("deployment") or {}).get("executorSet")
    return str(recorded) if recorded else spark_app_id(namespace, name)


def executor_set(app_id: str) -> str:
    """The StatefulSet Spark creates for the executors (resource profile 0)."""
    return f"spark-s-{app_id}-0"


def executor_claim(app_id: str, ordinal: int) -> str:
    """The state claim of executor ordinal ``ordinal`` (the StatefulSet's naming)."""
    return f"{STATE_VOLUME}-{executor_set(app_id)}-{ordinal}"


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


def event(body: dict[str, Any], etype: str, reason: str, message: str) -> dict[str, Any]:
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


def driver_lease_name(pipeline: str) -> str:
    """The Lease a pipeline's driver holds while it writes (``stator.cluster.fencing``)."""
    return f"{pipeline}-driver"


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
    its executor pods, relabel and remove them, write their configuration (a ConfigMap), and
    create and scale the StatefulSet that runs them (the StatefulSet controller creates the
    pods and claims, so the driver never creates a pod). A driver that runs Spark in its own
    pod gets no rule on pods at all: the user code it runs could otherwise start any pod."""
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
                # got when it registered; deletecollection: Spark removes its executors by
                # their application's label.
                "apiGroups": [""],
                "resources": ["pods"],
                "verbs": ["get", "list", "watch", "patch", "delete", "deletecollection"],
            },
            {
                "apiGroups": [""],
                "resources": ["configmaps"],
                "verbs": ["get", "list", "watch", "create", "delete", "deletecollection"],
            },
            {
                "apiGroups": ["apps"],
                "resources": ["statefulsets"],
                "verbs": ["get", "list", "watch", "create", "delete", "patch", "update"],
            },
            {
                "apiGroups": ["apps"],
                "resources": ["statefulsets/scale"],
                "verbs": ["get", "patch", "update"],
            },
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


# spec.checkpointing field -> checkpoint config key, and the factor between their units.
UPLOAD_FIELDS = (
    ("asyncUpload", "async_upload", 1),
    ("maxConcurrent", "max_concurrent", 1),
    ("timeoutSeconds", "timeout_ms", 1000),
)


def job_config(
    spec: dict[str, Any], name: str, namespace: str, app_id: str | None = None
) -> dict[str, Any]:
    """The Stator job configuration (stator config keys) for this spec. Only what the spec
    sets: the defaults are the runtime's (``JobConfig``), in one place. spec.config goes
    last, so every key written before it is refused there (``spec.OPERATOR_CONFIG``).
    ``app_id``: the executor set the driver runs (default: the pipeline's first)."""
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
        "restart": _restart(spec),
        "failover": {"strategy": get(spec, "failover", "strategy", default="region")},
        "spark": _spark(spec, name, namespace, app_id),
        "savepoint": {"dir": savepoint_dir(spec)},
        "lease": {"name": driver_lease_name(name)},
    }
    for field, key, scale in UPLOAD_FIELDS:
        if field in ck:
            cfg["checkpoint"][key] = ck[field] if scale == 1 else ck[field] * scale
    if get(spec, "savepoints", "formatType"):
        cfg["savepoint"]["format_type"] = get(spec, "savepoints", "formatType")
    local = {"enabled": False} if get(spec, "localRecovery", "enabled") is False else {}
    if get(spec, "localRecovery", "standby"):
        local["standby"] = True
    if local:
        cfg["local_recovery"] = local
    if "replicas" in spec:
        cfg["parallelism"] = int(spec["replicas"])
    if "maxParallelism" in spec:
        cfg["max_parallelism"] = int(spec["maxParallelism"])
    if ck.get("endpoint"):
        cfg["s3"] = {"endpoint_url": ck["endpoint"]}
    for key, value in (spec.get("config") or {}).items():  # dotted keys, YAML values
        node = cfg
        parts = key.replace("-", "_").split(".")  # as the runtime reads it (spark.conf refused)
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = yaml.safe_load(value)
    return cfg


def _spark(spec: dict[str, Any], name: str, namespace: str, app_id: str | None) -> dict[str, Any]:
    """Spark in the driver pod (``local[*]``), or executors as pods when ``spec.executor`` is
    set: the settings known here; what only the running pod knows (API server, pod name
    and IP, token) the driver derives itself (``stator.cluster.kubernetes``).

    Executors run in a StatefulSet (Spark's ``statefulset`` allocator) under the application
    id of their executor set (``app_id``), which the drivers that take the set over keep: a
    killed executor restarts in its pod, on its node, with its volume, and a new driver's
    executors get the same pods and claims back. Their state lives on ``/var/lib/stator``: a
    claim on a local volume (``localRecovery.volume``), or the pod's emptyDir."""
    conf = dict(spec.get("sparkConf") or {})  # no key the operator or driver sets (checked)
    executor = spec.get("executor")
    if executor is None:
        return {"master": "local[*]", "conf": conf}
    app_id = app_id or spark_app_id(namespace, name)
    pods: dict[str, str] = {
        "spark.app.id": app_id,
        "spark.kubernetes.allocation.pods.allocator": "statefulset",
        "spark.executor.instances": str(executor_instances(spec)),
        "spark.executor.cores": str(int(executor.get("cores", 1))),
        "spark.executor.memory": str(executor.get("memory", "1g")),
        "spark.kubernetes.container.image": spec["image"],
        "spark.kubernetes.container.image.pullPolicy": spec.get("imagePullPolicy", "IfNotPresent"),
        "spark.executorEnv.STATOR_STATE_DIR": f"{STATE_MOUNT}/state",
        # The claims outlive every driver (the operator deletes them): a stopping driver
        # must not delete them by the application's label (Spark's default since 3.4), nor
        # look for a driver service it never had in client mode.
        "spark.kubernetes.driver.ownPersistentVolumeClaim": "false",
        "spark.kubernetes.driver.reusePersistentVolumeClaim": "false",
        "spark.kubernetes.driver.service.deleteOnTermination": "false",
    }
    volume = f"spark.kubernetes.executor.volumes.%s.{STATE_VOLUME}"
    claim = get(spec, "localRecovery", "volume")
    if pinning(spec) is not Pinning.OFF and claim:
        pvc = volume % "persistentVolumeClaim"
        pods[f"{pvc}.options.claimName"] = "OnDemand"  # a volumeClaimTemplate of the set
        pods[f"{pvc}.options.storageClass"] = str(claim["storageClassName"])
        pods[f"{pvc}.options.sizeLimit"] = str(claim["size"])
        pods[f"{pvc}.mount.path"] = STATE_MOUNT
        # ReadWriteOnce (Spark 4 asks for ReadWriteOncePod, which local volumes, as the
        # local static provisioner and most local provisioners create them, do not offer).
        pods["spark.kubernetes.legacy.useReadWriteOnceAccessMode"] = "true"
    else:
        pods[f"{volume % 'emptyDir'}.mount.path"] = STATE_MOUNT
    for key, value in labels(name, "executor").items():
        pods[f"spark.kubernetes.executor.label.{key}"] = value
    secret = get(spec, "checkpointing", "credentialsSecret")
    if secret:  # executors read and write checkpoints and sink output too
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            pods[f"spark.kubernetes.executor.secretKeyRef.{key}"] = f"{secret}:{key}"
    # Reserved names are refused by check_pods; kept out here too for a spec accepted before.
    for item in executor.get("env") or []:
        if reserved_env("executor", item["name"]) is None:
            pods[f"spark.executorEnv.{item['name']}"] = str(item["value"])
    return {"master": "kubernetes", "conf": {**EXECUTOR_DEFAULTS, **conf, **pods}}


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


_CREDENTIALS = (
    "the operator (credentials come from the Secret named in "
    "spec.checkpointing.credentialsSecret: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)"
)
_SPARK_ENV = "Spark's Kubernetes backend, on every executor it starts"
# Environment variables of each pod kind (``spec.<kind>.env``) that the operator, or Spark for
# executors, sets: who sets them, and why. A name may be a pattern (``*``).
RESERVED_ENV: dict[str, dict[str, str]] = {
    "driver": {
        "POD_IP": "the operator (the control API listens on the pod's IP)",
        "HOME": "the operator (the runtime's home is on the state volume)",
        "STATOR_POD_NAME": "the operator (the driver finds its own pod by it)",
        "STATOR_POD_NAMESPACE": "the operator (the driver finds its pod and Lease by it)",
        "STATOR_POD_IP": "the operator (executors reach the driver at it)",
        "STATOR_SERVICE_ACCOUNT_DIR": "the operator (the driver reads its API token there)",
        "STATOR_EXECUTOR_POD_TEMPLATE": (
            "the operator (executor pods are made from the operator's template)"
        ),
        "AWS_ACCESS_KEY_ID": _CREDENTIALS,
        "AWS_SECRET_ACCESS_KEY": _CREDENTIALS,
    },
    "executor": {
        "STATOR_STATE_DIR": "the operator (executors keep their state on the state volume)",
        "STATOR_NODE_NAME": "the operator (tasks report their node for status.placement)",
        "AWS_ACCESS_KEY_ID": _CREDENTIALS,
        "AWS_SECRET_ACCESS_KEY": _CREDENTIALS,
        **dict.fromkeys(
            (
                "SPARK_DRIVER_URL",
                "SPARK_EXECUTOR_ID",
                "SPARK_EXECUTOR_CORES",
                "SPARK_EXECUTOR_MEMORY",
                "SPARK_APPLICATION_ID",
                "SPARK_RESOURCE_PROFILE_ID",
                "SPARK_EXECUTOR_POD_IP",
                "SPARK_EXECUTOR_POD_NAME",
                "SPARK_CONF_DIR",
                "SPARK_USER",
                "_SPARK_AUTH_SECRET",
            ),
            _SPARK_ENV,
        ),
        "SPARK_JAVA_OPT_*": f"{_SPARK_ENV} (use spark.executor.extraJavaOptions)",
        "SPARK_CLASSPATH": f"{_SPARK_ENV} (use spark.executor.extraClassPath)",
        "SPARK_LOCAL_DIRS": f"{_SPARK_ENV} (use spark.local.dir)",
    },
}


def _owned(table: dict[str, str], key: str) -> str | None:
    """What ``table`` says of ``key``: its entry, or that of the first pattern it matches."""
    return next((why for owned, why in table.items() if fnmatchcase(key, owned)), None)


def reserved_env(kind: str, name: str) -> str | None:
    """Who sets environment variable ``name`` of ``kind`` pods, if it is not the spec's."""
    return _owned(RESERVED_ENV[kind], name)


def env_violations(spec: dict[str, Any]) -> list[str]:
    """``spec.driver.env`` and ``spec.executor.env`` entries set by the operator or by Spark:
    theirs would override or be overridden, silently; and executor variables that look like
    credentials (their value would be stored in the pipeline's ConfigMap)."""
    out = [
        f"spec.{kind}.env[{e['name']}]: set by {why}; remove it"
        for kind in RESERVED_ENV
        for e in get(spec, kind, "env", default=None) or []
        if (why := reserved_env(kind, str(e.get("name")))) is not None
    ]
    out += [
        f"spec.executor.env[{e['name']}]: looks like a credential, and executor variables are "
        f"stored in the pipeline's ConfigMap; put it in a Secret and give it with "
        f"spec.sparkConf spark.kubernetes.executor.secretKeyRef.{e['name']}=<secret>:<key>"
        for e in get(spec, "executor", "env", default=None) or []
        if _plain_credential(str(e.get("name")).replace("_", "."))
    ]
    return out


def volume_violations(template: dict[str, Any], where: str) -> list[str]:
    """Volumes of a pod template named like one of the driver's own: they are added to the
    driver's volumes, and a name may be used once."""
    owned = [v["name"] for v in driver_volumes("-")]
    return [
        f"{where}.spec.volumes[{v.get('name')}]: the name is one of the operator's volumes "
        f"({', '.join(owned)}); rename it"
        for v in get(template, "spec", "volumes", default=None) or []
        if v.get("name") in owned
    ]


def check_pods(spec: dict[str, Any], name: str, namespace: str) -> None:
    """The pods this spec gives: what the spec may not set (operator-owned template fields,
    volume names, driver and executor environment variables), then the driver pod, user
    template merged, against the restricted Pod Security Standard (podsecurity.py); every
    problem named with its field."""
    where = "spec.driver.podTemplate"
    template = get(spec, "driver", "podTemplate", default=None) or {}
    problems = template_violations(template, where) + volume_violations(template, where)
    problems += env_violations(spec)
    body = {"metadata": {"name": name, "namespace": namespace, "uid": "-"}}
    problems += pod_violations(driver_pod(body, spec, "check", "none", False), where)
    _refuse(problems)


def _refuse(problems: list[str]) -> None:
    """One error naming the first three problems (and how many more)."""
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise SpecError("; ".join(problems[:3]) + more)


# spec.failover field -> (restart.* key, factor to the runtime's unit)
_RESTART_FIELDS = {
    "restartDelaySeconds": ("delay_ms", 1000),
    "maxRestartDelaySeconds": ("max_delay_ms", 1000),
    "backoffMultiplier": ("multiplier", 1),
    "backoffJitter": ("jitter", 1),
    "resetAfterSeconds": ("reset_after_ms", 1000),
    "failureRateIntervalSeconds": ("interval_ms", 1000),
}


def _restart(spec: dict[str, Any]) -> dict[str, Any]:
    """spec.failover as the runtime's restart.* keys; what the spec leaves out keeps the
    runtime's defaults (config.RestartConfig)."""
    failover = spec.get("failover") or {}
    out: dict[str, Any] = {
        "strategy": failover.get("restartStrategy", "exponential-backoff"),
        "attempts": int(failover.get("maxRestarts", 10)),
    }
    for field_name, (key, factor) in _RESTART_FIELDS.items():
        if field_name in failover:
            value = failover[field_name] * factor
            # round, not int: 1.005 s is 1004.999... ms in floating point
            out[key] = round(value) if key.endswith("_ms") else float(value)
    return out


def restart_config(spec: dict[str, Any], name: str, namespace: str) -> RestartConfig:
    """The job's restart strategy: the driver restarts failed epochs by it, and the operator
    restarts a failed driver pod by it (one set of spec fields, one set of rules)."""
    config: JobConfig = build(JobConfig, job_config(spec, name, namespace), "")
    return config.restart


_DRIVER = "the driver, from its pod"
_STATE_CLAIMS = "the operator (state claims outlive drivers; the operator deletes them)"
# Spark settings (patterns) that the operator writes for executor pods, or the driver derives
# from its pod (stator.cluster.kubernetes), or the runtime from its config: a spec.sparkConf
# value would silently win over theirs (Spark takes the job's spark.conf last).
SPARK_CONF_OWNED = {
    "spark.master": "the operator (executors as pods with spec.executor, else local[*])",
    "spark.submit.deployMode": f"{_DRIVER} (client mode)",
    "spark.app.id": "the operator (one id per pipeline: executors keep their pods and claims)",
    "spark.app.name": "the driver (the job's name, <namespace>.<name>)",
    "spark.ui.enabled": "the driver (use spec.config spark.ui)",
    "spark.driver.host": f"{_DRIVER} (its IP)",
    "spark.driver.bindAddress": f"{_DRIVER} (its IP)",
    "spark.kubernetes.namespace": f"{_DRIVER} (its namespace)",
    "spark.kubernetes.driver.pod.name": f"{_DRIVER} (it owns the executor pods)",
    "spark.kubernetes.authenticate.oauthToken*": f"{_DRIVER} (its service-account token)",
    "spark.kubernetes.authenticate.caCertFile": f"{_DRIVER} (its service-account CA)",
    "spark.kubernetes.executor.podTemplateFile": "the operator (its executor pod template)",
    "spark.kubernetes.allocation.pods.allocator": "the operator (executors in a StatefulSet)",
    "spark.executor.instances": "the operator from spec.executor.instances",
    "spark.executor.cores": "the operator from spec.executor.cores",
    "spark.executor.memory": "the operator from spec.executor.memory",
    "spark.executorEnv.*": "the operator from spec.executor.env",
    "spark.kubernetes.container.image": "the operator from spec.image",
    "spark.kubernetes.executor.container.image": "the operator from spec.image",
    "spark.kubernetes.container.image.pullPolicy": "the operator from spec.imagePullPolicy",
    **{
        f"spark.kubernetes.executor.secretKeyRef.{key}": _CREDENTIALS
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    },
    **{
        f"spark.kubernetes.executor.label.{key}": (
            "the operator (its NetworkPolicy and the executors' spread select by them)"
        )
        for key in labels("-", "executor")
    },
    f"spark.kubernetes.executor.volumes.*.{STATE_VOLUME}.*": (
        "the operator (the executors' state volume: spec.localRecovery.volume)"
    ),
    "spark.kubernetes.legacy.useReadWriteOnceAccessMode": "the operator (for local volumes)",
    "spark.kubernetes.driver.ownPersistentVolumeClaim": _STATE_CLAIMS,
    "spark.kubernetes.driver.reusePersistentVolumeClaim": _STATE_CLAIMS,
    "spark.kubernetes.driver.service.deleteOnTermination": (
        "the operator (a client-mode driver has no Spark service)"
    ),
    # How executor pods are made and whom they run as: the operator keeps them within the
    # restricted Pod Security profile and the pipeline's service account.
    "spark.kubernetes.executor.volumes.hostPath.*": (
        "no one: executors may not mount host paths (the restricted pod profile); their "
        "state volume is spec.localRecovery.volume"
    ),
    "spark.kubernetes.*.pod.featureSteps": (
        "no one: feature steps may shape pods beyond the restricted pod profile"
    ),
    "spark.kubernetes.authenticate.*": "the operator (the pipeline's service account runs both)",
    "spark.kubernetes.executor.scheduler.name": "the cluster's default scheduler",
}
# Words of a Spark setting that holds a secret in plain text (it would be stored in the
# pipeline's ConfigMap); references to Secrets (secretKeyRef, secrets) are not secrets.
_CREDENTIAL_WORDS = ("secret", "password", "token", "access.key", "accesskey", "credential")


def _plain_credential(key: str) -> bool:
    lowered = key.lower()
    if "secretkeyref" in lowered or ".secrets." in lowered:
        return False
    return any(word in lowered for word in _CREDENTIAL_WORDS)


def spark_conf_violations(spec: dict[str, Any]) -> list[str]:
    """``spec.sparkConf`` keys the operator, the driver or the runtime sets, and secrets in
    plain text."""
    out = [
        f"spec.sparkConf.{key}: set by {why}; remove it"
        for key in spec.get("sparkConf") or {}
        if (why := _owned(SPARK_CONF_OWNED, key)) is not None
    ]
    out += [
        f"spec.sparkConf.{key}: credentials are not accepted in plain text (they would be "
        f"stored in a ConfigMap); put them in a Secret and give them to executors with "
        f"spark.kubernetes.executor.secretKeyRef.<ENV_NAME>=<secret>:<key>"
        for key in spec.get("sparkConf") or {}
        if _plain_credential(key) and _owned(SPARK_CONF_OWNED, key) is None
    ]
    return out


def check_job_config(spec: dict[str, Any], name: str, namespace: str) -> None:
    """The job config this spec gives, before a driver runs with it: spec.sparkConf keys that
    are not the spec's, then the runtime's own check (a Spark setting Stator cannot run with,
    an unknown or ill-typed spec.config key), each reported with its field, not found later
    in a crash-looping pod."""
    _refuse(spark_conf_violations(spec))
    try:
        build(JobConfig, {"spark": {"conf": dict(spec.get("sparkConf") or {})}}, "")
    except ConfigError as exc:
        raise SpecError(f"spec.sparkConf: {exc}") from exc
    try:
        build(JobConfig, job_config(spec, name, namespace), "")
    except (ConfigError, yaml.YAMLError, AttributeError, TypeError) as exc:
        raise SpecError(f"spec.config: {exc}") from exc


def config_map(
    body: dict[str, Any], spec: dict[str, Any], app_id: str | None = None
) -> dict[str, Any]:
    """The job's configuration for the next driver of ``spec`` (``app_id``: its executor
    set; default the pipeline's first). Drivers read it when they start."""
    meta = body["metadata"]
    app_id = app_id or spark_app_id(meta["namespace"], meta["name"])
    cfg = job_config(spec, meta["name"], meta["namespace"], app_id)
    template = executor_pod_template(meta["name"], app_id)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(body, f"{meta['name']}-config", "config"),
        "data": {
            "job.yaml": yaml.safe_dump(cfg, sort_keys=True),
            EXECUTOR_TEMPLATE: yaml.safe_dump(template, sort_keys=True),
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


def driver_pod_name(pipeline: str, deployment: str) -> str:
    """The driver pod of one deployment (an operation's id names the driver it brings up)."""
    return f"{pipeline}-driver-{deployment}"


def driver_pod(
    body: dict[str, Any],
    spec: dict[str, Any],
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
    # What stator.cluster.fencing (the driver's Lease) and stator.cluster.kubernetes read.
    env += [
        {"name": "STATOR_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {
            "name": "STATOR_POD_NAMESPACE",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
        },
        {"name": "STATOR_SERVICE_ACCOUNT_DIR", "value": SERVICE_ACCOUNT_DIR},
    ]
    if spec.get("executor") is not None:
        env += [
            {"name": "STATOR_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
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
    # Refused by check_pods; kept out here too for a spec accepted before that check.
    env += [
        e
        for e in (get(spec, "driver", "env", default=None) or [])
        if reserved_env("driver", str(e.get("name"))) is None
    ]
    # No "command": the image's entrypoint (tini -> entrypoint.sh) stays PID 1, reaps Spark's
    # children and passes these arguments through.
    args = [
        "stator",
        "run",
        spec["entrypoint"],
        "--config",
        f"{CONFIG_MOUNT}/job.yaml",
        *(["--await-handover"] if restore is None else ["--restore", restore]),
        *(["--start-executors"] if restore is None and start_executors else []),
        "--set",
        "control.host=$(POD_IP)",
        "--set",
        f"control.token_file={CONTROL_MOUNT}/{CONTROL_TOKEN_KEY}",
        "--set",
        f"control.stopped_exit_code={STOPPED_EXIT_CODE}",
    ]
    if restore == "none":
        args += ["--set", "restore.force_empty=true"]
    if lineage:  # quoted: an id of digits alone would be read as a number (YAML)
        args += ["--set", f"restore.lineage='{lineage}'"]
    if allow_non_restored:
        args += ["--set", "restore.allow_non_restored_state=true"]
    resources = get(spec, "driver", "resources", default=None) or {
        "requests": {"cpu": "500m", "memory": "1Gi"}
    }
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
    template = get(spec, "driver", "podTemplate", default=None)
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
        {"name": "state", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {}},
    ]


def _merge(base: dict[str, Any], overlay: dict[str, Any], path: tuple[str, ...] = ()) -> None:
    """Strategic enough merge of a pod template: dicts merge, volumes are added, other values
    replace. The operator's own fields (``OPERATOR_OWNED``: containers, service account, ...)
    are refused by check_pods, and kept out here too for a spec accepted before."""
    for key, value in overlay.items():
        at = (*path, key)
        if at in OPERATOR_OWNED:
            continue
        if at == ("spec", "volumes"):
            base[key] = [*base.get(key, []), *value]
        elif isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value, at)
        else:
            base[key] = value
