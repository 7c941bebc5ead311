"""The runtime's job configuration for a spec (the ConfigMap drivers read): checkpoints,
restarts, failover and Spark, in the driver pod or with executors as pods. Only what the spec
sets; the runtime's defaults stay in one place (``stator.config``)."""

from __future__ import annotations

from typing import Any

import yaml

from stator.config import JobConfig, RestartConfig, build

from .naming import (
    STATE_MOUNT,
    STATE_VOLUME,
    driver_lease_name,
    job_name,
    labels,
    spark_app_id,
)
from .owned import reserved_env
from .spec import (
    CONTROL_PORT,
    Pinning,
    SpecError,
    executor_instances,
    get,
    pinning,
    savepoint_dir,
)

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


# spec.checkpointing field -> checkpoint config key, and the factor between their units.
UPLOAD_FIELDS = (
    ("asyncUpload", "async_upload", 1),
    ("maxConcurrent", "max_concurrent", 1),
    ("timeoutSeconds", "timeout_ms", 1000),
)


def job_config(
    spec: dict[str, Any],
    name: str,
    namespace: str,
    app_id: str | None = None,
    owner: str = "",
) -> dict[str, Any]:
    """The Stator job configuration (stator config keys) for this spec. Only what the spec
    sets: the defaults are the runtime's (``JobConfig``), in one place. spec.config goes
    last, so every key written before it is refused there (``spec.OPERATOR_CONFIG``).
    ``app_id``: the executor set the driver runs (default: the pipeline's first);
    ``owner``: the pipeline's uid, which owns its checkpoint root (``checkpoint.owner``)."""
    ck = spec.get("checkpointing", {})
    cfg: dict[str, Any] = {
        "name": job_name(namespace, name),
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
    if owner:
        cfg["checkpoint"]["owner"] = owner
    if ck.get("adopt"):
        cfg["checkpoint"]["adopt"] = True
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
        node[parts[-1]] = config_value(key, value)
    return cfg


# A spec.config value is one setting: a few characters of YAML. The cap (the CRD's maxLength
# too) and the refusal of anchors keep the shared operator's work per value small: a YAML
# alias bomb of ~300 bytes expands tenfold per level when loaded.
MAX_CONFIG_VALUE = 4096


def config_value(key: str, text: object) -> Any:
    """A spec.config value, parsed as YAML without anchors or aliases."""
    if not isinstance(text, str):
        raise SpecError(f"spec.config.{key}: must be a string (a YAML value), got {text!r:.80}")
    if len(text) > MAX_CONFIG_VALUE:
        raise SpecError(
            f"spec.config.{key}: {len(text)} characters, at most {MAX_CONFIG_VALUE} allowed"
        )
    try:
        tokens = list(yaml.scan(text, Loader=yaml.SafeLoader))
    except yaml.YAMLError as exc:
        raise SpecError(f"spec.config.{key}: not valid YAML: {str(exc)[:200]}") from exc
    if any(isinstance(t, yaml.AnchorToken | yaml.AliasToken) for t in tokens):
        raise SpecError(
            f"spec.config.{key}: YAML anchors and aliases (&name, *name) are not allowed; "
            f"write the value out"
        )
    return yaml.safe_load(text)


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
