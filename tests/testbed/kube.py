"""A real Kubernetes control plane on loopback: etcd, API server, controller-manager, scheduler.

Started the way envtest starts it, plus the controller-manager (garbage collector, service
account tokens, namespace and node lifecycle) and the scheduler, all bound to 127.0.0.1 with
free ports. There is no kubelet: pods are bound by the real scheduler and left for the node
agent of later issues to run.
"""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import pki
from .build import ensure
from .procs import LOOPBACK, ManagedProcess, free_port

SERVICE_CIDR = "10.0.0.0/24"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(path: Path, server: str, ca: Path, client: pki.Pair, user: str) -> Path:
    """A self-contained kubeconfig (certificates embedded) that works from any directory."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "testbed",
        "clusters": [
            {
                "name": "testbed",
                "cluster": {"server": server, "certificate-authority-data": _b64(ca)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": _b64(client.cert),
                    "client-key-data": _b64(client.key),
                },
            }
        ],
        "contexts": [
            {
                "name": "testbed",
                "context": {"cluster": "testbed", "user": user, "namespace": "default"},
            }
        ],
    }
    path.write_text(yaml.safe_dump(doc))
    path.chmod(0o600)
    return path


def run_kubectl(
    binary: str | Path,
    kubeconfig: Path,
    args: Sequence[str],
    input: str | None = None,
    check: bool = True,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """kubectl with output captured; a failure raises with kubectl's stderr attached."""
    argv = [str(binary), f"--kubeconfig={kubeconfig}", *args]
    proc = subprocess.run(
        argv, input=input, capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, argv, proc.stdout, proc.stderr)
    return proc


@dataclass
class KubeCluster:
    """Handle on a running control plane; ``kubeconfig`` is all a client needs."""

    workdir: Path
    procs: dict[str, ManagedProcess] = field(default_factory=dict)
    server: str = ""
    etcd_url: str = ""
    kubeconfig: Path = Path()
    ca: pki.Pair | None = None
    admin: pki.Pair | None = None
    kubelet_client: pki.Pair | None = None
    authority: pki.Authority | None = None  # issues more identities (real nodes' kubelets)
    # The API server's address: loopback, or the address that pods in containers reach the
    # host at (the real-node bed, tests/testbed/realnodes.py).
    host: str = LOOPBACK

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 90.0) -> KubeCluster:
        k8s, etcd = ensure("kubernetes"), ensure("etcd")
        certs = self.workdir / "pki"
        authority = pki.Authority(certs)
        self.authority = authority
        self.ca = authority.pair
        serving = authority.issue(
            "apiserver",
            "kube-apiserver",
            server=True,
            hosts=(
                "localhost",
                LOOPBACK,
                *([self.host] if self.host != LOOPBACK else []),
                "10.0.0.1",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
            ),
        )
        self.admin = authority.issue("admin", "testbed-admin", org="system:masters")
        # The API server's identity towards kubelets (logs, exec, port-forward).
        self.kubelet_client = authority.issue(
            "apiserver-kubelet-client", "kube-apiserver-kubelet-client", org="system:masters"
        )
        sa = pki.service_account_keys(certs)

        try:
            self._start_etcd(etcd.path("bin/etcd"), timeout)
            api_port = free_port()
            self.server = f"https://{self.host}:{api_port}"
            self.kubeconfig = write_kubeconfig(
                self.workdir / "kubeconfig",
                self.server,
                authority.pair.cert,
                self.admin,
                "testbed-admin",
            )
            self._start_apiserver(k8s.path("bin/kube-apiserver"), api_port, serving, sa, timeout)
            self._start_controller_manager(k8s.path("bin/kube-controller-manager"), sa, timeout)
            self._start_scheduler(k8s.path("bin/kube-scheduler"), timeout)
            self._wait_default_service_account(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            proc = self.procs.get(name)
            if proc is not None:
                proc.stop()

    def __enter__(self) -> KubeCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ components

    def _start_etcd(self, binary: Path, timeout: float) -> None:
        client, peer = free_port(), free_port()
        proc = ManagedProcess(
            "etcd",
            [
                str(binary),
                "--name=testbed",
                f"--data-dir={self.workdir / 'etcd-data'}",
                f"--listen-client-urls=http://{LOOPBACK}:{client}",
                f"--advertise-client-urls=http://{LOOPBACK}:{client}",
                f"--listen-peer-urls=http://{LOOPBACK}:{peer}",
                f"--initial-advertise-peer-urls=http://{LOOPBACK}:{peer}",
                f"--initial-cluster=testbed=http://{LOOPBACK}:{peer}",
                "--unsafe-no-fsync",
                "--logger=zap",
                "--log-level=warn",
            ],
            self.workdir,
        ).start()
        self.procs["etcd"] = proc
        self.etcd_url = f"http://{LOOPBACK}:{client}"

        def healthy() -> bool:
            with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as resp:
                return bool(json.load(resp).get("health") == "true")

        proc.wait_ready(healthy, timeout, "healthy")

    def _tls(self) -> ssl.SSLContext:
        assert self.ca and self.admin
        ctx = ssl.create_default_context(cafile=str(self.ca.cert))
        ctx.load_cert_chain(str(self.admin.cert), str(self.admin.key))
        return ctx

    def _get(self, url: str, ctx: ssl.SSLContext) -> str:
        with urllib.request.urlopen(url, timeout=3, context=ctx) as resp:
            return str(resp.read().decode())

    def _start_apiserver(
        self, binary: Path, port: int, serving: pki.Pair, sa: pki.Pair, timeout: float
    ) -> None:
        assert self.ca and self.kubelet_client
        proc = ManagedProcess(
            "kube-apiserver",
            [
                str(binary),
                f"--etcd-servers={self.etcd_url}",
                f"--cert-dir={self.workdir / 'pki'}",
                f"--secure-port={port}",
                f"--bind-address={self.host}",
                f"--advertise-address={self.host}",
                "--endpoint-reconciler-type=none",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                # Node: real kubelets (system:nodes) read what their own pods need.
                "--authorization-mode=Node,RBAC",
                f"--kubelet-client-certificate={self.kubelet_client.cert}",
                f"--kubelet-client-key={self.kubelet_client.key}",
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                "--allow-privileged=true",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--service-account-key-file={sa.cert}",
                f"--service-account-signing-key-file={sa.key}",
                f"--client-ca-file={self.ca.cert}",
                f"--tls-cert-file={serving.cert}",
                f"--tls-private-key-file={serving.key}",
                "--v=1",
            ],
            self.workdir,
        ).start()
        self.procs["kube-apiserver"] = proc
        ctx = self._tls()
        proc.wait_ready(lambda: self._get(f"{self.server}/readyz", ctx) == "ok", timeout, "ready")

    def _component_kubeconfig(self) -> list[str]:
        kc = str(self.kubeconfig)
        return [
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
        ]

    def _wait_healthz(self, proc: ManagedProcess, port: int, timeout: float) -> None:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # self-signed serving cert of a loopback health endpoint
        proc.wait_ready(
            lambda: self._get(f"https://{LOOPBACK}:{port}/healthz", ctx) == "ok", timeout, "healthy"
        )

    def _start_controller_manager(self, binary: Path, sa: pki.Pair, timeout: float) -> None:
        assert self.ca
        port = free_port()
        proc = ManagedProcess(
            "kube-controller-manager",
            [
                str(binary),
                *self._component_kubeconfig(),
                "--leader-elect=false",
                f"--bind-address={LOOPBACK}",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir / 'kcm-certs'}",
                # The node agent's pods have loopback IPs, which Endpoints and EndpointSlices
                # reject; those controllers would only emit failure events. Real nodes' pods
                # have real IPs, and cluster DNS answers headless Services from the slices.
                "--controllers="
                + (
                    "*"
                    if self.host != LOOPBACK
                    else "*,-endpoint,-endpointslice,-endpointslicemirroring"
                ),
                f"--service-account-private-key-file={sa.key}",
                f"--root-ca-file={self.ca.cert}",
                "--use-service-account-credentials=true",
                # A node that stops renewing its lease (the node agent renews every 5 s) is
                # unreachable after 20 s (the default is 50 s), as tuned clusters do.
                "--node-monitor-grace-period=20s",
                "--node-monitor-period=2s",
                "--v=1",
            ],
            self.workdir,
        ).start()
        self.procs["kube-controller-manager"] = proc
        self._wait_healthz(proc, port, timeout)

    def _start_scheduler(self, binary: Path, timeout: float) -> None:
        port = free_port()
        config = self.workdir / "scheduler.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "clientConnection": {"kubeconfig": str(self.kubeconfig)},
                    "leaderElection": {"leaderElect": False},
                }
            )
        )
        proc = ManagedProcess(
            "kube-scheduler",
            [
                str(binary),
                f"--config={config}",
                *self._component_kubeconfig()[1:],
                f"--bind-address={LOOPBACK}",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir / 'scheduler-certs'}",
                "--v=1",
            ],
            self.workdir,
        ).start()
        self.procs["kube-scheduler"] = proc
        self._wait_healthz(proc, port, timeout)

    def _wait_default_service_account(self, timeout: float) -> None:
        """Pods can't be created until the service account controller made ``default/default``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (
                self.kubectl(
                    "get", "serviceaccount", "default", "-n", "default", check=False
                ).returncode
                == 0
            ):
                return
            time.sleep(0.3)
        raise TimeoutError("the controller-manager did not create the default service account")

    # ------------------------------------------------------------------ clients

    @property
    def bin_dir(self) -> Path:
        return ensure("kubernetes").path("bin")

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run the test bed's kubectl against this cluster."""
        return run_kubectl(self.bin_dir / "kubectl", self.kubeconfig, args, input, check, timeout)

    def kubectl_json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json").stdout)

    def helm(
        self, *args: str, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        helm_bin = ensure("helm").path("bin/helm")
        home = self.workdir / "helm"
        env = {
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
            # helm install's discovery cache is $HOME/.kube/cache: never the work tree's.
            "HOME": str(home),
            "KUBECONFIG": str(self.kubeconfig),
            "PATH": "/usr/bin:/bin",
        }
        argv = [str(helm_bin), *args]
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, env=env, check=False
        )
        if check and proc.returncode != 0:
            raise subprocess.CalledProcessError(proc.returncode, argv, proc.stdout, proc.stderr)
        return proc

    def wait_for(
        self, what: str, predicate: Any, timeout: float = 60.0, interval: float = 0.3
    ) -> Any:
        """Poll ``predicate()`` until it returns something truthy; say ``what`` on timeout."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            last = predicate()
            if last:
                return last
            time.sleep(interval)
        raise TimeoutError(
            f"timed out after {timeout:.0f}s waiting for {what} (last value: {last!r})"
        )
