"""``stator console NAME -n NAMESPACE`` against the test bed's real API server: the token is
read from the pipeline's ``NAME-read`` Secret (the read-only token) with kubectl and never
printed, and a driver Service that cannot be port-forwarded to is a clear error. (The test
bed has no kubelet, so the port-forward itself is not exercised here.)"""

from __future__ import annotations

import base64
import json
import os

import pytest

from stator.cli.console import secret_token
from stator.cli.main import main
from stator.errors import StatorError
from tests.testbed.kube import KubeCluster

TOKEN = "a-token-from-the-secret"


@pytest.fixture
def kubectl_env(kube: KubeCluster, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """kubectl of the test bed on PATH, talking to its API server."""
    monkeypatch.setenv("PATH", f"{kube.bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig))
    return [str(kube.bin_dir / "kubectl")]


def test_the_token_comes_from_the_pipelines_secret(
    kube: KubeCluster, namespace: str, kubectl_env: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "totals-read", "namespace": namespace},
        "data": {"token": base64.b64encode(TOKEN.encode()).decode()},
    }
    kube.kubectl("apply", "-f", "-", input=json.dumps(secret))
    assert secret_token([*kubectl_env, "--namespace", namespace], "totals") == TOKEN
    with pytest.raises(StatorError, match=r"cannot read Secret nope-read .*NotFound"):
        secret_token([*kubectl_env, "--namespace", namespace], "nope")

    # The whole command: the Secret is read, then the port-forward to a Service that does
    # not exist fails, and says so; the token is printed nowhere.
    assert main(["console", "totals", "-n", namespace, "--no-browser"]) == 2
    out = capsys.readouterr()
    assert "kubectl port-forward failed" in out.err and "totals-driver" in out.err
    assert TOKEN not in out.out + out.err
