"""The small interfaces the observer and the reconciler use: Kubernetes (``k8s.Kube``) and a
driver's control API (``stator.control.client.ControlClient``). Unit tests give them
in-memory fakes of these; the end-to-end tests run the real ones."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from stator.control.schema import HandoverAnswer, JobInfo, Readiness, SavepointRequest

from .outcomes import EventReason


class NotOwned(ValueError):
    """An object the pipeline needs exists under its name but belongs to someone else: the
    operator neither adopts nor replaces it (``KubeApi.ensure``/``apply`` raise it)."""


class StatusApi(Protocol):
    def patch_status(self, namespace: str, name: str, fields: dict[str, Any]) -> None: ...


class SecretApi(Protocol):
    def read_secret(self, namespace: str, name: str) -> dict[str, str]: ...


class ScaleApi(Protocol):
    def scale_pipeline(self, namespace: str, name: str, replicas: int) -> None:
        """Set a pipeline's ``spec.replicas`` through its scale subresource (as ``kubectl
        scale`` does)."""
        ...


class KubeApi(StatusApi, SecretApi, ScaleApi, Protocol):
    def namespace_labels(self, namespace: str) -> dict[str, str]:
        """The labels of a namespace (its Pod Security level)."""
        ...

    def driver_pod(self, namespace: str, name: str, deployment: str) -> dict[str, Any] | None:
        """The driver pod of one deployment (the operation id that created it)."""
        ...

    def delete_drivers(self, namespace: str, name: str, keep: str | None = None) -> bool:
        """Delete every driver pod of the pipeline but deployment ``keep``'s; whether any
        was still there."""
        ...

    def delete_pod(self, namespace: str, pod: str, grace_s: int = 30) -> None:
        """Delete a pod unless it is gone (``grace_s`` 0: at once, for a pod on a lost node)."""
        ...

    def driver_lease(self, namespace: str, lease: str) -> tuple[str | None, object, int] | None:
        """(holder, renewTime, leaseDurationSeconds) of a driver's Lease; None if missing."""
        ...

    def clear_driver_lease(self, namespace: str, lease: str, keep: str | None = None) -> str | None:
        """Release a driver's Lease for a holder whose pod is gone, unless ``keep`` holds it."""
        ...

    def ensure(self, obj: dict[str, Any]) -> None:
        """Create ``obj`` unless it exists (:class:`NotOwned` if not the pipeline's)."""
        ...

    def apply(self, obj: dict[str, Any]) -> None:
        """Create or replace a ConfigMap or Role (:class:`NotOwned` if not the pipeline's)."""
        ...

    def executors_left(self, namespace: str, app_id: str) -> bool:
        """Whether any executor (StatefulSet or pod) of a Spark application is still there."""
        ...

    def delete_claims(self, namespace: str, app_id: str, keep: int) -> list[str]:
        """Delete the executors' state claims of ordinal ``keep`` and up; their names."""
        ...

    def executor_sets(self, namespace: str, base: str) -> list[str]:
        """The application ids (``base``, or ``base-<deployment>``) that have state claims."""
        ...

    def release_lost(self, namespace: str, app_id: str, claim_prefix: str) -> list[str]:
        """Move executors off unreachable nodes (claim deleted, pod removed); their pods."""
        ...


class DriverApi(Protocol):
    """A driver's control API; its answers are the schema's (``stator.control.schema``), and
    it raises ``ControlUnreachable`` (also for an answer that does not fit the schema:
    ``ControlAnswerInvalid``) or ``ControlHTTPError``."""

    def ready(self) -> Readiness: ...

    def job(self) -> JobInfo: ...

    def trigger_savepoint(
        self, stop: bool = False, target: str | None = None, format_type: str | None = None
    ) -> SavepointRequest: ...

    def savepoint(self, request_id: str) -> SavepointRequest: ...

    def savepoints(self) -> tuple[SavepointRequest, ...]: ...

    def handover(self, restore: str, allow_non_restored_state: bool = False) -> HandoverAnswer: ...


class Connect(Protocol):
    """The control API at a base URL, called with the pipeline's bearer token."""

    def __call__(self, base_url: str, *, token: str | None = None) -> DriverApi: ...


# (type, reason, message): a Kubernetes event on the pipeline
EventSink = Callable[[str, EventReason, str], None]
