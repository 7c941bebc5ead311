"""End-to-end fixtures: the real control plane, the node agent (pods as processes), MinIO,
and the operator running with exactly the RBAC its Helm chart grants.

The suite needs only a kubeconfig and an S3 endpoint; on a machine with Docker the same tests
run against a kind cluster (make kind-e2e), where real kubelets run the images instead."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.testbed.kube import KubeCluster
from tests.testbed.minio import S3Endpoint
from tests.testbed.nodeagent import NodeAgent
from tests.testbed.procs import LOOPBACK, ManagedProcess, free_port

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "stator-operator"
CRD = ROOT / "crds" / "statefulpipelines.stator.dev.yaml"
OPERATOR_NS = "stator-system"


@pytest.fixture(scope="session")
def agent(kube: KubeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeAgent]:
    node_agent = NodeAgent(
        kube.kubeconfig,
        tmp_path_factory.mktemp("agent"),
        extra_env={
            "PYTHONPATH": str(ROOT),
            "PYSPARK_PYTHON": sys.executable,
            "STATOR_HOME": str(tmp_path_factory.mktemp("home")),
        },
    )
    node_agent.start()
    yield node_agent
    node_agent.stop()


@pytest.fixture(scope="session")
def installed(kube: KubeCluster) -> str:
    """CRD and operator RBAC from the Helm chart, applied to the API server."""
    kube.kubectl("create", "namespace", OPERATOR_NS, check=False)
    rendered = kube.helm(
        "template",
        "stator",
        str(CHART),
        "--namespace",
        OPERATOR_NS,
        "--include-crds",
        "--set",
        "replicaCount=0",
    ).stdout
    kube.kubectl("apply", "-f", "-", input=rendered)
    kube.kubectl(
        "wait", "--for=condition=Established", "crd/statefulpipelines.stator.dev", "--timeout=60s"
    )
    return rendered


def _token_kubeconfig(kube: KubeCluster, path: Path) -> Path:
    token = kube.kubectl(
        "create", "token", "stator-stator-operator", "-n", OPERATOR_NS, "--duration", "4h"
    ).stdout.strip()
    assert kube.ca is not None
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "op",
        "clusters": [
            {
                "name": "c",
                "cluster": {
                    "server": kube.server,
                    "certificate-authority-data": base64.b64encode(
                        kube.ca.cert.read_bytes()
                    ).decode(),
                },
            }
        ],
        "users": [{"name": "op", "user": {"token": token}}],
        "contexts": [{"name": "op", "context": {"cluster": "c", "user": "op"}}],
    }
    path.write_text(yaml.safe_dump(doc))
    path.chmod(0o600)
    return path


@dataclass
class Operator:
    proc: ManagedProcess
    health: str

    def start(self) -> None:
        self.proc.start()
        self.proc.wait_ready(self._healthy, 60, "healthy")

    def _healthy(self) -> bool:
        with urllib.request.urlopen(self.health, timeout=2) as resp:
            return bool(resp.status == 200)

    def kill(self) -> None:
        self.proc.kill()

    def stop(self) -> None:
        self.proc.stop()


@pytest.fixture(scope="session")
def operator(
    kube: KubeCluster, installed: str, agent: NodeAgent, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    work = tmp_path_factory.mktemp("operator")
    kubeconfig = _token_kubeconfig(kube, work / "kubeconfig")
    health = f"http://{LOOPBACK}:{free_port()}/healthz"
    proc = ManagedProcess(
        "operator",
        [sys.executable, "-m", "stator_operator"],
        work,
        env={
            "KUBECONFIG": str(kubeconfig),
            "STATOR_OPERATOR_HEALTH": health,
            "PYTHONPATH": str(ROOT),
        },
    )
    op = Operator(proc, health)
    op.start()
    yield op
    op.stop()


@dataclass
class Space:
    """A namespace with a checkpoint bucket and its credentials Secret."""

    name: str
    bucket: str
    s3: S3Endpoint
    kube: KubeCluster

    def manifest(self, name: str, **spec: Any) -> dict[str, Any]:
        env = [
            {"name": "COUNTS_OUT", "value": f"s3://{self.bucket}/{name}/out"},
            {"name": "AWS_ENDPOINT_URL_S3", "value": self.s3.endpoint_url},
        ]
        for key, value in spec.pop("env", {}).items():
            env.append({"name": key, "value": str(value)})
        base: dict[str, Any] = {
            "image": "stator-runtime:test",
            "entrypoint": "tests.pipelines.e2e_counts:build",
            "replicas": 2,
            "maxParallelism": 64,
            "checkpointing": {
                "storage": f"s3://{self.bucket}/{name}/checkpoints",
                "endpoint": self.s3.endpoint_url,
                "credentialsSecret": "s3-credentials",
            },
            "savepoints": {"directory": f"s3://{self.bucket}/{name}/savepoints"},
            "config": {"epoch.max_records": "3000", "restart.delay_ms": "500"},
            "driver": {"env": env},
        }
        base.update(spec)
        return {
            "apiVersion": "stator.dev/v1alpha1",
            "kind": "StatefulPipeline",
            "metadata": {"name": name, "namespace": self.name},
            "spec": base,
        }

    def apply(self, manifest: dict[str, Any], check: bool = True) -> Any:
        return self.kube.kubectl("apply", "-f", "-", input=json.dumps(manifest), check=check)

    def get(self, name: str) -> dict[str, Any]:
        out: dict[str, Any] = self.kube.kubectl_json(
            "get", "statefulpipeline", name, "-n", self.name
        )
        return out

    def status(self, name: str) -> dict[str, Any]:
        return dict(self.get(name).get("status") or {})

    def wait(self, name: str, what: str, check: Any, timeout: float = 240) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        status: dict[str, Any] = {}
        while time.monotonic() < deadline:
            status = self.status(name)
            if check(status):
                return status
            time.sleep(0.5)
        events = self.kube.kubectl(
            "get",
            "events",
            "-n",
            self.name,
            "-o",
            "custom-columns=REASON:.reason,MESSAGE:.message",
            check=False,
        ).stdout
        brief = {
            k: v
            for k, v in status.items()
            if k not in ("lastReconciledSpec", "lastStableSpec", "conditions")
        }
        raise TimeoutError(f"{name}: {what}; status: {json.dumps(brief)[:3000]}\n{events[-3000:]}")

    def events(self) -> list[str]:
        out = self.kube.kubectl_json("get", "events", "-n", self.name)
        return [e.get("reason", "") for e in out["items"]]

    def driver_pods(self, name: str) -> list[dict[str, Any]]:
        pods: list[dict[str, Any]] = self.kube.kubectl_json(
            "get", "pods", "-n", self.name, "-l", f"stator.dev/pipeline={name}"
        )["items"]
        return pods


@pytest.fixture
def space(kube: KubeCluster, s3: S3Endpoint, operator: Operator) -> Iterator[Space]:
    name = f"e2e-{uuid.uuid4().hex[:6]}"
    bucket = name
    s3.client().create_bucket(Bucket=bucket)
    kube.kubectl("create", "namespace", name)
    kube.kubectl(
        "create",
        "secret",
        "generic",
        "s3-credentials",
        "-n",
        name,
        f"--from-literal=AWS_ACCESS_KEY_ID={s3.access_key}",
        f"--from-literal=AWS_SECRET_ACCESS_KEY={s3.secret_key}",
    )
    yield Space(name, bucket, s3, kube)
    subprocess.run(
        [
            str(kube.bin_dir / "kubectl"),
            f"--kubeconfig={kube.kubeconfig}",
            "delete",
            "statefulpipelines",
            "--all",
            "-n",
            name,
            "--wait=false",
        ],
        capture_output=True,
        check=False,
        env={**os.environ},
    )
