"""The real-node test bed (tests/testbed/realnodes.py): three kubelets, each with its own
containerd, runc and CNI bridge, registered with the bed's API server. Pods run as real
containers under the restricted Pod Security profile (enforced by the API server), reach
each other across nodes by cluster DNS, reach the API server through the ``kubernetes``
Service and a server on the host; a local volume pins its pod to its node; a lost node goes
unreachable with its pod frozen, and comes back."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.testbed import images
from tests.testbed.kube import KubeCluster
from tests.testbed.realnodes import HOST_IP, RealNodes

pytestmark = [pytest.mark.testbed, pytest.mark.containers]
IMAGE = "stator-base:probe"  # the local Debian base: Python 3.11, nothing of Stator's
POD_SECURITY = {
    "runAsNonRoot": True,
    "runAsUser": 1000,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "readOnlyRootFilesystem": True,
}


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KubeCluster, RealNodes]]:
    store = images.Store()
    base = images.ensure_base(store)
    archive = tmp_path_factory.mktemp("image") / "base.tar"
    store.run(
        "buildah", "push", "--quiet", base, f"docker-archive:{archive}:{IMAGE}", what="export"
    )
    RealNodes.prepare_host()
    root = tmp_path_factory.mktemp("real")
    started = time.monotonic()
    with KubeCluster(root / "kube", host=HOST_IP) as kube, RealNodes(kube, root / "nodes") as nodes:
        print(f"control plane and 3 nodes Ready in {time.monotonic() - started:.1f}s")
        started = time.monotonic()
        nodes.import_image(archive)
        print(f"image imported into 3 nodes in {time.monotonic() - started:.1f}s")
        kube.kubectl("create", "namespace", "t")
        kube.kubectl("label", "namespace", "t", "pod-security.kubernetes.io/enforce=restricted")
        yield kube, nodes


def _pod(name: str, node: str | None, command: list[str], **spec: Any) -> dict[str, Any]:
    labels = spec.pop("labels", {})
    body: dict[str, Any] = {
        "securityContext": POD_SECURITY,
        "restartPolicy": "Never",
        "containers": [
            {
                "name": "c",
                "image": IMAGE,
                "imagePullPolicy": "Never",
                "command": command,
                "securityContext": CONTAINER_SECURITY,
            }
        ],
        **spec,
    }
    if node:
        body["nodeSelector"] = {"kubernetes.io/hostname": node}
    meta = {"name": name, "namespace": "t", "labels": labels}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": body}


def _finished(kube: KubeCluster, name: str, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pod: dict[str, Any] = kube.kubectl_json("get", "pod", name, "-n", "t")
        if pod["status"].get("phase") in ("Succeeded", "Failed"):
            return pod
        time.sleep(0.5)
    raise TimeoutError(name)


def _node_ready(kube: KubeCluster, node: str) -> str:
    got = kube.kubectl_json("get", "node", node)
    return next(c["status"] for c in got["status"]["conditions"] if c["type"] == "Ready")


def test_pods_reach_each_other_by_dns_the_api_server_and_the_host(
    bed: tuple[KubeCluster, RealNodes], tmp_path: Path
) -> None:
    kube, _ = bed
    host = subprocess.Popen(  # a server on the host, as MinIO is in the e2e suite
        ["python3", "-m", "http.server", "18080", "--bind", HOST_IP, "-d", str(tmp_path)]
    )
    (tmp_path / "host.txt").write_text("from the host")
    try:
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "srv", "namespace": "t"},
            "spec": {"clusterIP": "None", "selector": {"app": "srv"}, "ports": [{"port": 8080}]},
        }
        kube.kubectl("apply", "-f", "-", input=json.dumps(service))
        server = _pod(
            "server",
            "node-0",
            ["python3", "-m", "http.server", "8080", "-d", "/etc"],
            labels={"app": "srv"},
        )
        started = time.monotonic()
        kube.kubectl("apply", "-f", "-", input=json.dumps(server))
        kube.kubectl("wait", "--for=condition=Ready", "pod/server", "-n", "t", "--timeout=120s")
        print(f"a pod Ready in {time.monotonic() - started:.1f}s")
        probe = (
            "import socket, ssl, urllib.request as u\n"
            "get = lambda url, **kw: u.urlopen(url, timeout=5, **kw).read().decode().strip()\n"
            "print(socket.gethostbyname('srv.t.svc.cluster.local'))\n"
            "print(get('http://srv.t.svc.cluster.local:8080/hostname'))\n"
            f"print(get('http://{HOST_IP}:18080/host.txt'))\n"
            "ca = '/var/run/secrets/kubernetes.io/serviceaccount/ca.crt'\n"
            "ctx = ssl.create_default_context(cafile=ca)\n"
            "print(get('https://kubernetes.default.svc/livez', context=ctx))\n"
        )
        kube.kubectl(
            "apply", "-f", "-", input=json.dumps(_pod("client", "node-2", ["python3", "-c", probe]))
        )
        pod = _finished(kube, "client")
        out = kube.kubectl("logs", "client", "-n", "t").stdout.split()
        assert pod["status"]["phase"] == "Succeeded", out
        server_ip = kube.kubectl_json("get", "pod", "server", "-n", "t")["status"]["podIP"]
        assert server_ip.startswith("10.244.0.") and pod["status"]["podIP"].startswith("10.244.2.")
        assert out == [server_ip, "server", "from", "the", "host", "ok"]
    finally:
        host.kill()


def test_a_local_volume_pins_its_pod_to_its_node(bed: tuple[KubeCluster, RealNodes]) -> None:
    kube, nodes = bed
    nodes.provide_local_volumes("probe-local", per_node=1)
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data", "namespace": "t"},
        "spec": {
            "storageClassName": "probe-local",
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    kube.kubectl("apply", "-f", "-", input=json.dumps(claim))
    volume = {"name": "data", "persistentVolumeClaim": {"claimName": "data"}}
    first = _pod("writer", None, ["sh", "-c", "echo kept > /data/file"], volumes=[volume])
    first["spec"]["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    kube.kubectl("apply", "-f", "-", input=json.dumps(first))
    written = _finished(kube, "writer")
    assert written["status"]["phase"] == "Succeeded"
    node = written["spec"]["nodeName"]
    assert (nodes.nodes[node].volumes / "probe-local" / "0" / "file").read_text() == "kept\n"
    second = _pod("reader", None, ["cat", "/data/file"], volumes=[volume])
    second["spec"]["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    kube.kubectl("apply", "-f", "-", input=json.dumps(second))
    read = _finished(kube, "reader")
    assert read["spec"]["nodeName"] == node
    assert kube.kubectl("logs", "reader", "-n", "t").stdout == "kept\n"


def test_a_lost_node_freezes_its_pods_goes_unreachable_and_comes_back(
    bed: tuple[KubeCluster, RealNodes],
) -> None:
    kube, nodes = bed
    ticker = _pod(
        "ticker",
        "node-1",
        [
            "python3",
            "-c",
            "import time\nwhile True: print(time.time(), flush=True); time.sleep(0.2)",
        ],
    )
    ticker["spec"]["restartPolicy"] = "Always"
    kube.kubectl("apply", "-f", "-", input=json.dumps(ticker))
    kube.kubectl("wait", "--for=condition=Ready", "pod/ticker", "-n", "t", "--timeout=120s")
    lost_at = time.monotonic()
    nodes.lose("node-1")
    try:
        deadline = time.monotonic() + 90
        while _node_ready(kube, "node-1") == "True":
            assert time.monotonic() < deadline, "node-1 still Ready after its loss"
            time.sleep(1)
        print(f"node-1 not Ready {time.monotonic() - lost_at:.1f}s after its loss")
        taints = kube.kubectl_json("get", "node", "node-1")["spec"].get("taints") or []
        assert "node.kubernetes.io/unreachable" in {t["key"] for t in taints}
        state = Path("/sys/fs/cgroup/freezer") / nodes.nodes["node-1"].cgroup_root.strip("/")
        assert (state / "freezer.state").read_text().strip() == "FROZEN"
    finally:
        nodes.restore("node-1")
    deadline = time.monotonic() + 90
    while _node_ready(kube, "node-1") != "True":
        assert time.monotonic() < deadline, "node-1 not Ready again"
        time.sleep(1)
    before = kube.kubectl("logs", "ticker", "-n", "t").stdout.count("\n")
    time.sleep(2)
    assert kube.kubectl("logs", "ticker", "-n", "t").stdout.count("\n") > before, "ticker thawed"
