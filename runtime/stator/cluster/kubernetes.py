"""Spark's Kubernetes backend in client mode, from inside the driver pod.

``spark.master: kubernetes`` asks for it. What only the running pod knows comes from its
environment (the operator sets these variables on the driver pod, from the downward API and
its mounts): the API server, the pod's name, namespace and IP (executor pods are owned by
the driver pod, so they are garbage-collected with it, and reach the driver at its IP), the
service-account token and CA, and the executor pod template. Everything else (image, executor
count, cores, memory, labels, Secret references) is plain ``spark.conf`` the operator writes.
"""

from __future__ import annotations

import json
import ssl
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import quote

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


def executor_pod_ips(conf: Mapping[str, str], app_id: str, timeout_s: float = 5.0) -> set[str]:
    """The IPs of this application's executor pods that exist and are not being deleted, as
    the API server has them (the driver's service account may list pods in its namespace).
    Raises on any API or network error: the caller must not take a failed look for "no pods"."""
    master = conf["spark.master"].removeprefix("k8s://")
    namespace = quote(conf["spark.kubernetes.namespace"], safe="")
    selector = quote(f"spark-role=executor,spark-app-selector={app_id}", safe="")
    url = f"{master}/api/v1/namespaces/{namespace}/pods?labelSelector={selector}"
    token = Path(conf["spark.kubernetes.authenticate.oauthTokenFile"]).read_text().strip()
    context = ssl.create_default_context(cafile=conf["spark.kubernetes.authenticate.caCertFile"])
    if not url.startswith("https://"):
        raise ValueError(f"not an https API server URL: {master!r}")
    auth = {"Authorization": f"Bearer {token}"}
    request = urllib.request.Request(url, headers=auth)  # noqa: S310 - https only, checked
    with urllib.request.urlopen(request, timeout=timeout_s, context=context) as response:  # noqa: S310
        pods = json.load(response)["items"]
    return {
        p["status"]["podIP"]
        for p in pods
        if p.get("status", {}).get("podIP") and not p["metadata"].get("deletionTimestamp")
    }
