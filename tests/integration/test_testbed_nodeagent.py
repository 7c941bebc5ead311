"""The node agent runs pods as a kubelet would for the things Stator's pods need: a pod with
only ``args`` goes through the runtime image's entrypoint (so a Spark executor pod's
``args: [executor]`` reaches the executor branch), a pod that cannot start is ``Failed`` with
the reason while later pods still start, and the projected service-account volume holds a
token the API server accepts, its CA and the namespace, with ``KUBERNETES_SERVICE_HOST/PORT``
set."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.testbed.kube import KubeCluster
from tests.testbed.nodeagent import NodeAgent

# Run by the pod: call the API server as the pod's service account, as Spark's client would.
PROBE = """
import os, ssl, urllib.request
sa = os.environ["SA_DIR"]
token = open(f"{sa}/token").read()
ctx = ssl.create_default_context(cafile=f"{sa}/ca.crt")
url = f"https://{os.environ['KUBERNETES_SERVICE_HOST']}:{os.environ['KUBERNETES_SERVICE_PORT']}"
req = urllib.request.Request(url + "/version", headers={"Authorization": "Bearer " + token})
print("namespace", open(f"{sa}/namespace").read())
print("version", urllib.request.urlopen(req, context=ctx).read().decode())
"""


@pytest.fixture
def node_agent(kube: KubeCluster, tmp_path: Path) -> Iterator[NodeAgent]:
    """An agent with nodes of its own, tainted so that no other test's pod is scheduled
    there (this test's pods name their node), deleted afterwards."""
    suffix = uuid.uuid4().hex[:6]
    agent = NodeAgent(kube.kubeconfig, tmp_path, nodes=[f"solo-{suffix}"]).start()
    taint = {"spec": {"taints": [{"key": "testbed.stator.dev/solo", "effect": "NoSchedule"}]}}
    for node in agent.nodes:
        agent.api.patch_node(node, taint)
    yield agent
    agent.stop()
    for node in agent.nodes:
        kube.kubectl("delete", "node", node, "--wait=false", check=False)


def _pod(name: str, node: str, container: dict[str, Any]) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "nodeName": node,
                "restartPolicy": "Never",
                "containers": [{"name": "c", "image": "stator-runtime:test", **container}],
            },
        }
    )


def _finished(kube: KubeCluster, namespace: str, name: str) -> dict[str, Any]:
    def phase() -> dict[str, Any] | None:
        pod = kube.kubectl_json("get", "pod", name, "-n", namespace)
        done = pod["status"].get("phase") in ("Succeeded", "Failed")
        return pod["status"] if done else None

    status: dict[str, Any] = kube.wait_for(f"pod {name} to finish", phase, timeout=60)
    return status


def test_pods_start_through_the_entrypoint_or_fail_with_a_reason(
    kube: KubeCluster, namespace: str, node_agent: NodeAgent
) -> None:
    node = node_agent.nodes[0]
    kube.wait_for(
        "the default service account",
        lambda: kube.kubectl("get", "sa", "default", "-n", namespace, check=False).returncode == 0,
    )
    pods = {
        # A Spark executor pod as the Kubernetes backend writes it: no command, one argument.
        "executor": {"args": ["executor"]},
        "missing": {"command": ["/nonexistent/bin/tool"]},
        "probe": {
            "command": [sys.executable, "-c", PROBE],
            "env": [{"name": "SA_DIR", "value": "/var/run/secrets/kubernetes.io/serviceaccount"}],
        },
    }
    for name, container in pods.items():
        kube.kubectl("create", "-n", namespace, "-f", "-", input=_pod(name, node, container))

    executor = _finished(kube, namespace, "executor")
    assert executor["phase"] == "Failed"
    log = node_agent.pod_log(namespace, "executor")
    assert "executor mode needs SPARK_DRIVER_URL" in log, log  # the entrypoint's executor branch

    missing = _finished(kube, namespace, "missing")
    assert missing["phase"] == "Failed"
    reason = missing["containerStatuses"][0]["state"]["terminated"]["reason"]
    assert reason.startswith("StartError") and "/nonexistent/bin/tool" in reason, reason

    probe = _finished(kube, namespace, "probe")
    log = node_agent.pod_log(namespace, "probe")
    assert probe["phase"] == "Succeeded", log
    assert f"namespace {namespace}" in log
    version = json.loads(log.split("version ", 1)[1])
    assert version["gitVersion"].startswith("v1."), version
