"""The runtime's job configuration for a spec (the ConfigMap drivers read): checkpoints,
restarts, failover and Spark, in the driver pod or with executors as pods. Only what the spec
sets; the runtime's defaults stay in one place (``stator.config``)."""

from __future__ import annotations

from typing import Any

import yaml

from stator.config import JobConfig, RestartConfig, build

from .naming import (
    CONTROL_PORT,
    STATE_MOUNT,
    STATE_VOLUME,
    driver_lease_name,
    job_name,
    labels,
    spark_app_id,
)
from .owned import reserved_env
from .pipeline_spec import Pinning, PipelineSpec, SpecError

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


def job_config(
    spec: PipelineSpec,
    name: str,
    namespace: str,
    app_id: str | None = None,
    owner: str = "",
) -> dict[str, Any]:
    """The Stator job configuration (stator config keys) for this spec. Only what the spec
    sets: the defaults are the runtime's (``JobConfig``), in one place. spec.config goes
    last, so every key written before it is refused there (``OPERATOR_CONFIG``).
    ``app_id``: the executor set the driver runs (default: the pipeline's first);
    ``owner``: the pipeline's uid, which owns its checkpoint root (``checkpoint.owner``)."""
    ck = spec.checkpointing
    cfg: dict[str, Any] = {
        "name": job_name(namespace, name),
        "checkpoint": _checkpoint(spec, owner),
        "state": {"local_dir": f"{STATE_MOUNT}/state"},
        "control": {"port": CONTROL_PORT},
        "restart": _restart(spec),
        "failover": {"strategy": spec.failover.strategy},
        "spark": _spark(spec, name, namespace, app_id),
        "savepoint": {"dir": spec.savepoint_dir},
        "lease": {"name": driver_lease_name(name)},
    }
    if spec.savepoints.format_type:
        cfg["savepoint"]["format_type"] = spec.savepoints.format_type
    local = spec.local_recovery
    if local is not None and (not local.enabled or local.standby):
        cfg["local_recovery"] = {
            **({"enabled": False} if not local.enabled else {}),
            **({"standby": True} if local.standby else {}),
        }
    if spec.replicas is not None:
        cfg["parallelism"] = spec.replicas
    if spec.max_parallelism is not None:
        cfg["max_parallelism"] = spec.max_parallelism
    if ck.endpoint:
        cfg["s3"] = {"endpoint_url": ck.endpoint}
    for key, value in spec.config.items():  # dotted keys, YAML values
        node = cfg
        parts = key.replace("-", "_").split(".")  # as the runtime reads it (spark.conf refused)
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = config_value(key, value)
    return cfg


def _checkpoint(spec: PipelineSpec, owner: str) -> dict[str, Any]:
    """spec.checkpointing as the runtime's checkpoint.* keys: what the spec leaves out keeps
    the runtime's defaults (config.CheckpointConfig)."""
    ck = spec.checkpointing
    out: dict[str, Any] = {
        "storage": ck.storage,
        "retained": ck.retained,
        "incremental": ck.incremental,
        "every_epochs": ck.interval_epochs,
        "interval_ms": ck.interval_seconds * 1000,
    }
    if owner:
        out["owner"] = owner
    if ck.adopt:
        out["adopt"] = True
    optional = {
        "async_upload": ck.async_upload,
        "max_concurrent": ck.max_concurrent,
        "timeout_ms": None if ck.timeout_seconds is None else ck.timeout_seconds * 1000,
        "tolerable_failures": ck.tolerable_failures,
        "progress_window_ms": (
            None if ck.progress_window_seconds is None else ck.progress_window_seconds * 1000
        ),
    }
    out.update({key: value for key, value in optional.items() if value is not None})
    return out


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


def _spark(spec: PipelineSpec, name: str, namespace: str, app_id: str | None) -> dict[str, Any]:
    """Spark in the driver pod (``local[*]``), or executors as pods when ``spec.executor`` is
    set: the settings known here; what only the running pod knows (API server, pod name
    and IP, token) the driver derives itself (``stator.cluster.kubernetes``).

    Executors run in a StatefulSet (Spark's ``statefulset`` allocator) under the application
    id of their executor set (``app_id``), which the drivers that take the set over keep: a
    killed executor restarts in its pod, on its node, with its volume, and a new driver's
    executors get the same pods and claims back. Their state lives on ``/var/lib/stator``: a
    claim on a local volume (``localRecovery.volume``), or the pod's emptyDir."""
    conf = dict(spec.spark_conf)  # no key the operator or driver sets (checked)
    executor = spec.executor
    if executor is None:
        return {"master": "local[*]", "conf": conf}
    app_id = app_id or spark_app_id(namespace, name)
    pods: dict[str, str] = {
        "spark.app.id": app_id,
        "spark.kubernetes.allocation.pods.allocator": "statefulset",
        "spark.executor.instances": str(spec.executor_instances),
        "spark.executor.cores": str(executor.cores),
        "spark.executor.memory": executor.memory,
        "spark.kubernetes.container.image": spec.image,
        "spark.kubernetes.container.image.pullPolicy": spec.image_pull_policy,
        "spark.executorEnv.STATOR_STATE_DIR": f"{STATE_MOUNT}/state",
        # The claims outlive every driver (the operator deletes them): a stopping driver
        # must not delete them by the application's label (Spark's default since 3.4), nor
        # look for a driver service it never had in client mode.
        "spark.kubernetes.driver.ownPersistentVolumeClaim": "false",
        "spark.kubernetes.driver.reusePersistentVolumeClaim": "false",
        "spark.kubernetes.driver.service.deleteOnTermination": "false",
    }
    volume = f"spark.kubernetes.executor.volumes.%s.{STATE_VOLUME}"
    claim = spec.local_recovery.volume if spec.local_recovery else None
    if spec.pinning is not Pinning.OFF and claim:
        pvc = volume % "persistentVolumeClaim"
        pods[f"{pvc}.options.claimName"] = "OnDemand"  # a volumeClaimTemplate of the set
        pods[f"{pvc}.options.storageClass"] = claim.storage_class_name
        pods[f"{pvc}.options.sizeLimit"] = claim.size
        pods[f"{pvc}.mount.path"] = STATE_MOUNT
        # ReadWriteOnce (Spark 4 asks for ReadWriteOncePod, which local volumes, as the
        # local static provisioner and most local provisioners create them, do not offer).
        pods["spark.kubernetes.legacy.useReadWriteOnceAccessMode"] = "true"
    else:
        pods[f"{volume % 'emptyDir'}.mount.path"] = STATE_MOUNT
    for key, value in labels(name, "executor").items():
        pods[f"spark.kubernetes.executor.label.{key}"] = value
    secret = spec.checkpointing.credentials_secret
    if secret:  # executors read and write checkpoints and sink output too
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            pods[f"spark.kubernetes.executor.secretKeyRef.{key}"] = f"{secret}:{key}"
    # Reserved names are refused by check_pods; kept out here too for a spec accepted before.
    for item in executor.env:
        if reserved_env("executor", item["name"]) is None:
            pods[f"spark.executorEnv.{item['name']}"] = str(item["value"])
    return {"master": "kubernetes", "conf": {**EXECUTOR_DEFAULTS, **conf, **pods}}


def _restart(spec: PipelineSpec) -> dict[str, Any]:
    """spec.failover as the runtime's restart.* keys; what the spec leaves out keeps the
    runtime's defaults (config.RestartConfig)."""
    f = spec.failover
    out: dict[str, Any] = {"strategy": f.restart_strategy, "attempts": f.max_restarts}
    # round, not int: 1.005 s is 1004.999... ms in floating point
    for key, seconds in (
        ("delay_ms", f.restart_delay_seconds),
        ("max_delay_ms", f.max_restart_delay_seconds),
        ("reset_after_ms", f.reset_after_seconds),
        ("interval_ms", f.failure_rate_interval_seconds),
    ):
        if seconds is not None:
            out[key] = round(seconds * 1000)
    for key, value in (("multiplier", f.backoff_multiplier), ("jitter", f.backoff_jitter)):
        if value is not None:
            out[key] = float(value)
    return out


def restart_config(spec: PipelineSpec, name: str, namespace: str) -> RestartConfig:
    """The job's restart strategy: the driver restarts failed epochs by it, and the operator
    restarts a failed driver pod by it (one set of spec fields, one set of rules)."""
    config: JobConfig = build(JobConfig, job_config(spec, name, namespace), "")
    return config.restart
