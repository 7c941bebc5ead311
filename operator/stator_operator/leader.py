"""Leader election between operator replicas: one Lease in the operator's namespace, and only
its holder reconciles.

As controller-runtime does it: a replica acquires the Lease before it starts handling
pipelines, renews it every ``renew_s``, and ends its process as soon as it cannot be sure it
still holds it (a replica that may have lost the Lease must not act; Kubernetes restarts it
as a standby). A standby takes over when the holder has not renewed for ``duration_s``,
measured on the standby's own clock from when it last saw the Lease change (no clock skew
between replicas matters). A replica that stops cleanly releases the Lease, so a standby takes
over at once.

Acquiring, each attempt an update conditional on the Lease's resourceVersion (two standbys
never both win: the second update is refused with 409):

1. No Lease: create it, held by us.
2. Held by nobody (released), or its holder has not renewed within its duration: take it
   over (``leaseTransitions`` + 1).
3. Otherwise wait ``retry_s`` and look again.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

log = logging.getLogger("stator.operator.leader")


def _micro_time() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class LeaderElector:
    namespace: str
    name: str = "stator-operator-leader"
    identity: str = field(
        default_factory=lambda: f"{os.environ.get('HOSTNAME', 'operator')}-{uuid.uuid4().hex[:6]}"
    )
    duration_s: int = 15
    renew_s: float = 5.0
    retry_s: float = 2.0
    api: Any = None

    def __post_init__(self) -> None:
        self.api = self.api or client.CoordinationV1Api()
        self._seen: tuple[str | None, str | None] | None = None  # (holder, renewTime)
        self._seen_at = 0.0
        self._stop = threading.Event()
        self._renewed_at = 0.0

    # ------------------------------------------------------------------ acquiring

    def acquire(self) -> None:
        """Block until this replica holds the Lease (steps 1-3)."""
        log.info("waiting to lead as %s (lease %s/%s)", self.identity, self.namespace, self.name)
        while not self._try_acquire():
            time.sleep(self.retry_s)
        log.info("leading as %s", self.identity)

    def _try_acquire(self) -> bool:
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                log.warning("reading the leader lease failed: %s", exc.reason)
                return False
            return self._create()
        spec = lease.spec
        holder = spec.holder_identity
        renewed = spec.renew_time.isoformat() if spec.renew_time else None
        now = time.monotonic()
        if self._seen != (holder, renewed):  # the holder renewed (or changed) since we looked
            self._seen, self._seen_at = (holder, renewed), now
        duration = spec.lease_duration_seconds or self.duration_s
        if holder and holder != self.identity and now - self._seen_at < duration:
            return False
        transitions = (spec.lease_transitions or 0) + (1 if holder != self.identity else 0)
        body = {
            "metadata": {"resourceVersion": lease.metadata.resource_version},
            "spec": self._spec(transitions, acquired=holder != self.identity),
        }
        try:
            self.api.patch_namespaced_lease(self.name, self.namespace, body)
        except ApiException as exc:
            if exc.status == 409:  # another standby won
                return False
            raise
        self._renewed_at = time.monotonic()
        return True

    def _create(self) -> bool:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": self._spec(0, acquired=True),
        }
        try:
            self.api.create_namespaced_lease(self.namespace, body)
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        self._renewed_at = time.monotonic()
        return True

    def _spec(self, transitions: int, acquired: bool) -> dict[str, Any]:
        stamp = _micro_time()
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.duration_s,
            "renewTime": stamp,
            "leaseTransitions": transitions,
        }
        if acquired:
            spec["acquireTime"] = stamp
        return spec

    # ------------------------------------------------------------------ holding

    def keep_renewing(self, on_lost: Callable[[str], None]) -> threading.Thread:
        """Renew every ``renew_s`` in a thread; ``on_lost(reason)`` when the Lease is held
        by another, or could not be renewed for ``duration_s`` minus one renewal period."""
        thread = threading.Thread(target=self._renew_loop, args=(on_lost,), daemon=True)
        thread.start()
        return thread

    def _renew_loop(self, on_lost: Callable[[str], None]) -> None:
        while not self._stop.wait(self.renew_s):
            try:
                lease = self.api.read_namespaced_lease(self.name, self.namespace)
                if lease.spec.holder_identity != self.identity:
                    on_lost(f"the lease is held by {lease.spec.holder_identity}")
                    return
                body = {
                    "metadata": {"resourceVersion": lease.metadata.resource_version},
                    "spec": {"renewTime": _micro_time()},
                }
                self.api.patch_namespaced_lease(self.name, self.namespace, body)
                self._renewed_at = time.monotonic()
            except Exception as exc:  # the API server may be briefly away: retry in time
                if time.monotonic() - self._renewed_at > self.duration_s - self.renew_s:
                    on_lost(f"could not renew the lease: {exc}")
                    return
                log.warning("renewing the leader lease failed, retrying: %s", exc)

    def release(self) -> None:
        """Stop renewing and give the Lease up, so that a standby takes over at once."""
        self._stop.set()
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
            if lease.spec.holder_identity == self.identity:
                body = {
                    "metadata": {"resourceVersion": lease.metadata.resource_version},
                    "spec": {"holderIdentity": None},
                }
                self.api.patch_namespaced_lease(self.name, self.namespace, body)
        except ApiException as exc:
            log.warning("releasing the leader lease failed: %s", exc.reason)
