"""The end-to-end suite's cluster: the test bed's or an external one (``STATOR_E2E_KUBECONFIG``),
the operator's chart applied to it, the operator run as a process or found installed, nodes to
lose, and ``Space``, a test's namespace with its bucket. The fixtures that set these up are in
conftest; this module holds what tests, the demo and the pod benchmarks use directly."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from tests.testbed.kube import KubeCluster, run_kubectl
from tests.testbed.minio import S3Endpoint
from tests.testbed.nodeagent import NodeAgent
from tests.testbed.procs import LOOPBACK, ManagedProcess, free_port
from tests.testbed.realnodes import NodeHandle

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "stator-operator"
CRD = ROOT / "crds" / "statefulpipelines.stator.dev.yaml"
OPERATOR_NS = "stator-system"
OPERATOR_DEPLOYMENT = "stator-stator-operator"  # release "stator" of the chart
LEADER_LEASE = "stator-operator-leader"  # the operator's (operator/stator_operator/__main__.py)
LOCAL_STORAGE_CLASS = "stator-local"  # local PersistentVolumes the node agent provides
# The chart's namespaced mode (least privilege): the operator watches these namespaces only,
# with a Role in each; every test takes the next one (tests/e2e/kind/run.sh installs the
# same list).
WATCHED = [f"e2e-{i:02d}" for i in range(32)]
EXTERNAL = os.environ.get("STATOR_E2E_KUBECONFIG")
# The CPU an executor pod requests (Spark's default: its cores); set where nodes are small.
EXECUTOR_REQUEST_CORES = os.environ.get("STATOR_E2E_EXECUTOR_REQUEST_CORES", "")


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


def wait_for_crd(cluster: Kubectl) -> None:
    cluster.kubectl(
        "wait", "--for=condition=Established", "crd/statefulpipelines.stator.dev", "--timeout=60s"
    )


def render_and_apply(kube: KubeCluster, namespaces: list[str]) -> None:
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
    """The operator Deployment installed by Helm (a leader and its standby): killed by
    force-deleting its pods with the Deployment scaled to zero, started by scaling it back
    to the replicas it was installed with."""

    cluster: Kubectl
    replicas: int = 0  # as installed; read before the first kill

    def kill(self) -> None:
        self._installed()
        self._scale(0)
        self._force_delete("-l", "app.kubernetes.io/name=stator-operator")

    def kill_leader(self) -> str:
        """Force-deletes the pod holding the leader Lease (the Deployment replaces it); the
        standby takes the Lease once it lapses. Returns the killed pod's name."""
        lease = self.cluster.kubectl_json("get", "lease", LEADER_LEASE, "-n", OPERATOR_NS)
        holder = lease["spec"]["holderIdentity"]
        pods = self.cluster.kubectl_json(
            "get", "pods", "-n", OPERATOR_NS, "-l", "app.kubernetes.io/name=stator-operator"
        )["items"]
        names = [str(p["metadata"]["name"]) for p in pods]
        (leader,) = [n for n in names if holder.startswith(f"{n}-")]
        self._force_delete(leader)
        return leader

    def start(self) -> None:
        self._scale(self._installed())
        self.cluster.kubectl(
            "rollout",
            "status",
            f"deployment/{OPERATOR_DEPLOYMENT}",
            "-n",
            OPERATOR_NS,
            "--timeout=120s",
            timeout=130,
        )

    def _installed(self) -> int:
        if not self.replicas:
            deployment = self.cluster.kubectl_json(
                "get", f"deployment/{OPERATOR_DEPLOYMENT}", "-n", OPERATOR_NS
            )
            self.replicas = max(1, int(deployment["spec"].get("replicas") or 0))
        return self.replicas

    def _force_delete(self, *which: str) -> None:
        self.cluster.kubectl(
            "delete", "pods", "-n", OPERATOR_NS, *which, "--grace-period=0", "--force"
        )

    def _scale(self, replicas: int) -> None:
        self.cluster.kubectl(
            "scale",
            f"deployment/{OPERATOR_DEPLOYMENT}",
            "-n",
            OPERATOR_NS,
            f"--replicas={replicas}",
        )


LEASE_SECONDS = 6  # the operator's leader Lease in the test bed (15 by default)
RELEASE_KEY = "control/release"  # under a pipeline's prefix: Space.finish


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


class CutOffNode(Protocol):
    """A lost node whose processes run on, cut off from the control plane (a partition):
    what its pods did meanwhile, read from the node itself (the API server hears nothing)."""

    def exit_code(self, pod: dict[str, Any], timeout: float) -> int:
        """The exit code of ``pod``'s (first) container once it exits within ``timeout``."""
        ...

    def log(self, pod: dict[str, Any]) -> str: ...


class NodeControl(Protocol):
    def lose(self, node: str) -> None: ...

    def cut_off(self, node: str) -> CutOffNode | None:
        """A lost node's processes run on, still cut off; None where the bed cannot."""
        ...

    def restore(self, node: str) -> None: ...


@dataclass
class KindNodes:
    """kind's nodes are containers: a paused one is a node that vanished (no packets, no
    heartbeats), as the node agent's frozen nodes are."""

    def lose(self, node: str) -> None:
        subprocess.run(["docker", "pause", node], check=True)

    def cut_off(self, node: str) -> CutOffNode | None:
        return None  # an unpaused kind node is back, not partitioned

    def restore(self, node: str) -> None:
        subprocess.run(["docker", "unpause", node], check=True)


@dataclass
class RealNodeControl:
    """The real-node bed's nodes (tests/e2e/real_nodes.py): a lost one has its pods frozen
    and its kubelet and containerd stopped, in the process that runs the suite."""

    handles: dict[str, NodeHandle]

    @classmethod
    def from_file(cls, path: Path) -> RealNodeControl:
        raw = json.loads(path.read_text())
        return cls({name: NodeHandle(**fields) for name, fields in raw.items()})

    def lose(self, node: str) -> None:
        self.handles[node].lose()

    def cut_off(self, node: str) -> CutOffNode:
        handle = self.handles[node]
        handle.cut_off()
        return RealCutOff(handle)

    def restore(self, node: str) -> None:
        self.handles[node].restore()


@dataclass
class RealCutOff:
    """A real node with its kubelet stopped: containerd records exits and logs."""

    handle: NodeHandle

    def exit_code(self, pod: dict[str, Any], timeout: float) -> int:
        (status,) = pod["status"]["containerStatuses"][:1]
        container_id = status["containerID"].removeprefix("containerd://")
        deadline = time.monotonic() + timeout
        while (code := self.handle.container_exit(container_id)) is None:
            assert time.monotonic() < deadline, f"{container_id} still runs after {timeout} s"
            time.sleep(0.5)
        return code

    def log(self, pod: dict[str, Any]) -> str:
        meta = pod["metadata"]
        container = pod["spec"]["containers"][0]["name"]
        return self.handle.container_log(meta["namespace"], meta["name"], meta["uid"], container)


def node_control() -> NodeControl:
    """How an external cluster's nodes are lost: ``STATOR_E2E_NODES=real:<file>`` for the
    real-node bed, else kind's containers."""
    nodes = os.environ.get("STATOR_E2E_NODES", "kind")
    if nodes.startswith("real:"):
        return RealNodeControl.from_file(Path(nodes.removeprefix("real:")))
    return KindNodes()


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
class AgentNodes:
    """The node agent's nodes: a lost one is frozen (no heartbeats, its pods unreachable)."""

    agent: NodeAgent

    def lose(self, node: str) -> None:
        self.agent.lose_node(node)

    def cut_off(self, node: str) -> CutOffNode:
        return AgentCutOff(self.agent, self.agent.thaw_node(node))

    def restore(self, node: str) -> None:
        self.agent.restore_node(node)


@dataclass
class AgentCutOff:
    """The node agent's thawed node: its pods' processes and logs are the agent's."""

    agent: NodeAgent
    procs: dict[str, Any]  # by pod key (namespace/name)

    def exit_code(self, pod: dict[str, Any], timeout: float) -> int:
        meta = pod["metadata"]
        return int(self.procs[f"{meta['namespace']}/{meta['name']}"].wait(timeout))

    def log(self, pod: dict[str, Any]) -> str:
        return self.agent.pod_log(pod["metadata"]["namespace"], pod["metadata"]["name"])


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
            {"name": "RELEASE", "value": f"s3://{self.bucket}/{name}/{RELEASE_KEY}"},
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
        if EXECUTOR_REQUEST_CORES:
            # Nodes smaller than the tests' executors (the real-node bed's report this
            # machine's 2 CPUs each): executors ask for less CPU than their task slots.
            conf = {"spark.kubernetes.executor.request.cores": EXECUTOR_REQUEST_CORES}
            base["sparkConf"] = {**conf, **base.get("sparkConf", {})}
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

    def finish(self, name: str, timeout: float = 300) -> dict[str, Any]:
        """Release the rest of pipeline ``name``'s rate-limited input (its test has checked
        what it came for: ``tests/pipelines/release.py``) and wait for it to finish."""
        self.s3.client().put_object(Bucket=self.bucket, Key=f"{name}/{RELEASE_KEY}", Body=b"")
        return self.wait(name, "finished", lambda s: s.get("phase") == "Finished", timeout)

    def save_pod_logs(self, dest: Path) -> Path:
        """Every pod's logs in this namespace, current and previous containers, under
        ``dest`` (a pod on a lost node answers nothing within the request timeout)."""
        dest.mkdir(parents=True, exist_ok=True)
        pods = self.kube.kubectl_json("get", "pods", "-n", self.name)["items"]
        for pod in pods:
            pod_name = pod["metadata"]["name"]
            for previous in ("false", "true"):
                out = self.kube.kubectl(
                    "logs",
                    pod_name,
                    "-n",
                    self.name,
                    "--all-containers",
                    f"--previous={previous}",
                    "--request-timeout=10s",
                    check=False,
                )
                if out.stdout:
                    suffix = ".previous" if previous == "true" else ""
                    (dest / f"{pod_name}{suffix}.log").write_text(out.stdout)
        events = self.kube.kubectl("get", "events", "-n", self.name, "-o", "wide", check=False)
        (dest / "events.txt").write_text(events.stdout)
        return dest

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
