"""An in-memory Lease API for the tests of stator.ha.lease (operator replicas, drivers)
and stator.ha.fencing."""

from __future__ import annotations

import copy
import datetime as dt
import threading
from types import SimpleNamespace
from typing import Any

from kubernetes.client.rest import ApiException


class FakeLeases:
    """The Lease calls of the Kubernetes API in memory: an update with a stale resourceVersion
    is refused with 409, as the API server does; ``down`` and ``refuse`` fail every call."""

    def __init__(self) -> None:
        self.leases: dict[str, dict[str, Any]] = {}
        self.version = 0
        self.down = False
        self.refuse = False  # 401: the caller's token is no longer valid
        self.lock = threading.Lock()

    def _obj(self, raw: dict[str, Any]) -> Any:
        spec = raw["spec"]
        renew = spec.get("renewTime")
        return SimpleNamespace(
            metadata=SimpleNamespace(
                resource_version=raw["metadata"]["resourceVersion"],
                annotations=raw["metadata"].get("annotations"),
            ),
            spec=SimpleNamespace(
                holder_identity=spec.get("holderIdentity"),
                renew_time=dt.datetime.fromisoformat(renew.replace("Z", "+00:00"))
                if renew
                else None,
                lease_duration_seconds=spec.get("leaseDurationSeconds"),
                lease_transitions=spec.get("leaseTransitions"),
            ),
        )

    def _timed(self, timeout: float | None) -> None:
        """Calls made without a request timeout (the tests' own set-up calls are)."""
        if timeout is None:
            self.untimed = getattr(self, "untimed", 0) + 1
        else:
            assert 0 < timeout <= 60

    def read_namespaced_lease(
        self, name: str, namespace: str, _request_timeout: float | None = None
    ) -> Any:
        self._timed(_request_timeout)
        with self.lock:
            if self.refuse:
                raise ApiException(status=401, reason="Unauthorized")
            if self.down:
                raise ApiException(status=503)
            if name not in self.leases:
                raise ApiException(status=404)
            return self._obj(self.leases[name])

    def create_namespaced_lease(
        self, namespace: str, body: dict[str, Any], _request_timeout: float | None = None
    ) -> None:
        self._timed(_request_timeout)
        with self.lock:
            name = body["metadata"]["name"]
            if name in self.leases:
                raise ApiException(status=409)
            self.version += 1
            stored = copy.deepcopy(body)
            stored["metadata"]["resourceVersion"] = str(self.version)
            self.leases[name] = stored

    def patch_namespaced_lease(
        self, name: str, namespace: str, body: dict[str, Any], _request_timeout: float | None = None
    ) -> None:
        self._timed(_request_timeout)
        with self.lock:
            if self.down:
                raise ApiException(status=503)
            stored = self.leases[name]
            if body["metadata"]["resourceVersion"] != stored["metadata"]["resourceVersion"]:
                raise ApiException(status=409)
            for key, value in body["spec"].items():
                if value is None:
                    stored["spec"].pop(key, None)
                else:
                    stored["spec"][key] = value
            notes = stored["metadata"].setdefault("annotations", {})
            for key, value in (body["metadata"].get("annotations") or {}).items():
                if value is None:
                    notes.pop(key, None)
                else:
                    notes[key] = value
            self.version += 1
            stored["metadata"]["resourceVersion"] = str(self.version)

    def holder(self) -> str | None:
        return self.leases["lead"]["spec"].get("holderIdentity")
