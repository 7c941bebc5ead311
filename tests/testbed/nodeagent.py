"""A node agent: fake Nodes whose pods run as local processes (the test bed has no kubelet).

It registers Node objects with capacity and a Ready condition and keeps their leases fresh,
lets the real scheduler bind pods, and runs each bound pod's first container as a process:
its command and args with ``$(VAR)`` expanded (without a command, through the runtime image's
entrypoint, images/runtime/entrypoint.sh, with the local Java and PySpark as ``JAVA_HOME`` and
``SPARK_HOME``: so a Spark executor pod, which has only ``args: [executor]``, starts a real
executor), its env (values, Secret and ConfigMap keys, pod fields) plus
``KUBERNETES_SERVICE_HOST/PORT``, volumes mapped to per-node (hostPath, PVC) or per-pod
(emptyDir, ConfigMap, Secret, projected service-account token/CA/namespace) directories and
mount paths rewritten to them. Every pod gets its own loopback address as pod IP. Phases and
exit codes are reported in the pod status; a pod whose process cannot start is ``Failed`` with
the reason (the agent goes on with the other pods); deleted pods are stopped with SIGTERM and
then SIGKILL; a "lost" node kills all its processes and stops heartbeating.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pyspark
from kubernetes import client, config

log = logging.getLogger("testbed.nodeagent")
ENTRYPOINT = Path(__file__).resolve().parents[2] / "images" / "runtime" / "entrypoint.sh"
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class PodProcess:
    key: str  # namespace/name
    uid: str
    node: str
    ip: str
    proc: subprocess.Popen[bytes]
    log: Path
    reported: str = "Running"


@dataclass
class NodeAgent:
    kubeconfig: Path
    workdir: Path
    nodes: list[str] = field(default_factory=lambda: ["node-0", "node-1"])
    cpu: str = "8"
    memory: str = "32Gi"
    path_prefix: list[str] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.api = client.CoreV1Api(config.new_client_from_config(str(self.kubeconfig)))
        self.coord = client.CoordinationV1Api(self.api.api_client)
        self.pods: dict[str, PodProcess] = {}
        self.lost: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_ip = 10
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> NodeAgent:
        for name in self.nodes:
            self._register(name)
        self._thread = threading.Thread(target=self._loop, name="node-agent", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(10)
        for pod in list(self.pods.values()):
            self._kill(pod, grace=5)

    def node_dir(self, node: str) -> Path:
        return self.workdir / "nodes" / node

    def lose_node(self, node: str) -> None:
        """The node disappears: its processes die at once and it stops heartbeating."""
        with self._lock:
            self.lost.add(node)
            for pod in [p for p in self.pods.values() if p.node == node]:
                self._kill(pod, grace=0)

    # ------------------------------------------------------------------ nodes

    def _register(self, name: str) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "testbed.stator.dev/agent": "true",
                },
            },
        }
        try:
            self.api.create_node(body)
        except client.ApiException as exc:
            if exc.status != 409:
                raise
        self.node_dir(name).mkdir(parents=True, exist_ok=True)
        self._heartbeat(name)

    def _heartbeat(self, name: str) -> None:
        now = _now()
        status = {
            "status": {
                "capacity": {"cpu": self.cpu, "memory": self.memory, "pods": "110"},
                "allocatable": {"cpu": self.cpu, "memory": self.memory, "pods": "110"},
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "TestbedAgent",
                        "lastHeartbeatTime": now,
                        "lastTransitionTime": now,
                    }
                ],
                "addresses": [
                    {"type": "InternalIP", "address": "127.0.0.1"},
                    {"type": "Hostname", "address": name},
                ],
            }
        }
        self.api.patch_node_status(name, status)
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": "kube-node-lease"},
            "spec": {
                "holderIdentity": name,
                "leaseDurationSeconds": 40,
                "renewTime": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            },
        }
        try:
            self.coord.patch_namespaced_lease(name, "kube-node-lease", {"spec": lease["spec"]})
        except client.ApiException as exc:
            if exc.status != 404:
                raise
            self.coord.create_namespaced_lease("kube-node-lease", lease)

    # ------------------------------------------------------------------ pods

    def _loop(self) -> None:
        last_beat = 0.0
        while not self._stop.is_set():
            try:
                if time.monotonic() - last_beat > 10:
                    last_beat = time.monotonic()
                    for name in self.nodes:
                        if name not in self.lost:
                            self._heartbeat(name)
            except Exception:
                log.exception("node agent heartbeat failed")
            try:
                self._sync()
            except Exception:
                log.exception("node agent sync failed")
            self._stop.wait(0.3)

    def _sync(self) -> None:
        listed = self.api.list_pod_for_all_namespaces().items
        seen = set()
        for pod in listed:
            node = pod.spec.node_name
            if node not in self.nodes or node in self.lost:
                continue
            key = f"{pod.metadata.namespace}/{pod.metadata.name}"
            seen.add(key)
            running = self.pods.get(key)
            if running is not None and running.uid != pod.metadata.uid:
                self._kill(running, grace=0)  # same name, new pod
                running = None
            if pod.metadata.deletion_timestamp is not None:
                if running is not None:
                    grace = pod.spec.termination_grace_period_seconds or 10
                    self._kill(running, grace=min(grace, 30))
                self._delete(pod)
                continue
            if running is None:
                if pod.status.phase in (None, "Pending"):
                    self._start(pod)
                continue
            code = running.proc.poll()
            if code is not None and running.reported == "Running":
                self._report_exit(pod, running, code)
        for key in list(self.pods):
            if key not in seen:
                self._kill(self.pods[key], grace=0)

    def _delete(self, pod: Any) -> None:
        try:
            self.api.delete_namespaced_pod(
                pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0
            )
        except client.ApiException as exc:
            if exc.status != 404:
                raise
        self.pods.pop(f"{pod.metadata.namespace}/{pod.metadata.name}", None)

    def _kill(self, pod: PodProcess, grace: float) -> None:
        if pod.proc.poll() is None:
            try:
                os.killpg(pod.proc.pid, signal.SIGTERM if grace else signal.SIGKILL)
                pod.proc.wait(grace or 5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pod.proc.pid, signal.SIGKILL)
        self.pods.pop(pod.key, None)

    def _ip(self) -> str:
        self._next_ip += 1
        return f"127.0.{self._next_ip // 250}.{self._next_ip % 250 + 2}"

    def _env(self, pod: Any, container: Any, ip: str) -> dict[str, str]:
        ns = pod.metadata.namespace
        env: dict[str, str] = {}
        for item in container.env or []:
            if item.value is not None:
                env[item.name] = _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), item.value)
            elif item.value_from is not None:
                src = item.value_from
                if src.secret_key_ref is not None:
                    secret = self.api.read_namespaced_secret(src.secret_key_ref.name, ns)
                    env[item.name] = base64.b64decode(secret.data[src.secret_key_ref.key]).decode()
                elif src.config_map_key_ref is not None:
                    cm = self.api.read_namespaced_config_map(src.config_map_key_ref.name, ns)
                    env[item.name] = cm.data[src.config_map_key_ref.key]
                elif src.field_ref is not None:
                    path = src.field_ref.field_path
                    env[item.name] = {
                        "metadata.name": pod.metadata.name,
                        "metadata.namespace": ns,
                        "status.podIP": ip,
                        "spec.nodeName": pod.spec.node_name,
                        "metadata.uid": pod.metadata.uid,
                    }.get(path, "")
        return env

    def _volumes(self, pod: Any, container: Any, pod_dir: Path) -> dict[str, str]:
        """mountPath -> local directory, materializing ConfigMap and Secret volumes."""
        ns, node = pod.metadata.namespace, pod.spec.node_name
        local: dict[str, Path] = {}
        for vol in pod.spec.volumes or []:
            if vol.host_path is not None:
                local[vol.name] = self.node_dir(node) / "host" / vol.host_path.path.strip("/")
            elif vol.persistent_volume_claim is not None:
                local[vol.name] = (
                    self.node_dir(node) / "pvc" / ns / vol.persistent_volume_claim.claim_name
                )
            elif vol.config_map is not None:
                path = pod_dir / "volumes" / vol.name
                path.mkdir(parents=True, exist_ok=True)
                cm = self.api.read_namespaced_config_map(vol.config_map.name, ns)
                for k, v in (cm.data or {}).items():
                    (path / k).write_text(v)
                local[vol.name] = path
            elif vol.secret is not None:
                path = pod_dir / "volumes" / vol.name
                path.mkdir(parents=True, exist_ok=True)
                secret = self.api.read_namespaced_secret(vol.secret.secret_name, ns)
                for k, v in (secret.data or {}).items():
                    (path / k).write_bytes(base64.b64decode(v))
                local[vol.name] = path
            elif vol.projected is not None:
                path = pod_dir / "volumes" / vol.name
                path.mkdir(parents=True, exist_ok=True)
                for name, data in self._projected(pod, vol.projected.sources or []).items():
                    (path / name).write_bytes(data)
                local[vol.name] = path
            else:  # emptyDir and anything else: a per-pod directory
                local[vol.name] = pod_dir / "volumes" / vol.name
        mounts = {}
        for m in container.volume_mounts or []:
            path = local.get(m.name)
            if path is not None:
                path.mkdir(parents=True, exist_ok=True)
                mounts[m.mount_path.rstrip("/")] = str(path)
        return mounts

    def _projected(self, pod: Any, sources: list[Any]) -> dict[str, bytes]:
        """A projected volume's files, as the kubelet writes them: a bound service-account
        token (TokenRequest), ConfigMap and Secret keys, downward-API fields."""
        ns, files = pod.metadata.namespace, {}
        for src in sources:
            if src.service_account_token is not None:
                sat = src.service_account_token
                request = {
                    "spec": {
                        "audiences": [sat.audience] if sat.audience else None,
                        "expirationSeconds": sat.expiration_seconds or 3600,
                        "boundObjectRef": {
                            "apiVersion": "v1",
                            "kind": "Pod",
                            "name": pod.metadata.name,
                            "uid": pod.metadata.uid,
                        },
                    }
                }
                sa = pod.spec.service_account_name or "default"
                token = self.api.create_namespaced_service_account_token(sa, ns, request)
                files[sat.path] = token.status.token.encode()
            elif src.config_map is not None:
                cm = self.api.read_namespaced_config_map(src.config_map.name, ns)
                data = {k: v.encode() for k, v in (cm.data or {}).items()}
                files.update(_items(data, src.config_map.items))
            elif src.secret is not None:
                secret = self.api.read_namespaced_secret(src.secret.name, ns)
                data = {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}
                files.update(_items(data, src.secret.items))
            elif src.downward_api is not None:
                fields = {"metadata.namespace": ns, "metadata.name": pod.metadata.name}
                for item in src.downward_api.items or []:
                    if item.field_ref is not None:
                        files[item.path] = fields.get(item.field_ref.field_path, "").encode()
        return files

    def _start(self, pod: Any) -> None:
        key = f"{pod.metadata.namespace}/{pod.metadata.name}"
        container = pod.spec.containers[0]
        pod_dir = self.workdir / "pods" / pod.metadata.namespace / pod.metadata.name
        shutil.rmtree(pod_dir, ignore_errors=True)
        pod_dir.mkdir(parents=True)
        ip = self._ip()
        try:
            env = self._env(pod, container, ip)
            mounts = self._volumes(pod, container, pod_dir)
        except client.ApiException as exc:  # a missing Secret: the pod cannot start yet
            self._status(pod, "Pending", waiting=f"CreateContainerConfigError: {exc.reason}")
            return

        def rewrite(value: str) -> str:
            for mount, path in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
                if (
                    value == mount
                    or value.startswith(mount + "/")
                    or ("=" in value and value.split("=", 1)[1].startswith(mount))
                ):
                    return value.replace(mount, path, 1)
            return value

        env = {k: rewrite(v) for k, v in env.items()}
        argv = [
            _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), a)
            for a in [*(container.command or []), *(container.args or [])]
        ]
        argv = [rewrite(a) for a in argv]
        if not argv:
            self._status(pod, "Failed", exit_code=127, reason="no command in the pod spec")
            return
        if not container.command:  # the image's ENTRYPOINT, as images/runtime sets it
            argv = ["bash", str(ENTRYPOINT), *argv]
        path = os.pathsep.join(
            [*self.path_prefix, str(Path(sys.executable).parent), os.environ.get("PATH", "")]
        )
        full_env = {
            **os.environ,
            **self.extra_env,
            **env,
            "PATH": path,
            "POD_IP": ip,
            "STATOR_POD_IP": ip,
            "HOSTNAME": pod.metadata.name,
            "KUBERNETES_NODE_NAME": pod.spec.node_name,
            **self._image_env(),
        }
        log_path = pod_dir / "container.log"
        with log_path.open("ab") as out:
            try:
                proc = subprocess.Popen(
                    argv,
                    cwd=pod_dir,
                    env=full_env,
                    stdout=out,
                    stderr=out,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            except OSError as exc:  # as a kubelet reports a container that cannot start
                self._status(pod, "Failed", exit_code=128, reason=f"StartError: {exc}")
                return
        self.pods[key] = PodProcess(key, pod.metadata.uid, pod.spec.node_name, ip, proc, log_path)
        self._status(pod, "Running", ip=ip)

    def _image_env(self) -> dict[str, str]:
        """What the runtime image's environment provides, from this machine: the API server
        as a pod sees it, and the Java and Spark the entrypoint runs."""
        server = urlparse(self.api.api_client.configuration.host)
        java = Path(shutil.which("java") or "/usr/bin/java").resolve()
        return {
            "KUBERNETES_SERVICE_HOST": server.hostname or "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(server.port or 443),
            "SPARK_HOME": os.environ.get("SPARK_HOME", str(Path(pyspark.__file__).parent)),
            "JAVA_HOME": os.environ.get("JAVA_HOME") or str(java.parent.parent),
        }

    def _report_exit(self, pod: Any, running: PodProcess, code: int) -> None:
        running.reported = "Succeeded" if code == 0 else "Failed"
        self._status(pod, running.reported, ip=running.ip, exit_code=code)

    def _status(
        self,
        pod: Any,
        phase: str,
        ip: str | None = None,
        exit_code: int | None = None,
        reason: str | None = None,
        waiting: str | None = None,
    ) -> None:
        name = pod.spec.containers[0].name
        if exit_code is not None:
            state: dict[str, Any] = {
                "terminated": {
                    "exitCode": exit_code,
                    "finishedAt": _now(),
                    "reason": reason or ("Completed" if exit_code == 0 else "Error"),
                }
            }
        elif waiting is not None:
            state = {"waiting": {"reason": waiting.split(":")[0], "message": waiting}}
        else:
            state = {"running": {"startedAt": _now()}}
        ready = phase == "Running"
        body: dict[str, Any] = {
            "status": {
                "phase": phase,
                "hostIP": "127.0.0.1",
                "conditions": [
                    {"type": "Ready", "status": str(ready), "lastTransitionTime": _now()}
                ],
                "containerStatuses": [
                    {
                        "name": name,
                        "ready": ready,
                        "restartCount": 0,
                        "image": pod.spec.containers[0].image,
                        "imageID": "",
                        "state": state,
                    }
                ],
            }
        }
        if ip is not None:
            body["status"]["podIP"] = ip
            body["status"]["podIPs"] = [{"ip": ip}]
            body["status"]["startTime"] = _now()
        try:
            self.api.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace, body)
        except client.ApiException as exc:
            if exc.status != 404:
                raise

    def pod_log(self, namespace: str, name: str) -> str:
        path = self.workdir / "pods" / namespace / name / "container.log"
        return path.read_text(errors="replace") if path.exists() else ""


def _items(data: dict[str, bytes], items: list[Any] | None) -> dict[str, bytes]:
    """ConfigMap/Secret keys as files: every key, or the listed ones under their paths."""
    if not items:
        return data
    return {item.path: data[item.key] for item in items if item.key in data}
