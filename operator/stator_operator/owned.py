"""Settings the spec may not make: environment variables and Spark settings that the operator,
the driver or Spark's Kubernetes backend sets, each with who sets it and why (the refusals
name them, ``admission.py``)."""

from __future__ import annotations

from fnmatch import fnmatchcase

from .naming import STATE_VOLUME, labels

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


def spark_conf_owner(key: str) -> str | None:
    """Who sets Spark setting ``key``, if it is not the spec's."""
    return _owned(SPARK_CONF_OWNED, key)
