"""Real nodes for the test bed: per node a kubelet with a containerd of its own, runc and
CNI networking, registered with the test bed's API server, running real container images.

All nodes live on this machine, in its network namespace, side by side:

- **Addresses.** Host-side addresses are /32s on ``lo`` (this kernel has no dummy links):
  ``HOST_IP`` (the API server, MinIO and anything else pods must reach binds there),
  ``DNS_IP`` (CoreDNS) and one per node (its kubelet's address and the node's InternalIP).
  Node ``i``'s pods get ``10.244.i.0/24`` on a bridge of its own (CNI ``bridge`` +
  ``host-local``, no masquerade): pods reach pods on every node and the host addresses
  through the host's routing (``ip_forward`` on). Pods reach the API server at the
  ``kubernetes`` Service's ClusterIP through one DNAT rule (there is no kube-proxy; every
  other Service Stator makes is headless, resolved by DNS).
- **DNS.** CoreDNS (built from its Go module) as a host process with its ``kubernetes``
  plugin answers ``cluster.local`` for every pod (each kubelet's ``clusterDNS``).
- **containerd.** Own root, state, socket and CNI configuration per node; CRI with runc and
  cgroupfs. The sandbox ("pause") image is built here from ``pause/pause.c`` (no registry).
  OOM score adjustments are restricted to what containerd may set: root on this machine
  lacks ``CAP_SYS_RESOURCE``.
- **kubelet.** Own root and certificate directories, a client certificate in
  ``system:nodes`` (the API server's Node authorizer), its own cgroup root
  (``/stator-<node>``) so that three kubelets on one host neither share nor garbage-collect
  each other's pod cgroups, cgroup v1 allowed, image GC off, eviction thresholds low.
  The API server reaches it for logs and exec with a client certificate of the bed's CA.
- **Loss.** ``lose(node)`` freezes the node's pods (the cgroup freezer: processes stop,
  sockets stay open, peers see no closed connection, as with a powered-off machine or a
  partition) and stops its kubelet and containerd with SIGSTOP (no heartbeats: the node
  lifecycle controller marks it unreachable). ``restore(node)`` thaws all of it, as a healed
  partition; the kubelet then reconciles its pods with the API server.
- **Local volumes** per node (``localvolumes``), in the node's own directory.
- **One bed per host.** Addresses, bridges, cgroup roots and the DNAT rule are fixed names
  in the host's namespaces, and ``stop`` removes them: a second bed would take over the
  first's rule and tear down its network. ``start`` holds ``LOCK_FILE`` (``flock``) until
  ``stop`` and refuses, before it touches anything, while another process holds it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import yaml
from kubernetes import client, config

from . import localvolumes
from .build import ensure
from .cache import cache_root
from .images import Store
from .kube import KubeCluster, write_kubeconfig
from .procs import LOOPBACK, ManagedProcess, free_port, log_tail

HOST_IP = "10.244.255.1"
DNS_IP = "10.244.255.2"
CLUSTER_DOMAIN = "cluster.local"
SERVICE_IP = "10.0.0.1"  # the `kubernetes` Service (the bed's first service address)
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
CNI_BIN = Path("/usr/lib/cni")
FREEZER = Path("/sys/fs/cgroup/freezer")
_RULE_COMMENT = "stator-testbed-realnodes"
LOCK_FILE = Path("/run/stator-testbed-realnodes.lock")
# The running bed's directory, removed by a finished ``stop``: found by ``start``, it names a
# bed whose process was killed before it could undo anything.
STATE_FILE = Path("/run/stator-testbed-realnodes.state")


def node_ip(index: int) -> str:
    return f"10.244.255.{10 + index}"


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check)


class RealNodeError(RuntimeError):
    """The real-node bed could not start; the message names the step and what it printed."""


@dataclass(frozen=True)
class NodeHandle:
    """A node's cgroup root, daemons and directory: enough to take it off the network and
    back, and to read what its containers did while it was away."""

    cgroup_root: str
    kubelet: int
    containerd: int
    root: str

    def lose(self) -> None:
        """Its pods frozen (sockets open, no answers) and its daemons stopped."""
        _freeze(self.cgroup_root, "FROZEN")
        for pid in (self.kubelet, self.containerd):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def cut_off(self) -> None:
        """A lost node's containers run on while its kubelet stays stopped: a partition from
        the control plane, not a power-off (no heartbeats, no pod status reaches the API
        server). Its containerd runs, so their logs and exit codes are kept."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.containerd, signal.SIGCONT)
        _freeze(self.cgroup_root, "THAWED")

    def restore(self) -> None:
        for pid in (self.containerd, self.kubelet):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        _freeze(self.cgroup_root, "THAWED")

    def container_exit(self, container_id: str) -> int | None:
        """The exit code containerd recorded for a container; None while it runs."""
        status = (
            Path(self.root)
            / "containerd"
            / "root"
            / "io.containerd.grpc.v1.cri"
            / "containers"
            / container_id
            / "status"
        )
        recorded = json.loads(status.read_text())
        return None if not recorded.get("FinishedAt") else int(recorded["ExitCode"])

    def container_log(self, namespace: str, pod: str, uid: str, container: str) -> str:
        """What a container wrote, as the kubelet would serve it (CRI log lines)."""
        logs = Path(self.root) / "pod-logs" / f"{namespace}_{pod}_{uid}" / container
        return "".join(p.read_text(errors="replace") for p in sorted(logs.glob("*.log")))


@dataclass
class Node:
    name: str
    index: int
    root: Path
    containerd: ManagedProcess | None = None
    kubelet: ManagedProcess | None = None

    @property
    def ip(self) -> str:
        return node_ip(self.index)

    @property
    def subnet(self) -> str:
        return f"10.244.{self.index}.0/24"

    @property
    def socket(self) -> Path:
        return self.root / "containerd.sock"

    @property
    def cgroup_root(self) -> str:
        return f"/stator-{self.name}"

    @property
    def volumes(self) -> Path:
        return self.root / "volumes"


@dataclass
class RealNodes:
    """``count`` real nodes named ``node-0..`` against ``kube`` (started with ``host=HOST_IP``)."""

    kube: KubeCluster
    workdir: Path
    count: int = 3
    nodes: dict[str, Node] = field(default_factory=dict)
    lost: set[str] = field(default_factory=set)
    coredns: ManagedProcess | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _recycler: threading.Thread | None = None
    _host: TextIO | None = None

    # ------------------------------------------------------------------ host network

    @staticmethod
    def prepare_host() -> None:
        """The host addresses, forwarding and the ClusterIP rule; before the API server
        starts (it binds ``HOST_IP``). Idempotent."""
        for ip in (HOST_IP, DNS_IP):
            _add_address(ip)
        Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")

    def _dnat_api(self, port: int) -> None:
        rule = [
            "PREROUTING",
            "-d",
            f"{SERVICE_IP}/32",
            "-p",
            "tcp",
            "--dport",
            "443",
            "-m",
            "comment",
            "--comment",
            _RULE_COMMENT,
            "-j",
            "DNAT",
            "--to-destination",
            f"{HOST_IP}:{port}",
        ]
        _remove_rules()
        _run("iptables", "-t", "nat", "-A", *rule)

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 120) -> RealNodes:
        for tool in ("containerd", "runc", "ctr", "iptables"):
            if shutil.which(tool) is None:
                raise RealNodeError(f"{tool} is not installed (apt-get install containerd runc)")
        if not (CNI_BIN / "bridge").exists():
            raise RealNodeError("CNI plugins missing (apt-get install containernetworking-plugins)")
        self._host = hold_host()
        try:  # from here on a failure undoes everything (rule, CoreDNS, nodes, the lock)
            if STATE_FILE.exists():
                reclaim(Path(STATE_FILE.read_text().strip()))
            STATE_FILE.write_text(f"{self.workdir}\n")
            self.prepare_host()
            self._dnat_api(int(self.kube.server.rsplit(":", 1)[1]))
            self.workdir.mkdir(parents=True, exist_ok=True)
            pause = self._pause_archive()
            self._start_dns()
            for i in range(self.count):
                node = Node(f"node-{i}", i, self.workdir / f"node-{i}")
                self.nodes[node.name] = node
                _add_address(node.ip)
                self._start_containerd(node)
                self.import_image(pause, [node])
                self._start_kubelet(node)
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        self._recycler = threading.Thread(target=self._recycle, daemon=True)
        self._recycler.start()
        return self

    def stop(self) -> None:
        if self._host is None:  # never started, or refused: the host's state is another bed's
            return
        self._stop.set()
        for name in list(self.lost):
            with contextlib.suppress(OSError):
                self.restore(name)
        for node in self.nodes.values():
            if node.kubelet is not None:
                node.kubelet.stop()
            self._remove_pods(node)
            if node.containerd is not None:
                node.containerd.stop()
            _clear_node(node)
        if self.coredns is not None:
            self.coredns.stop()
        _remove_rules()
        for node in self.nodes.values():
            _run("ip", "addr", "del", f"{node.ip}/32", "dev", "lo", check=False)
        STATE_FILE.unlink(missing_ok=True)
        self._host.close()  # releases the flock
        self._host = None

    def __enter__(self) -> RealNodes:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ images

    def import_image(self, archive: Path, nodes: Iterable[Node] | None = None) -> None:
        """A docker or OCI archive into each node's containerd (the CRI's namespace)."""
        for node in nodes or self.nodes.values():
            proc = _run(
                "ctr",
                "--address",
                str(node.socket),
                "--namespace",
                "k8s.io",
                "images",
                "import",
                str(archive),
                check=False,
            )
            if proc.returncode != 0:
                raise RealNodeError(f"import {archive.name} into {node.name}: {proc.stderr}")

    def _pause_archive(self) -> Path:
        """The sandbox image, built from pause/pause.c with gcc and buildah, cached."""
        source = Path(__file__).with_name("pause") / "pause.c"
        out = cache_root() / "images" / "pause"
        archive = out / "pause.tar"
        stamp = out / "pause.c"
        if archive.is_file() and stamp.is_file() and stamp.read_bytes() == source.read_bytes():
            return archive
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="stator-pause-") as tmp:
            binary = Path(tmp) / "pause"
            _checked("gcc", "-static", "-O2", "-o", str(binary), str(source))
            store = Store()
            store.from_scratch(
                "localhost/pause:local",
                ("copy", binary, "/pause"),
                ["--entrypoint", '["/pause"]'],
            )
            archive.unlink(missing_ok=True)
            store.run(
                "buildah",
                "push",
                "--quiet",
                "localhost/pause:local",
                f"docker-archive:{archive}:{PAUSE_IMAGE}",
                what="pause export",
            )
        shutil.copyfile(source, stamp)
        return archive

    # ------------------------------------------------------------------ components

    def _start_dns(self) -> None:
        corefile = self.workdir / "Corefile"
        health = free_port()
        corefile.write_text(
            f".:53 {{\n  bind {DNS_IP}\n  errors\n  health {LOOPBACK}:{health}\n"
            f"  kubernetes {CLUSTER_DOMAIN} in-addr.arpa {{\n"
            f"    kubeconfig {self.kube.kubeconfig}\n    pods insecure\n    ttl 5\n  }}\n}}\n"
        )
        binary = ensure("coredns").path("bin/coredns")
        self.coredns = ManagedProcess(
            "coredns", [str(binary), "-conf", str(corefile)], self.workdir / "coredns"
        ).start()

        def healthy() -> bool:
            with urllib.request.urlopen(f"http://{LOOPBACK}:{health}/health", timeout=2) as r:
                return bool(r.status == 200)

        self.coredns.wait_ready(healthy, 30, "healthy")

    def _start_containerd(self, node: Node) -> None:
        cni = node.root / "cni"
        cni.mkdir(parents=True, exist_ok=True)
        (cni / "10-bridge.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "0.4.0",
                    "name": f"stator-{node.name}",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": f"stator-cni{node.index}",
                            "isGateway": True,
                            "ipMasq": False,
                            "hairpinMode": True,
                            "ipam": {
                                "type": "host-local",
                                "ranges": [[{"subnet": node.subnet}]],
                                "routes": [{"dst": "0.0.0.0/0"}],
                                "dataDir": str(node.root / "cni-ipam"),
                            },
                        },
                        {"type": "portmap", "capabilities": {"portMappings": True}},
                    ],
                },
                indent=2,
            )
        )
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        conf = node.root / "containerd.toml"
        conf.write_text(
            f"""version = 2
root = "{node.root / "containerd" / "root"}"
state = "{node.root / "containerd" / "state"}"
[grpc]
  address = "{node.socket}"
[ttrpc]
  address = "{node.root / "containerd.ttrpc.sock"}"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{node.root / "containerd" / "opt"}"
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  disable_apparmor = true
  restrict_oom_score_adj = true
  stream_server_address = "{LOOPBACK}"
  stream_server_port = "0"
  enable_selinux = false
  disable_hugetlb_controller = true
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
[{cri}.cni]
  bin_dir = "{CNI_BIN}"
  conf_dir = "{cni}"
"""
        )
        node.containerd = ManagedProcess(
            "containerd", ["containerd", "--config", str(conf)], node.root
        ).start()
        node.containerd.wait_ready(lambda: node.socket.exists() and _ctr_ok(node), 60, "serving")

    def _start_kubelet(self, node: Node) -> None:
        assert self.kube.ca is not None and self.kube.authority is not None
        cert = self.kube.authority.issue(
            f"kubelet-{node.name}", f"system:node:{node.name}", org="system:nodes"
        )
        kubeconfig = write_kubeconfig(
            node.root / "kubeconfig", self.kube.server, self.kube.ca.cert, cert, node.name
        )
        resolv = node.root / "resolv.conf"
        resolv.write_text(f"nameserver {DNS_IP}\n")
        node.volumes.mkdir(parents=True, exist_ok=True)
        _make_cgroups(node.cgroup_root)
        healthz = free_port()
        kubelet_config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": node.ip,
            "port": 10250,
            "readOnlyPort": 0,
            "healthzBindAddress": LOOPBACK,
            "healthzPort": healthz,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(self.kube.ca.cert)},
            },
            "authorization": {"mode": "AlwaysAllow"},  # callers were authenticated by the CA
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": node.cgroup_root,
            "cgroupsPerQOS": True,
            "failSwapOn": False,
            "failCgroupV1": False,
            "clusterDNS": [DNS_IP],
            "clusterDomain": CLUSTER_DOMAIN,
            "resolvConf": str(resolv),
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "containerRuntimeEndpoint": f"unix://{node.socket}",
            # Not the shared /var/log/pods: each kubelet removes the log directories of pods
            # it does not run, so three kubelets there delete each other's pods' logs.
            "podLogsDir": str(node.root / "pod-logs"),
            "nodeStatusUpdateFrequency": "4s",
            # Renewed every quarter of it: 5 s, as the node agent does (the kubelet's default
            # 40 s renews every 10 s), against the controller-manager's 20 s grace period.
            "nodeLeaseDurationSeconds": 20,
            "nodeStatusReportFrequency": "10s",
            "serializeImagePulls": False,
            "maxPods": 60,
            "podPidsLimit": -1,
            "localStorageCapacityIsolation": False,
            "makeIPTablesUtilChains": False,
            "enforceNodeAllocatable": ["pods"],
        }
        conf = node.root / "kubelet.yaml"
        conf.write_text(yaml.safe_dump(kubelet_config))
        binary = ensure("kubelet").path("bin/kubelet")
        node.kubelet = ManagedProcess(
            "kubelet",
            [
                str(binary),
                f"--config={conf}",
                f"--kubeconfig={kubeconfig}",
                f"--hostname-override={node.name}",
                f"--node-ip={node.ip}",
                f"--root-dir={node.root / 'kubelet'}",
                f"--cert-dir={node.root / 'kubelet-pki'}",
                "--v=1",
            ],
            node.root,
        ).start()

    def _wait_ready(self, timeout: float) -> None:
        api = self._api()
        deadline = time.monotonic() + timeout
        pending = set(self.nodes)
        while pending and time.monotonic() < deadline:
            for node in list(pending):
                proc = self.nodes[node].kubelet
                if proc is not None and not proc.alive():
                    raise RealNodeError(f"{node}: kubelet exited:\n{log_tail(proc.log, 40)}")
                with contextlib.suppress(client.ApiException):
                    got = api.read_node(node)
                    ready = [c for c in got.status.conditions or [] if c.type == "Ready"]
                    if ready and ready[0].status == "True":
                        pending.discard(node)
            time.sleep(0.5)
        if pending:
            logs = "\n".join(
                f"--- {n}:\n{log_tail(self.nodes[n].root / 'kubelet.log', 40)}"
                for n in sorted(pending)
            )
            raise RealNodeError(f"nodes not Ready in {timeout:.0f}s: {sorted(pending)}\n{logs}")

    def _api(self) -> client.CoreV1Api:
        return client.CoreV1Api(config.new_client_from_config(str(self.kube.kubeconfig)))

    # ------------------------------------------------------------------ local volumes

    def provide_local_volumes(
        self, storage_class: str, per_node: int, capacity: str = "20Gi"
    ) -> None:
        api_client = config.new_client_from_config(str(self.kube.kubeconfig))

        def path_of(node: str, i: int) -> str:
            path = self.nodes[node].volumes / storage_class / str(i)
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(0o777)  # pods run as non-root users; the claim is theirs alone
            return str(path)

        localvolumes.provide(
            client.CoreV1Api(api_client),
            client.StorageV1Api(api_client),
            storage_class,
            self.nodes,
            per_node,
            path_of,
            capacity,
        )

    def _recycle(self) -> None:
        api = self._api()
        while not self._stop.wait(2):
            with contextlib.suppress(Exception):
                localvolumes.recycle_released(
                    api, lambda _node, path: Path(path), self.nodes, self.lost
                )

    # ------------------------------------------------------------------ loss

    def handles(self) -> dict[str, NodeHandle]:
        """What another process needs to lose and restore these nodes (the e2e suite runs
        in its own process: tests/e2e/real_nodes.py passes this to it as a file)."""
        return {
            name: NodeHandle(
                node.cgroup_root,
                node.kubelet.pid if node.kubelet else 0,
                node.containerd.pid if node.containerd else 0,
                str(node.root),
            )
            for name, node in self.nodes.items()
        }

    def lose(self, name: str) -> None:
        self.lost.add(name)
        self.handles()[name].lose()

    def restore(self, name: str) -> None:
        self.handles()[name].restore()
        self.lost.discard(name)

    def _remove_pods(self, node: Node) -> None:
        """Every container and sandbox of the node, stopped and removed through its CRI."""
        if node.containerd is None or not node.containerd.alive():
            return
        ns = ["ctr", "--address", str(node.socket), "--namespace", "k8s.io"]
        listed = _run(*ns, "tasks", "ls", "-q", check=False).stdout.split()
        for task in listed:
            _run(*ns, "tasks", "kill", "-s", "SIGKILL", task, check=False)
        for task in listed:
            _run(*ns, "tasks", "delete", "-f", task, check=False)
        for container in _run(*ns, "containers", "ls", "-q", check=False).stdout.split():
            _run(*ns, "containers", "delete", container, check=False)


# ---------------------------------------------------------------------------- helpers


def hold_host() -> TextIO:
    """``LOCK_FILE`` locked for this process (its pid written in it); fails at once, naming
    the holder, if another bed runs on this host. Closing the file releases it."""
    lock = LOCK_FILE.open("a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "unknown"
        lock.close()
        raise RealNodeError(
            f"another real-node bed runs on this host (pid {holder}, lock {LOCK_FILE}); "
            "its addresses, bridges, cgroups and DNAT rule have fixed names: wait for it to stop"
        ) from None
    lock.truncate(0)
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    return lock


def _checked(*argv: str) -> str:
    proc = _run(*argv, check=False)
    if proc.returncode != 0:
        raise RealNodeError(f"{' '.join(argv)} failed:\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def _add_address(ip: str) -> None:
    shown = _run("ip", "-o", "addr", "show", "dev", "lo").stdout
    if f" {ip}/32 " not in shown:
        _checked("ip", "addr", "add", f"{ip}/32", "dev", "lo")


def _remove_rules() -> None:
    rules = _run("iptables", "-t", "nat", "-S", "PREROUTING", check=False).stdout.splitlines()
    for rule in rules:
        if _RULE_COMMENT in rule and rule.startswith("-A "):
            _run("iptables", "-t", "nat", "-D", *shlex.split(rule[3:]), check=False)


def _ctr_ok(node: Node) -> bool:
    return _run("ctr", "--address", str(node.socket), "version", check=False).returncode == 0


def _freeze(cgroup_root: str, state: str) -> None:
    path = FREEZER / cgroup_root.strip("/") / "freezer.state"
    if path.exists():
        path.write_text(state)


def _cgroup_dirs(cgroup_root: str) -> Iterator[Path]:
    for controller in Path("/sys/fs/cgroup").iterdir():
        path = controller / cgroup_root.strip("/")
        if path.is_dir():
            yield path


def reclaim(workdir: Path) -> None:
    """Undo a bed whose process was killed (SIGKILL: no ``stop`` ran): its daemons, CoreDNS
    and shims (every process naming its directory), its containers, mounts, cgroups, bridges
    and the DNAT rule. The next bed's ``start`` calls this, holding the lock."""
    mine = os.getpid()
    for proc_dir in Path("/proc").iterdir():
        if not proc_dir.name.isdigit() or int(proc_dir.name) == mine:
            continue
        with contextlib.suppress(OSError):
            if str(workdir).encode() in (proc_dir / "cmdline").read_bytes():
                os.kill(int(proc_dir.name), signal.SIGKILL)
    for path in sorted(workdir.glob("node-*")):
        _clear_node(Node(path.name, int(path.name.removeprefix("node-")), path))
    _remove_rules()


def _clear_node(node: Node) -> None:
    """What a node leaves once its daemons are gone, or were killed with the bed: processes
    in its cgroups and its shims, mounts under its directory, its cgroups, its bridge."""
    _kill_leftovers(node)
    _unmount_under(node.root)
    _remove_cgroups(node.cgroup_root)
    _run("ip", "link", "del", f"stator-cni{node.index}", check=False)


def _kill_leftovers(node: Node) -> None:
    """Whatever outlived the node's daemons: its containers' processes (every task in its
    cgroups, thawed first) and its runc shims (named by its containerd's socket)."""
    _freeze(node.cgroup_root, "THAWED")
    for top in _cgroup_dirs(node.cgroup_root):
        for tasks in top.rglob("tasks"):
            for pid in tasks.read_text().split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
    for proc_dir in Path("/proc").iterdir():
        if not proc_dir.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (proc_dir / "cmdline").read_bytes().split(b"\0")
            if b"containerd-shim" in argv[0] and str(node.socket).encode() in argv:
                os.kill(int(proc_dir.name), signal.SIGKILL)
    time.sleep(0.5)


def _make_cgroups(cgroup_root: str) -> None:
    """The node's cgroup root in every mounted controller (the kubelet requires it); a new
    cpuset gets its parent's CPUs and memory nodes, as a cpuset must have some."""
    for controller in Path("/sys/fs/cgroup").iterdir():
        if not (controller / "cgroup.procs").exists():
            continue
        path = controller / cgroup_root.strip("/")
        path.mkdir(exist_ok=True)
        for name in ("cpuset.cpus", "cpuset.mems"):
            if (path / name).exists() and not (path / name).read_text().strip():
                (path / name).write_text((controller / name).read_text())


def _remove_cgroups(cgroup_root: str) -> None:
    """Remove the node's cgroups, deepest first (a cgroup with tasks left stays)."""
    for top in _cgroup_dirs(cgroup_root):
        for path in sorted((p for p in top.rglob("*") if p.is_dir()), reverse=True):
            with contextlib.suppress(OSError):
                path.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


def _unmount_under(root: Path) -> None:
    """Unmount what the kubelet and containerd mounted below ``root`` (deepest first)."""
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    targets = [m.split()[1] for m in mounts if m.split()[1].startswith(str(root))]
    for target in sorted(targets, key=len, reverse=True):
        _run("umount", "-l", target, check=False)
