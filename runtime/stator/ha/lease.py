"""One holder at a time, by a Kubernetes Lease: the operator's replicas elect a leader with it,
and a pipeline's driver holds one so that a replacement driver never writes beside it.

As controller-runtime does it: a holder acquires the Lease, renews it every ``renew_s``, and
must not act once it cannot be sure it still holds it. A contender takes over when the holder
has not renewed for ``duration_s``, measured on the contender's own clock from when it last
saw the Lease change (no clock skew between machines matters, only their rates). A holder that
stops cleanly releases the Lease, so a contender takes over at once.

Acquiring, each attempt an update conditional on the Lease's resourceVersion (two contenders
never both win: the second update is refused with 409):

1. No Lease: create it, held by us.
2. Held by nobody (released), or its holder has not renewed within its duration: take it
   over (``leaseTransitions`` + 1). Taking over from a holder that did not release it
   (``took_over``) means that holder may still be running somewhere (a partitioned node);
   so does a Lease someone else released for its holder (annotation ``RELEASED_FOR``: the
   operator, once that holder's pod is gone).
3. Otherwise wait ``retry_s`` and look again.

Holding: the holder counts itself valid until ``duration_s - renew_s`` after it *sent* its last
successful renewal (the contender's clock starts no earlier than the write, so the holder stops
first). Each renewal is conditional on the resourceVersion it read with itself as holder, so
a holder whose renewals failed for a while (an API server outage) is valid again after one
that succeeds, and learns that it lost the Lease if anyone else took it meanwhile.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError

log = logging.getLogger("stator.lease")
# Set by whoever releases a Lease on behalf of its holder (to the holder's identity): the
# next holder knows it took over from one that did not release it itself.
RELEASED_FOR = "stator.dev/released-for"


def micro_time() -> str:
    """A Lease's MicroTime, now."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Silence:
    """How long a Lease's (holder, renewTime) has not changed, on this process's clock: how
    a contender, or the operator, measures a holder's silence (no other machine's clock
    enters, only the rates of both)."""

    def __init__(self) -> None:
        self._seen: tuple[object, object] | None = None
        self._since = 0.0

    def observe(self, holder: object, renewed: object, now: float) -> float:
        """Seconds since (holder, renewed) was first seen as it is now."""
        if self._seen != (holder, renewed):
            self._seen, self._since = (holder, renewed), now
        return now - self._since


@dataclass
class LeaseHolder:
    namespace: str
    name: str
    identity: str = field(
        default_factory=lambda: f"{os.environ.get('HOSTNAME', 'stator')}-{uuid.uuid4().hex[:6]}"
    )
    duration_s: float = 15
    renew_s: float = 5.0
    retry_s: float = 2.0
    api: Any = None
    create: bool = True  # False: the Lease must exist (a holder that may only update it)
    # True (the operator): a holder that could not renew in time gives up. False (a driver):
    # it stays, not valid, until a renewal succeeds again or shows the Lease taken.
    give_up_unrenewed: bool = True

    def __post_init__(self) -> None:
        if self.renew_s >= self.duration_s:
            raise ValueError(
                f"lease renewal every {self.renew_s}s must be shorter than its duration "
                f"{self.duration_s}s"
            )
        self.api = self.api or client.CoordinationV1Api()
        self._silence = Silence()
        self._stop = threading.Event()
        self._renewed_at: float | None = None  # monotonic time the last renewal was sent
        self.lost: str | None = None  # why the Lease is no longer ours
        self.took_over = False  # acquired from a holder that had not released it
        self._warned_at = 0.0

    @property
    def request_timeout_s(self) -> float:
        """Every Lease call ends within a renewal period: a hung API server connection must
        not outlast the Lease it is renewing."""
        return self.renew_s

    # ------------------------------------------------------------------ acquiring

    def acquire(self, stop: threading.Event | None = None) -> bool:
        """Block until this holder holds the Lease (steps 1-3); False if ``stop`` was set
        first."""
        log.info("waiting for lease %s/%s as %s", self.namespace, self.name, self.identity)
        while not self._try_acquire():
            if (stop or self._stop).wait(self.retry_s):
                return False
        log.info(
            "holding lease %s/%s as %s%s",
            self.namespace,
            self.name,
            self.identity,
            " (taken over from a holder that stopped renewing)" if self.took_over else "",
        )
        return True

    def _try_acquire(self) -> bool:
        try:
            lease = self.api.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=self.request_timeout_s
            )
        except ApiException as exc:
            if exc.status != 404 or not self.create:
                log.warning("reading lease %s failed: %s", self.name, _short(exc))
                return False
            return self._create()
        except (OSError, HTTPError) as exc:  # the API server is not reachable (yet): look again
            log.warning("reading lease %s failed: %s", self.name, exc)
            return False
        spec = lease.spec
        holder = spec.holder_identity
        silent = self._silence.observe(holder, spec.renew_time, time.monotonic())
        duration = spec.lease_duration_seconds or self.duration_s
        if holder and holder != self.identity and silent < duration:
            return False
        transitions = (spec.lease_transitions or 0) + (1 if holder != self.identity else 0)
        released_for = (lease.metadata.annotations or {}).get(RELEASED_FOR)
        metadata: dict[str, Any] = {"resourceVersion": lease.metadata.resource_version}
        if released_for:
            metadata["annotations"] = {RELEASED_FOR: None}
        body = {"metadata": metadata, "spec": self._spec(transitions, holder != self.identity)}
        sent = time.monotonic()
        try:
            self.api.patch_namespaced_lease(
                self.name, self.namespace, body, _request_timeout=self.request_timeout_s
            )
        except ApiException as exc:
            if exc.status == 409:  # another contender won
                return False
            raise
        self._renewed_at = sent
        self.took_over = (bool(holder) and holder != self.identity) or bool(released_for)
        return True

    def _create(self) -> bool:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": self._spec(0, acquired=True),
        }
        sent = time.monotonic()
        try:
            self.api.create_namespaced_lease(
                self.namespace, body, _request_timeout=self.request_timeout_s
            )
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        self._renewed_at = sent
        return True

    def _spec(self, transitions: int, acquired: bool) -> dict[str, Any]:
        stamp = micro_time()
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            # Rounded up: a contender must never wait less than the holder keeps writing.
            "leaseDurationSeconds": max(1, math.ceil(self.duration_s)),
            "renewTime": stamp,
            "leaseTransitions": transitions,
        }
        if acquired:
            spec["acquireTime"] = stamp
        return spec

    # ------------------------------------------------------------------ holding

    def valid(self) -> bool:
        """Sure to hold the Lease now: renewed recently enough that no contender can have
        taken it over, and not known to be lost."""
        renewed = self._renewed_at
        if self.lost is not None or renewed is None:
            return False
        return time.monotonic() - renewed < self.duration_s - self.renew_s

    def keep_renewing(self, on_lost: Callable[[str], None]) -> threading.Thread:
        """Renew every ``renew_s`` (every ``retry_s`` while not valid) in a thread;
        ``on_lost(reason)`` when the Lease is held by another, or (``give_up_unrenewed``) could
        not be renewed for ``duration_s`` minus one renewal period."""
        thread = threading.Thread(
            target=self._renew_loop, args=(on_lost,), daemon=True, name=f"lease-{self.name}"
        )
        thread.start()
        return thread

    def _renew_loop(self, on_lost: Callable[[str], None]) -> None:
        while not self._stop.wait(self.renew_s if self.valid() else self.retry_s):
            try:
                lease = self.api.read_namespaced_lease(
                    self.name, self.namespace, _request_timeout=self.request_timeout_s
                )
                if lease.spec.holder_identity != self.identity:
                    self._lose(f"the lease is held by {lease.spec.holder_identity}", on_lost)
                    return
                body = {
                    "metadata": {"resourceVersion": lease.metadata.resource_version},
                    "spec": {"renewTime": micro_time()},
                }
                sent = time.monotonic()
                self.api.patch_namespaced_lease(
                    self.name, self.namespace, body, _request_timeout=self.request_timeout_s
                )
                self._renewed_at = sent
            except Exception as exc:  # the API server may be briefly away: retry
                if not self.valid():
                    if time.monotonic() - self._warned_at > self.renew_s:  # not every retry
                        self._warned_at = time.monotonic()
                        log.warning("lease %s not renewed in time: %s", self.name, _short(exc))
                    if isinstance(exc, ApiException) and exc.status in (401, 403):
                        # Our credentials are gone: a pod's token dies with the pod, so this
                        # holder's pod was deleted (it was replaced).
                        self._lose(f"the API server refuses this holder ({exc.status})", on_lost)
                        return
                    if self.give_up_unrenewed:
                        self._lose(f"could not renew the lease: {exc}", on_lost)
                        return
                else:
                    log.warning("renewing lease %s failed, retrying: %s", self.name, _short(exc))

    def _lose(self, reason: str, on_lost: Callable[[str], None]) -> None:
        self.lost = reason
        on_lost(reason)

    def release(self) -> None:
        """Stop renewing and give the Lease up, so that a contender takes over at once."""
        self._stop.set()
        if self.lost is not None or self._renewed_at is None:
            return
        try:
            lease = self.api.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=self.request_timeout_s
            )
            if lease.spec.holder_identity == self.identity:
                body = {
                    "metadata": {"resourceVersion": lease.metadata.resource_version},
                    "spec": {"holderIdentity": None},
                }
                self.api.patch_namespaced_lease(
                    self.name, self.namespace, body, _request_timeout=self.request_timeout_s
                )
        except ApiException as exc:
            log.warning("releasing lease %s failed: %s", self.name, exc.reason)
        self._renewed_at = None


def _short(exc: BaseException) -> str:
    """An API error as one line (the client's own text spans headers and body)."""
    if isinstance(exc, ApiException):
        return f"{exc.status} {exc.reason}"
    return str(exc)
