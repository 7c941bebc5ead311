"""Spark's Kubernetes backend in client mode, from inside the driver pod.

``spark.master: kubernetes`` asks for it. What only the running pod knows comes from its
environment (the operator sets these variables on the driver pod, from the downward API and
its mounts): the API server, the pod's name, namespace and IP (executor pods are owned by
the driver pod, so they are garbage-collected with it, and reach the driver at its IP), the
service-account token and CA, and the executor pod template. Everything else (image, executor
count, cores, memory, labels, Secret references) is plain ``spark.conf`` the operator writes.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import ConfigError

MASTER = "kubernetes"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
REQUIRED_ENV = (
    "KUBERNETES_SERVICE_HOST",
    "KUBERNETES_SERVICE_PORT",
    "STATOR_POD_NAME",
    "STATOR_POD_NAMESPACE",
    "STATOR_POD_IP",
)


def in_cluster_conf(env: Mapping[str, str]) -> dict[str, str]:
    """The Spark settings of a client-mode driver running in the pod ``env`` describes,
    ``spark.master`` included."""
    missing = [name for name in REQUIRED_ENV if not env.get(name)]
    if missing:
        raise ConfigError(
            f"spark.master={MASTER} runs executors as pods and needs the driver pod's "
            f"environment, but {', '.join(missing)} is not set: run the driver in a pod the "
            f"Stator operator created, or set spark.master to local[*] (one process) or to a "
            f"k8s://https://HOST:PORT URL with the spark.kubernetes.* settings yourself"
        )
    host = env["KUBERNETES_SERVICE_HOST"]
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    account = env.get("STATOR_SERVICE_ACCOUNT_DIR") or SERVICE_ACCOUNT_DIR
    conf = {
        "spark.master": f"k8s://https://{host}:{env['KUBERNETES_SERVICE_PORT']}",
        "spark.submit.deployMode": "client",
        "spark.kubernetes.namespace": env["STATOR_POD_NAMESPACE"],
        # Executor pods get the driver pod as their owner.
        "spark.kubernetes.driver.pod.name": env["STATOR_POD_NAME"],
        "spark.driver.host": env["STATOR_POD_IP"],
        "spark.driver.bindAddress": env["STATOR_POD_IP"],
        # Client mode reads credentials from spark.kubernetes.authenticate.* (no "driver.").
        "spark.kubernetes.authenticate.oauthTokenFile": f"{account}/token",
        "spark.kubernetes.authenticate.caCertFile": f"{account}/ca.crt",
    }
    template = env.get("STATOR_EXECUTOR_POD_TEMPLATE")
    if template:
        conf["spark.kubernetes.executor.podTemplateFile"] = template
    return conf
