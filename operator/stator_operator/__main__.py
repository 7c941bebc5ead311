"""``python -m stator_operator``: run the operator (in a cluster or against a kubeconfig).

Environment: STATOR_WATCH_NAMESPACES (comma-separated; empty: all namespaces),
STATOR_OPERATOR_HEALTH (liveness endpoint, default http://0.0.0.0:8080/healthz),
STATOR_OPERATOR_NAMESPACE (the operator's own namespace: its drivers' NetworkPolicies admit
it, and its replicas elect a leader there with a Lease, stator.ha.lease),
STATOR_LEADER_LEASE_SECONDS (15: how long a standby waits for a leader that stopped
renewing), STATOR_REQUIRE_RESTRICTED (true: pipelines only in namespaces whose Pod Security
admission enforces the restricted level), STATOR_LOG_LEVEL (INFO).

With several replicas only the leader handles pipelines; the others wait for its Lease,
answering the liveness endpoint meanwhile.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

import kopf
from kubernetes import config

from stator.ha.lease import LeaseHolder

log = logging.getLogger("stator.operator")
DEFAULT_HEALTH = "http://0.0.0.0:8080/healthz"
LEADER_LEASE = (
    "stator-operator-leader"  # in the operator's namespace (charts: leader-election.yaml)
)


def main() -> None:
    logging.basicConfig(
        level=os.environ.get("STATOR_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    from . import handlers  # noqa: F401, PLC0415 - registers the handlers

    health = os.environ.get("STATOR_OPERATOR_HEALTH", DEFAULT_HEALTH)
    namespaces = [n for n in os.environ.get("STATOR_WATCH_NAMESPACES", "").split(",") if n]
    own = os.environ.get("STATOR_OPERATOR_NAMESPACE")
    lease_s = int(os.environ.get("STATOR_LEADER_LEASE_SECONDS", "15"))
    elector = (
        LeaseHolder(own, LEADER_LEASE, duration_s=lease_s, renew_s=lease_s / 3) if own else None
    )
    if elector is not None:
        with _standby_health(health):
            elector.acquire()
        elector.keep_renewing(_lost)
    else:
        log.warning("STATOR_OPERATOR_NAMESPACE is not set: no leader election (run one replica)")
    try:
        kopf.run(
            standalone=True,
            clusterwide=not namespaces,
            namespaces=namespaces,
            liveness_endpoint=health,
        )
    finally:
        if elector is not None:
            elector.release()


def _lost(reason: str) -> None:
    """This replica may no longer lead: stop at once (Kubernetes restarts it as a standby)."""
    log.error("lost the leader lease (%s); exiting", reason)
    os._exit(1)


@contextlib.contextmanager
def _standby_health(url: str) -> Iterator[None]:
    """Answer the liveness endpoint while waiting to lead (kopf serves it once leading)."""
    parsed = urlparse(url)

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = self.path.split("?")[0] == parsed.path
            self.send_response(200 if ok else 404)
            self.end_headers()
            self.wfile.write(b"standby\n" if ok else b"")

        def log_message(self, *_: object) -> None:
            return

    server = ThreadingHTTPServer((parsed.hostname or "0.0.0.0", parsed.port or 80), Health)  # noqa: S104
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


if __name__ == "__main__":
    main()
