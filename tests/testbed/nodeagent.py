"""A node agent: fake Nodes whose pods run as local processes (the test bed has no kubelet).

It registers Node objects with capacity and a Ready condition and keeps their leases fresh,
lets the real scheduler bind pods, and runs each bound pod's first container as a process:
its command and args with ``$(VAR)`` expanded (without a command, through the runtime image's
entrypoint, images/runtime/entrypoint.sh, with the local Java and PySpark as ``JAVA_HOME`` and
``SPARK_HOME``: so a Spark executor pod, which has only ``args: [executor]``, starts a real
executor), its env (values, Secret and ConfigMap keys, pod fields) plus
``KUBERNETES_SERVICE_HOST/PORT``, volumes mapped to per-node (hostPath, PVC) or per-pod
(emptyDir, ConfigMap, Secret, projected service-account token/CA/namespace) directories,
bound at their mount paths in a mount namespace of the pod's own (as root, with ``unshare``;
``/tmp`` stays the machine's), else with mount paths rewritten to them in the command and env.
Every pod gets its own loopback address as pod IP. Phases and
exit codes are reported in the pod status; a pod whose process cannot start is ``Failed`` with
the reason (the agent goes on with the other pods); deleted pods are stopped with SIGTERM and
then SIGKILL.

Like a kubelet it restarts the container of a ``restartPolicy: Always`` (or ``OnFailure``)
pod in place: same pod, IP and emptyDir volumes, ``restartCount`` up, the first restart at
once and later ones after a back-off of 10 s doubling to 5 min. Like the local static
provisioner it offers local PersistentVolumes (``provide_local_volumes``: a StorageClass with
``WaitForFirstConsumer`` binding and PVs with node affinity, so the real scheduler pins a pod
to the node of its claim's volume), whose directories live in the node's directory, and makes
a released one available again, wiped.

A lost node (``lose_node``) freezes its processes (SIGSTOP: peers see no closed connection, as
with a powered-off machine or a partition) and stops renewing its lease, so the real node
lifecycle controller marks it unreachable and taints it. ``restore_node`` brings it back: its
frozen processes are gone (as after a reboot), its heartbeats resume, pods still bound to it
restart or fail by their restart policy, and its directories are still there.
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

from . import localvolumes

log = logging.getLogger("testbed.nodeagent")
ENTRYPOINT = Path(__file__).resolve().parents[2] / "images" / "runtime" / "entrypoint.sh"
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


BACKOFF_S, MAX_BACKOFF_S, BACKOFF_RESET_S = 10.0, 300.0, 600.0  # the kubelet's


@dataclass
class PodProcess:
    key: str  # namespace/name
    uid: str
    node: str
    ip: str
    proc: subprocess.Popen[bytes]
    log: Path
    reported: str = "Running"
    restarts: int = 0
    started: float = field(default_factory=time.monotonic)
    restart_at: float | None = None  # waiting out a back-off
    last_exit: int | None = None


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
        self.storage = client.StorageV1Api(self.api.api_client)
        self.pods: dict[str, PodProcess] = {}
        self.lost: set[str] = set()
        self._recycled_at = 0.0
        # Each pod in a mount namespace of its own, its volumes bound at their mount paths,
        # where the machine allows it (root, unshare); else paths are rewritten.
        self._private_mounts = _can_mount_privately()
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
        """The node vanishes: its processes freeze (no connection is closed, as with a
        powered-off machine) and it stops heartbeating."""
        with self._lock:
            self.lost.add(node)
            for pod in [p for p in self.pods.values() if p.node == node]:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pod.proc.pid, signal.SIGSTOP)

    def thaw_node(self, node: str) -> dict[str, Any]:
        """The lost node's processes run on, still cut off from the control plane (a
        partition, not a power-off): no heartbeats, its pods' changes unseen. Returns its
        processes by pod key (namespace/name)."""
        with self._lock:
            procs = {p.key: p.proc for p in self.pods.values() if p.node == node}
            for proc in procs.values():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGCONT)
        return procs

    def restore_node(self, node: str) -> None:
        """The node comes back, as after a reboot: its old processes are gone, its directory
        is still there, and pods still bound to it restart or fail by their restart policy."""
        with self._lock:
            for pod in [p for p in self.pods.values() if p.node == node]:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pod.proc.pid, signal.SIGKILL)
                pod.proc.wait()
                self.pods.pop(pod.key, None)
            self.lost.discard(node)
            self._heartbeat(node)

    def provide_local_volumes(
        self, storage_class: str, per_node: int, capacity: str = "20Gi"
    ) -> None:
        """A StorageClass of local volumes and ``per_node`` PersistentVolumes on each node
        (tests/testbed/localvolumes.py), at the same path on every node."""
        localvolumes.provide(
            self.api,
            self.storage,
            storage_class,
            self.nodes,
            per_node,
            lambda _node, i: f"/mnt/{storage_class}/{i}",
            capacity,
        )

    def _recycle_volumes(self) -> None:
        """Released local volumes are wiped and offered again (the static provisioner's
        job); a volume on a lost node waits for it."""
        if time.monotonic() - self._recycled_at < 2:
            return
        self._recycled_at = time.monotonic()
        localvolumes.recycle_released(self.api, self._local_path, self.nodes, self.lost)

    def _local_path(self, node: str, path: str) -> Path:
        return self.node_dir(node) / "local" / path.strip("/")

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
                if time.monotonic() - last_beat > 5:
                    last_beat = time.monotonic()
                    for name in self.nodes:
                        if name not in self.lost:
                            self._heartbeat(name)
            except Exception:
                log.exception("node agent heartbeat failed")
            try:
                with self._lock:
                    self._sync()
                self._recycle_volumes()
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
            self._sync_pod(pod, self.pods.get(key))
        for key in list(self.pods):
            if key not in seen and self.pods[key].node not in self.lost:
                self._kill(self.pods[key], grace=0)

    def _sync_pod(self, pod: Any, running: PodProcess | None) -> None:
        if running is not None and running.uid != pod.metadata.uid:
            self._kill(running, grace=0)  # same name, new pod
            running = None
        if pod.metadata.deletion_timestamp is not None:
            if running is not None:
                grace = pod.spec.termination_grace_period_seconds or 10
                self._kill(running, grace=min(grace, 30))
            self._delete(pod)
        elif running is None:
            if pod.status.phase in (None, "Pending"):
                self._start(pod)
            elif pod.status.phase == "Running":  # its process is gone (a node reboot)
                self._lost_process(pod)
        elif (code := running.proc.poll()) is not None:
            if _restarts(pod, code):
                self._restart(pod, running, code)
            elif running.reported == "Running":
                self._report_exit(pod, running, code)

    def _restart(self, pod: Any, running: PodProcess, code: int) -> None:
        """Restart a container in place, after the kubelet's back-off (none the first time,
        then 10 s doubling; a container that ran 10 minutes starts over)."""
        now = time.monotonic()
        if running.restart_at is None:
            ran = now - running.started
            if ran > BACKOFF_RESET_S:
                running.restarts = 0
            delay = 0.0 if running.restarts == 0 else BACKOFF_S * 2 ** (running.restarts - 1)
            running.restart_at = now + min(delay, MAX_BACKOFF_S)
            running.last_exit = code
            self._status(pod, "Running", ip=running.ip, restarts=running, waiting="Error")
        if now < running.restart_at:
            return
        self._start(pod, previous=running)

    def _lost_process(self, pod: Any) -> None:
        if pod.spec.restart_policy in ("Always", "OnFailure"):
            self._start(pod)
        else:
            self._status(pod, "Failed", exit_code=137, reason="the node restarted")

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
        if pod.node in self.lost:  # frozen: SIGTERM would wait for a SIGCONT
            grace = 0
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
                local[vol.name] = self._claim_path(ns, node, vol.persistent_volume_claim)
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

    def _claim_path(self, ns: str, node: str, source: Any) -> Path:
        """A claim bound to a local volume: that volume's directory on this node (the
        scheduler put the pod here for it); any other claim: a per-node directory."""
        claim = self.api.read_namespaced_persistent_volume_claim(source.claim_name, ns)
        if claim.spec.volume_name:
            pv = self.api.read_persistent_volume(claim.spec.volume_name)
            if pv.spec.local is not None:
                if localvolumes.volume_node(pv) != node:
                    raise client.ApiException(reason=f"volume {pv.metadata.name} is not on {node}")
                return self._local_path(node, str(pv.spec.local.path))
        return self.node_dir(node) / "pvc" / ns / str(source.claim_name)

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

    def _start(self, pod: Any, previous: PodProcess | None = None) -> None:
        """Start the pod's container; ``previous``: restart it in place (same IP, volumes)."""
        key = f"{pod.metadata.namespace}/{pod.metadata.name}"
        container = pod.spec.containers[0]
        pod_dir = self.workdir / "pods" / pod.metadata.namespace / pod.metadata.name
        if previous is None:
            shutil.rmtree(pod_dir, ignore_errors=True)
        pod_dir.mkdir(parents=True, exist_ok=True)
        ip = previous.ip if previous is not None else self._ip()
        try:
            env = self._env(pod, container, ip)
            mounts = self._volumes(pod, container, pod_dir)
        except client.ApiException as exc:  # a missing Secret: the pod cannot start yet
            self._status(pod, "Pending", waiting=f"CreateContainerConfigError: {exc.reason}")
            return

        private = self._private_mounts
        if private:  # the pod sees its volumes at their mount paths (except /tmp: the host's)
            bind = {m: p for m, p in mounts.items() if not _under(m, "/tmp")}
            mounts = {m: p for m, p in mounts.items() if m not in bind}

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
        if shutil.which(argv[0], path=path) is None:  # as a kubelet reports it
            reason = f"StartError: exec: {argv[0]}: no such file or directory"
            self._status(pod, "Failed", exit_code=128, reason=reason)
            return
        if private:
            argv = _in_mount_namespace(bind, argv)
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
        started = PodProcess(key, pod.metadata.uid, pod.spec.node_name, ip, proc, log_path)
        if previous is not None:
            started.restarts, started.last_exit = previous.restarts + 1, previous.last_exit
        self.pods[key] = started
        self._status(pod, "Running", ip=ip, restarts=started)

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
        restarts: PodProcess | None = None,
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
        ready = phase == "Running" and waiting is None
        container_status: dict[str, Any] = {
            "name": name,
            "ready": ready,
            "restartCount": restarts.restarts if restarts is not None else 0,
            "image": pod.spec.containers[0].image,
            "imageID": "",
            "state": state,
        }
        if restarts is not None and restarts.last_exit is not None:
            container_status["lastState"] = {
                "terminated": {"exitCode": restarts.last_exit, "reason": "Error"}
            }
        body: dict[str, Any] = {
            "status": {
                "phase": phase,
                "hostIP": "127.0.0.1",
                "conditions": [
                    {"type": "Ready", "status": str(ready), "lastTransitionTime": _now()}
                ],
                "containerStatuses": [container_status],
            }
        }
        if ip is not None:
            body["status"]["podIP"] = ip
            body["status"]["podIPs"] = [{"ip": ip}]
            if restarts is None or restarts.restarts == 0:
                body["status"]["startTime"] = _now()
        try:
            self.api.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace, body)
        except client.ApiException as exc:
            if exc.status != 404:
                raise

    def pod_log(self, namespace: str, name: str) -> str:
        path = self.workdir / "pods" / namespace / name / "container.log"
        return path.read_text(errors="replace") if path.exists() else ""


# Bind each volume at its mount path inside the pod's own mount namespace, then run the
# container's command: arguments, never a shell string built from them.
_MOUNT_SCRIPT = (
    'while [ "$1" != "--" ]; do mkdir -p "$1" && mount --bind "$2" "$1" || exit 125; '
    'shift 2; done; shift; exec "$@"'
)


def _in_mount_namespace(bind: dict[str, str], argv: list[str]) -> list[str]:
    pairs = [x for mount, path in sorted(bind.items()) for x in (mount, path)]
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        "sh",
        "-c",
        _MOUNT_SCRIPT,
        "mounts",
        *pairs,
        "--",
        *argv,
    ]


def _can_mount_privately() -> bool:
    """Whether this process may give a child its own mount namespace with bind mounts."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--", "mount", "--bind", "/", "/"],
        capture_output=True,
        check=False,
    )
    return probe.returncode == 0


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _restarts(pod: Any, code: int) -> bool:
    policy = pod.spec.restart_policy or "Always"
    return policy == "Always" or (policy == "OnFailure" and code != 0)


def _items(data: dict[str, bytes], items: list[Any] | None) -> dict[str, bytes]:
    """ConfigMap/Secret keys as files: every key, or the listed ones under their paths."""
    if not items:
        return data
    return {item.path: data[item.key] for item in items if item.key in data}
