"""The hand-over of a pre-started driver: what it restores from arrives after it started.

An upgrade or rescale by savepoint used to stop the old driver first and only then start the
new one, so its whole start-up (pod, interpreter, imports, JVM, SparkSession, Python workers)
was downtime. With ``stator run --await-handover`` the operator starts the new driver while
the old one still processes; it gets as far as it can without touching the job's state, then
waits here. Once the old driver has stopped with a savepoint, ``POST /v1/handover`` names the
savepoint and the new driver restores from it.

One hand-over per driver: the same request again is answered as accepted (an operator that
crashed after sending it sends it again), a different one is refused.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class HandoverRequest:
    restore: str  # a savepoint or checkpoint URI, or "latest"
    allow_non_restored_state: bool = False


class HandoverConflict(Exception):
    """A second hand-over that differs from the first."""


class Handover:
    """A one-shot, thread-safe rendezvous between the control API and the waiting driver."""

    def __init__(self) -> None:
        self._request: HandoverRequest | None = None
        self._given = threading.Event()
        self._lock = threading.Lock()

    @property
    def request(self) -> HandoverRequest | None:
        return self._request

    def give(self, request: HandoverRequest) -> bool:
        """Accept ``request``; False if this very request was accepted before."""
        with self._lock:
            if self._request is not None:
                if self._request == request:
                    return False
                raise HandoverConflict(
                    f"this driver was handed over to restore from {self._request.restore!r}; "
                    f"it cannot restore from {request.restore!r} instead"
                )
            self._request = request
        self._given.set()
        return True

    def wait(self, timeout_s: float | None = None) -> HandoverRequest | None:
        """Block until the hand-over, or None after ``timeout_s`` (the operator deletes a
        pre-started driver it gives up on: a caller may wait forever)."""
        self._given.wait(timeout_s)
        return self._request
