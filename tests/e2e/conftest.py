"""End-to-end fixtures: the real control plane, the node agent (pods as processes), MinIO,
and the operator running with exactly the RBAC its Helm chart grants.

The suite needs only a kubeconfig and an S3 endpoint. With ``STATOR_E2E_KUBECONFIG`` set it
uses that cluster instead of the test bed: the operator is the one installed there by Helm,
pods are run by real kubelets, and S3 is ``STATOR_E2E_S3_ENDPOINT`` (as the tests reach it)
and ``STATOR_E2E_S3_POD_ENDPOINT`` (as pods reach it), with ``STATOR_E2E_S3_ACCESS_KEY`` and
``STATOR_E2E_S3_SECRET_KEY``. ``make kind-e2e`` (tests/e2e/kind/run.sh) sets these up."""

from __future__ import annotations

import base64
import itertools
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

import pytest
import yaml

from tests.testbed.kube import KubeCluster, run_kubectl
from tests.testbed.minio import S3Endpoint
from tests.testbed.nodeagent import NodeAgent
from tests.testbed.procs import LOOPBACK, ManagedProcess, free_port

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "stator-operator"
CRD = ROOT / "crds" / "statefulpipelines.stator.dev.yaml"
OPERATOR_NS = "stator-system"
OPERATOR_DEPLOYMENT = "stator-stator-operator"  # release "stator" of the chart
LOCAL_STORAGE_CLASS = "stator-local"  # local PersistentVolumes the node agent provides
# The chart's namespaced mode (least privilege): the operator watches these namespaces only,
# with a Role in each; every test takes the next one (tests/e2e/kind/run.sh installs the
# same list).
WATCHED = [f"e2e-{i:02d}" for i in range(32)]
_taken = itertools.count()
EXTERNAL = os.environ.get("STATOR_E2E_KUBECONFIG")


class Kubectl(Protocol):
    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]: ...

    def kubectl_json(self, *args: str) -> Any: ...


@dataclass
class ExternalCluster:
    """A cluster the suite did not start, driven with the kubectl on PATH."""

    kubeconfig: Path

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return run_kubectl("kubectl", self.kubeconfig, args, input, check, timeout)

    def kubectl_json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json").stdout)


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Kubectl:
    if EXTERNAL:
        return ExternalCluster(Path(EXTERNAL))
    local: KubeCluster = request.getfixturevalue("kube")
    return local


@pytest.fixture(scope="session")
def e2e_s3(request: pytest.FixtureRequest) -> tuple[S3Endpoint, str]:
    """The S3 endpoint as the tests reach it, and its URL as pods reach it."""
    if EXTERNAL:
        endpoint = S3Endpoint(
            os.environ["STATOR_E2E_S3_ENDPOINT"],
            os.environ["STATOR_E2E_S3_ACCESS_KEY"],
            os.environ["STATOR_E2E_S3_SECRET_KEY"],
        )
        return endpoint, os.environ.get("STATOR_E2E_S3_POD_ENDPOINT", endpoint.endpoint_url)
    local: S3Endpoint = request.getfixturevalue("s3")
    return local, local.endpoint_url


@pytest.fixture(scope="session")
def agent(kube: KubeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeAgent]:
    node_agent = NodeAgent(
        kube.kubeconfig,
        tmp_path_factory.mktemp("agent"),
        nodes=["node-0", "node-1", "node-2"],
        extra_env={
            "PYTHONPATH": str(ROOT),
            "PYSPARK_PYTHON": sys.executable,
            "STATOR_HOME": str(tmp_path_factory.mktemp("home")),
        },
    )
    node_agent.start()
    # Local PersistentVolumes on every node, for executors' state (localRecovery.volume).
    node_agent.provide_local_volumes(LOCAL_STORAGE_CLASS, per_node=6)
    yield node_agent
    node_agent.stop()


@pytest.fixture(scope="session")
def installed(request: pytest.FixtureRequest, cluster: Kubectl) -> None:
    """CRD and operator RBAC from the Helm chart, applied to the API server (on an external
    cluster, ``helm install`` did this)."""
    if not EXTERNAL:
        _render_and_apply(request.getfixturevalue("kube"), WATCHED)
    wait_for_crd(cluster)


def wait_for_crd(cluster: Kubectl) -> None:
    cluster.kubectl(
        "wait", "--for=condition=Established", "crd/statefulpipelines.stator.dev", "--timeout=60s"
    )


def _render_and_apply(kube: KubeCluster, namespaces: list[str]) -> None:
    """The chart in namespaced mode for ``namespaces`` (created here, with the API server's
    Pod Security admission enforcing the restricted profile in each)."""
    for ns in [OPERATOR_NS, *namespaces]:
        kube.kubectl("create", "namespace", ns, check=False)
    for ns in namespaces:
        restrict(kube, ns)
    rendered = kube.helm(
        "template",
        "stator",
        str(CHART),
        "--namespace",
        OPERATOR_NS,
        "--include-crds",
        "--set",
        "replicaCount=0",
        "--set",
        f"watchNamespaces={{{','.join(namespaces)}}}",
    ).stdout
    kube.kubectl("apply", "-f", "-", input=rendered)


def restrict(cluster: Kubectl, namespace: str) -> None:
    """The API server's own Pod Security admission enforces what the operator checks: every
    pod the operator or Spark creates there must meet the restricted profile."""
    cluster.kubectl(
        "label",
        "namespace",
        namespace,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/enforce-version=latest",
        "--overwrite",
    )


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


class OperatorControl(Protocol):
    def kill(self) -> None: ...

    def start(self) -> None: ...


@dataclass
class InClusterOperator:
    """The operator Deployment installed by Helm: killed by force-deleting its pod with the
    Deployment scaled to zero, started by scaling it back."""

    cluster: Kubectl

    def kill(self) -> None:
        self._scale(0)
        self.cluster.kubectl(
            "delete",
            "pods",
            "-n",
            OPERATOR_NS,
            "-l",
            "app.kubernetes.io/name=stator-operator",
            "--grace-period=0",
            "--force",
        )

    def start(self) -> None:
        self._scale(1)
        self.cluster.kubectl(
            "rollout",
            "status",
            f"deployment/{OPERATOR_DEPLOYMENT}",
            "-n",
            OPERATOR_NS,
            "--timeout=120s",
            timeout=130,
        )

    def _scale(self, replicas: int) -> None:
        self.cluster.kubectl(
            "scale",
            f"deployment/{OPERATOR_DEPLOYMENT}",
            "-n",
            OPERATOR_NS,
            f"--replicas={replicas}",
        )


@pytest.fixture(scope="session")
def operator(
    request: pytest.FixtureRequest,
    cluster: Kubectl,
    installed: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorControl]:
    if EXTERNAL:
        in_cluster = InClusterOperator(cluster)
        in_cluster.start()
        yield in_cluster
        return
    kube: KubeCluster = request.getfixturevalue("kube")
    request.getfixturevalue("agent")  # pods need a node agent to run
    op = launch_operator(kube, tmp_path_factory.mktemp("operator"))
    op.start()
    yield op
    op.stop()


LEASE_SECONDS = 6  # the operator's leader Lease in the test bed (15 by default)


def create_credentials(kube: Any, namespace: str, s3: Any) -> None:
    """The Secret a manifest's checkpointing.credentialsSecret names (``s3-credentials``)."""
    kube.kubectl(
        "create",
        "secret",
        "generic",
        "s3-credentials",
        "-n",
        namespace,
        f"--from-literal=AWS_ACCESS_KEY_ID={s3.access_key}",
        f"--from-literal=AWS_SECRET_ACCESS_KEY={s3.secret_key}",
    )


def launch_operator(kube: KubeCluster, work: Path, namespaces: list[str] = WATCHED) -> Operator:
    """An operator process with the RBAC of the chart's service account, watching
    ``namespaces`` (not yet started); several of them elect a leader."""
    kubeconfig = _token_kubeconfig(kube, work / "kubeconfig")
    health = f"http://{LOOPBACK}:{free_port()}/healthz"
    proc = ManagedProcess(
        "operator",
        [sys.executable, "-m", "stator_operator"],
        work,
        env={
            "KUBECONFIG": str(kubeconfig),
            "STATOR_OPERATOR_HEALTH": health,
            "STATOR_OPERATOR_NAMESPACE": OPERATOR_NS,
            "STATOR_LEADER_LEASE_SECONDS": str(LEASE_SECONDS),
            "STATOR_WATCH_NAMESPACES": ",".join(namespaces),
            "PYTHONPATH": str(ROOT),
        },
    )
    return Operator(proc, health)


class NodeControl(Protocol):
    def lose(self, node: str) -> None: ...

    def restore(self, node: str) -> None: ...


@dataclass
class KindNodes:
    """kind's nodes are containers: a paused one is a node that vanished (no packets, no
    heartbeats), as the node agent's frozen nodes are."""

    def lose(self, node: str) -> None:
        subprocess.run(["docker", "pause", node], check=True)

    def restore(self, node: str) -> None:
        subprocess.run(["docker", "unpause", node], check=True)


@pytest.fixture(scope="session")
def nodes(request: pytest.FixtureRequest) -> NodeControl:
    """Lose a node and bring it back: the node agent's, or a kind node's container."""
    if EXTERNAL:
        return KindNodes()
    agent: NodeAgent = request.getfixturevalue("agent")
    return cast(NodeControl, _AgentNodes(agent))


RUNNING_AGAIN_S = 60  # issue 9: a lost node costs the job less than this


def wait_running_again(
    space: Space, name: str, what: str, check: Any, lost_at: float, timeout: float
) -> dict[str, Any]:
    """After a node loss at ``lost_at`` (monotonic): the status once ``check`` holds, which
    must be within ``RUNNING_AGAIN_S``."""
    status = space.wait(name, what, check, timeout=timeout)
    seconds = time.monotonic() - lost_at
    print(f"{what}: {seconds:.1f} s after the node loss")
    assert seconds < RUNNING_AGAIN_S, seconds
    return status


@dataclass
class _AgentNodes:
    agent: NodeAgent

    def lose(self, node: str) -> None:
        self.agent.lose_node(node)

    def restore(self, node: str) -> None:
        self.agent.restore_node(node)


@pytest.fixture(scope="session")
def kill_driver(request: pytest.FixtureRequest, cluster: Kubectl) -> Any:
    """SIGKILL a driver pod's process: the pod fails as it would when the JVM or Python dies."""
    if EXTERNAL:

        def kill_in_pod(namespace: str, pod: str) -> None:
            # tini is PID 1 and survives; it exits with the killed driver's status.
            cluster.kubectl("exec", "-n", namespace, pod, "--", "kill", "-9", "-1", check=False)

        return kill_in_pod
    agent: NodeAgent = request.getfixturevalue("agent")

    def kill_process(namespace: str, pod: str) -> None:
        os.killpg(agent.pods[f"{namespace}/{pod}"].proc.pid, signal.SIGKILL)

    return kill_process


@dataclass
class Space:
    """A namespace with a checkpoint bucket and its credentials Secret."""

    name: str
    bucket: str
    s3: S3Endpoint
    kube: Kubectl
    pod_s3: str = ""  # the S3 endpoint as pods reach it

    def __post_init__(self) -> None:
        self.pod_s3 = self.pod_s3 or self.s3.endpoint_url

    def manifest(self, name: str, **spec: Any) -> dict[str, Any]:
        env = [
            {"name": "COUNTS_OUT", "value": f"s3://{self.bucket}/{name}/out"},
            {"name": "AWS_ENDPOINT_URL_S3", "value": self.pod_s3},
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
                "endpoint": self.pod_s3,
                "credentialsSecret": "s3-credentials",
            },
            "savepoints": {"directory": f"s3://{self.bucket}/{name}/savepoints"},
            "config": {"epoch.max_records": "3000"},
            "failover": {"restartDelaySeconds": 0.5},
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
            "get",
            "pods",
            "-n",
            self.name,
            "-l",
            f"stator.dev/pipeline={name},stator.dev/component=driver",
        )["items"]
        return pods


@pytest.fixture
def space(
    cluster: Kubectl, e2e_s3: tuple[S3Endpoint, str], operator: OperatorControl
) -> Iterator[Space]:
    s3, pod_s3 = e2e_s3
    taken = next(_taken)
    assert taken < len(WATCHED), "more tests than watched namespaces: extend WATCHED"
    name = WATCHED[taken]
    bucket = f"{name}-{uuid.uuid4().hex[:6]}"
    s3.client().create_bucket(Bucket=bucket)
    if EXTERNAL:  # run.sh created the namespaces; the bed's fixture did too
        restrict(cluster, name)
    create_credentials(cluster, name, s3)
    yield Space(name, bucket, s3, cluster, pod_s3)
    cluster.kubectl("delete", "statefulpipelines", "--all", "-n", name, "--wait=false", check=False)
