"""The local control plane is a real Kubernetes: API server, garbage collector, scheduler."""

from __future__ import annotations

import json
import subprocess
import uuid

import yaml

from tests.testbed.kube import KubeCluster
from tests.testbed.versions import PINS

WIDGET_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.testbed.stator.dev"},
    "spec": {
        "group": "testbed.stator.dev",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["size"],
                                "properties": {"size": {"type": "integer", "minimum": 1}},
                            }
                        },
                    }
                },
            }
        ],
    },
}


def test_versions_are_stamped(kube: KubeCluster) -> None:
    out = json.loads(kube.kubectl("version", "-o", "json").stdout)
    assert out["clientVersion"]["gitVersion"] == PINS.kubernetes
    assert out["serverVersion"]["gitVersion"] == PINS.kubernetes
    assert out["serverVersion"]["gitTreeState"] == "clean"


def test_crd_and_custom_resource_round_trip(kube: KubeCluster, namespace: str) -> None:
    kube.kubectl("apply", "-f", "-", input=json.dumps(WIDGET_CRD))
    kube.kubectl(
        "wait", "--for=condition=Established", "crd/widgets.testbed.stator.dev", "--timeout=30s"
    )
    widget = {
        "apiVersion": "testbed.stator.dev/v1",
        "kind": "Widget",
        "metadata": {"name": "w1", "namespace": namespace},
        "spec": {"size": 3},
    }
    kube.kubectl("apply", "-f", "-", input=json.dumps(widget))
    got = kube.kubectl_json("get", "widget", "w1", "-n", namespace)
    assert got["spec"] == {"size": 3}
    assert got["metadata"]["uid"]

    # The structural schema is enforced by the API server, not by a client.
    bad = dict(widget, metadata={"name": "w2", "namespace": namespace}, spec={"size": 0})
    rejected = kube.kubectl("apply", "-f", "-", input=json.dumps(bad), check=False)
    assert rejected.returncode != 0
    assert "spec.size" in rejected.stderr


def test_garbage_collector_deletes_child_of_deleted_owner(
    kube: KubeCluster, namespace: str
) -> None:
    owner = kube.kubectl_json("create", "configmap", "owner", "-n", namespace)
    child = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "child",
            "namespace": namespace,
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "name": "owner",
                    "uid": owner["metadata"]["uid"],
                }
            ],
        },
        "data": {"k": "v"},
    }
    kube.kubectl("create", "-f", "-", input=json.dumps(child))
    kube.kubectl("create", "configmap", "bystander", "-n", namespace)

    kube.kubectl("delete", "configmap", "owner", "-n", namespace, "--cascade=background")
    kube.wait_for(
        "the garbage collector to delete the child",
        lambda: (
            kube.kubectl("get", "configmap", "child", "-n", namespace, check=False).returncode != 0
        ),
        timeout=60,
    )
    # Only the owned object goes: an unrelated one survives.
    assert kube.kubectl("get", "configmap", "bystander", "-n", namespace).returncode == 0


def _node(name: str, zone: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"testbed.stator.dev/zone": zone, "kubernetes.io/hostname": name},
        },
    }


def _make_ready(kube: KubeCluster, name: str) -> None:
    now = subprocess.run(
        ["date", "-u", "+%Y-%m-%dT%H:%M:%SZ"], capture_output=True, text=True, check=True
    ).stdout.strip()
    status = {
        "status": {
            "capacity": {"cpu": "2", "memory": "4Gi", "pods": "10"},
            "allocatable": {"cpu": "2", "memory": "4Gi", "pods": "10"},
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "TestbedReady",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
        }
    }
    kube.kubectl(
        "patch", "node", name, "--subresource=status", "--type=merge", "-p", json.dumps(status)
    )


def test_scheduler_binds_pod_to_node_matching_selector(kube: KubeCluster, namespace: str) -> None:
    suffix = uuid.uuid4().hex[:6]
    nodes = {f"node-a-{suffix}": "a", f"node-b-{suffix}": "b"}
    try:
        for name, zone in nodes.items():
            kube.kubectl("create", "-f", "-", input=json.dumps(_node(name, zone)))
            _make_ready(kube, name)
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "pinned", "namespace": namespace},
            "spec": {
                "nodeSelector": {
                    "testbed.stator.dev/zone": "b",
                    "kubernetes.io/hostname": f"node-b-{suffix}",
                },
                "containers": [
                    {
                        "name": "c",
                        "image": "example.invalid/none:1",
                        "resources": {"requests": {"cpu": "100m"}},
                    }
                ],
            },
        }
        kube.kubectl("create", "-f", "-", input=yaml.safe_dump(pod))
        bound = kube.wait_for(
            "the scheduler to bind the pod",
            lambda: kube.kubectl_json("get", "pod", "pinned", "-n", namespace)["spec"].get(
                "nodeName"
            ),
            timeout=60,
        )
        assert bound == f"node-b-{suffix}"
        events = kube.kubectl(
            "get", "events", "-n", namespace, "--field-selector", "reason=Scheduled", "-o", "name"
        ).stdout
        assert events.strip(), "the scheduler records a Scheduled event"
    finally:
        for name in nodes:
            kube.kubectl("delete", "node", name, "--wait=false", check=False)
