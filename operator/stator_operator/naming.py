"""What the operator calls the things it makes and the runtime shares with it: executor sets
(Spark application ids) and their claims, the labels its objects carry, object names, mount
points, and the driver's exit codes."""

from __future__ import annotations

import hashlib

RUNTIME_UID = 185
STATE_MOUNT = "/var/lib/stator"
CONFIG_MOUNT = "/etc/stator"
EXECUTOR_TEMPLATE = "executor-pod.yaml"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
CONTROL_MOUNT = "/etc/stator-control"
READ_MOUNT = "/etc/stator-read"  # the read-only token (NAME-read), beside the control one
CONTROL_PORT = 8081  # the driver's control API
STOPPED_EXIT_CODE = 3  # the driver stopped with a savepoint (not: finished its input)
JOB_FAILED_EXIT_CODE = 2  # `stator run`: refused, or ended by a failure no restart fixes
CONTROL_TOKEN_KEY = "token"  # noqa: S105 - the key in the Secret, not a secret
STATE_VOLUME = "stator-state"  # an executor's state volume (its claim, with a local volume)
# On NAME-config: the Secret the pipeline's executors may read (the chart's admission policy).
CREDENTIALS_ANNOTATION = "stator.dev/credentials-secret"


def job_name(namespace: str, name: str) -> str:
    """The Stator job a pipeline runs (``name`` in its config): its checkpoints and savepoints
    live under ``<storage>/<job>``."""
    return f"{namespace}.{name}"


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


def running_executor_set(recorded: str | None, namespace: str, name: str) -> str:
    """The executor set the running deployment runs (``recorded``:
    ``status.deployment.executorSet``), or the pipeline's first (a deployment without
    executor pods records none)."""
    return recorded or spark_app_id(namespace, name)


def executor_set(app_id: str) -> str:
    """The StatefulSet Spark creates for the executors (resource profile 0)."""
    return f"spark-s-{app_id}-0"


def executor_claim(app_id: str, ordinal: int) -> str:
    """The state claim of executor ordinal ``ordinal`` (the StatefulSet's naming)."""
    return f"{STATE_VOLUME}-{executor_set(app_id)}-{ordinal}"


def labels(name: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "stator",
        "app.kubernetes.io/managed-by": "stator-operator",
        "stator.dev/pipeline": name,
        "stator.dev/component": component,
    }


def control_secret_name(name: str) -> str:
    return f"{name}-control"


def read_secret_name(name: str) -> str:
    """The Secret of the control API's read-only token (GET only: metrics, status, history;
    what the chart's Prometheus monitors and ``stator console`` use)."""
    return f"{name}-read"


def driver_service_name(name: str) -> str:
    """The Service in front of the pipeline's driver (its control API and web console)."""
    return f"{name}-driver"


def console_hint(name: str, namespace: str) -> dict[str, str]:
    """``status.console``: how to open the driver's web console (``stator console``, which
    reads the token from the Secret and port-forwards to the Service)."""
    return {
        "command": f"stator console {name} -n {namespace}",
        "service": driver_service_name(name),
        "path": "/console/",
    }


def driver_lease_name(pipeline: str) -> str:
    """The Lease a pipeline's driver holds while it writes (``stator.ha.fencing``)."""
    return f"{pipeline}-driver"


def driver_pod_name(pipeline: str, deployment: str) -> str:
    """The driver pod of one deployment (an operation's id names the driver it brings up)."""
    return f"{pipeline}-driver-{deployment}"
