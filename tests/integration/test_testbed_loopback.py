"""Nothing in the test bed listens anywhere but loopback."""

from __future__ import annotations

import ipaddress

import psutil

from tests.testbed.kafka import KafkaBroker
from tests.testbed.kube import KubeCluster
from tests.testbed.minio import MinioServer
from tests.testbed.procs import ManagedProcess


def _listening(proc: ManagedProcess) -> list[tuple[str, int]]:
    root = psutil.Process(proc.pid)
    found = []
    for p in [root, *root.children(recursive=True)]:
        for conn in p.net_connections(kind="inet"):
            if conn.status == psutil.CONN_LISTEN:
                found.append((conn.laddr.ip, conn.laddr.port))
    return found


def _is_loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped.is_loopback  # a JVM reports 127.0.0.1 as ::ffff:127.0.0.1
    return addr.is_loopback


def test_loopback_check_rejects_wildcards() -> None:
    assert not _is_loopback("0.0.0.0")
    assert not _is_loopback("::")
    assert not _is_loopback("::ffff:10.1.2.3")
    assert _is_loopback("::ffff:127.0.0.1")


def test_every_listener_is_on_loopback(
    kube: KubeCluster, minio: MinioServer, kafka: KafkaBroker
) -> None:
    procs = [*kube.procs.values(), minio.proc, kafka.proc]
    seen = {}
    for proc in procs:
        assert proc is not None
        sockets = _listening(proc)
        assert sockets, f"{proc.name} listens on nothing: the check would be vacuous"
        seen[proc.name] = sockets
    exposed = {
        name: [s for s in sockets if not _is_loopback(s[0])] for name, sockets in seen.items()
    }
    assert not any(exposed.values()), f"listening beyond loopback: {exposed}"
