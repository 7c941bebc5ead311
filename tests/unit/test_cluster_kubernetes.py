"""The client-mode Spark settings a driver pod derives from its own environment."""

from __future__ import annotations

import pytest

from stator.cluster.kubernetes import in_cluster_conf
from stator.errors import ConfigError

POD_ENV = {
    "KUBERNETES_SERVICE_HOST": "10.96.0.1",
    "KUBERNETES_SERVICE_PORT": "443",
    "STATOR_POD_NAME": "counts-driver-3",
    "STATOR_POD_NAMESPACE": "team",
    "STATOR_POD_IP": "10.1.2.3",
}


def test_driver_pod_environment_gives_client_mode_settings() -> None:
    conf = in_cluster_conf({**POD_ENV, "STATOR_EXECUTOR_POD_TEMPLATE": "/etc/stator/exec.yaml"})
    assert conf["spark.master"] == "k8s://https://10.96.0.1:443"
    assert conf["spark.kubernetes.namespace"] == "team"
    assert conf["spark.kubernetes.driver.pod.name"] == "counts-driver-3"
    assert conf["spark.driver.host"] == conf["spark.driver.bindAddress"] == "10.1.2.3"
    token = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert conf["spark.kubernetes.authenticate.oauthTokenFile"] == token
    assert conf["spark.kubernetes.executor.podTemplateFile"] == "/etc/stator/exec.yaml"


def test_ipv6_api_server_and_another_token_directory() -> None:
    env = {**POD_ENV, "KUBERNETES_SERVICE_HOST": "fd00::1", "STATOR_SERVICE_ACCOUNT_DIR": "/sa"}
    conf = in_cluster_conf(env)
    assert conf["spark.master"] == "k8s://https://[fd00::1]:443"
    assert conf["spark.kubernetes.authenticate.caCertFile"] == "/sa/ca.crt"
    assert "spark.kubernetes.executor.podTemplateFile" not in conf


def test_outside_a_pod_names_what_is_missing_and_the_alternatives() -> None:
    env = {k: v for k, v in POD_ENV.items() if k != "STATOR_POD_IP"}
    with pytest.raises(ConfigError, match=r"STATOR_POD_IP is not set.*local\[\*\]"):
        in_cluster_conf(env)
