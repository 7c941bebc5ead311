"""kopf handlers: every StatefulPipeline is advanced by the flows in ``flows.py``."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, cast

import kopf
from kubernetes.client.rest import ApiException

from .flows import REMOVE_DRIVER, SAVEPOINT, Reconciler, now
from .k8s import GROUP, PLURAL, VERSION, Kube
from .spec import get

log = logging.getLogger("stator.operator")
_kube: Kube | None = None
MAX_STEPS_PER_CALL = 8


def kube() -> Kube:
    global _kube  # noqa: PLW0603 - one API client per operator process
    if _kube is None:
        _kube = Kube()
    return _kube


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.finalizer = "stator.dev/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="stator.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="stator.dev")
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = 120
    settings.batching.worker_limit = 16


def _reconciler(body: Any) -> Reconciler:
    raw = {
        "metadata": dict(body["metadata"]),
        "spec": dict(body.get("spec") or {}),
        "status": dict(body.get("status") or {}),
    }

    def event(etype: str, reason: str, message: str) -> None:
        kopf.event(cast(Any, raw), type=etype, reason=reason, message=message[:1000])

    return Reconciler(kube(), raw, event)


_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def _lock(body: Any) -> threading.Lock:
    """kopf runs timers beside change handlers: one flow step at a time per pipeline."""
    with _locks_guard:
        return _locks.setdefault(str(body["metadata"]["uid"]), threading.Lock())


def _advance(body: Any) -> float:
    with _lock(body):
        meta = body["metadata"]
        try:  # the body kopf hands over may predate our own last status write
            fresh = kube().get_pipeline(meta["namespace"], meta["name"])
        except ApiException as exc:
            if exc.status == 404:
                return 0.0
            raise
        if fresh["metadata"].get("deletionTimestamp"):
            return 0.0
        r = _reconciler(fresh)
        delay = 0.0
        for _ in range(MAX_STEPS_PER_CALL):
            delay = r.advance()
            if delay > 0:
                break
        return delay


@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
@kopf.on.resume(GROUP, VERSION, PLURAL)
def changed(body: Any, **_: Any) -> None:
    """React at once (the timer below would get there within a second anyway)."""
    if not body["metadata"].get("deletionTimestamp"):
        _advance(body)


@kopf.timer(GROUP, VERSION, PLURAL, interval=1.0, sharp=False)
def tick(body: Any, **_: Any) -> None:
    if not body["metadata"].get("deletionTimestamp"):
        _advance(body)


@kopf.on.delete(GROUP, VERSION, PLURAL)
def deleted(body: Any, **_: Any) -> None:
    """Finalizer: optional final savepoint, remove the driver, dispose savepoints per policy.
    Never stuck: past ``deletion.timeoutSeconds`` the driver is removed regardless."""
    with _lock(body):
        _delete(body)


def _delete(body: Any) -> None:
    r = _reconciler(body)
    spec = r.spec
    op = r.status.get("operation") or {}
    if op.get("kind") != "delete":
        final = bool(get(spec, "deletion", "finalSavepoint", default=True))
        step = SAVEPOINT if final and r.driver() is not None else REMOVE_DRIVER
        r._start(
            "delete", step, target=r.status.get("lastReconciledSpec") or spec, deleteStartedAt=now()
        )
        op = r.status["operation"]
    timeout = float(get(spec, "deletion", "timeoutSeconds", default=300))
    started = time.monotonic()
    while not (r.status.get("operation") or {}).get("done"):
        if time.monotonic() - started > 20:
            raise kopf.TemporaryError("deletion in progress", delay=1)
        age = (
            time.time()
            - time.mktime(time.strptime(op["deleteStartedAt"], "%Y-%m-%dT%H:%M:%SZ"))
            + time.timezone
        )
        if age > timeout:
            r.event(
                "Warning",
                "DeleteTimedOut",
                f"final savepoint not done after {timeout:.0f}s; removing the driver",
            )
            kube().delete_drivers(r.namespace, r.name)
            break
        delay = r.advance()
        if delay:
            time.sleep(min(delay, 1.0))
    if get(spec, "savepoints", "disposeOnDelete", default=False):
        for sp in r.status.get("savepoints", []):
            kube().dispose_savepoint(r.namespace, spec, sp["path"])
        r.event("Normal", "SavepointsDisposed", "disposed the savepoint history")
    r.event("Normal", "Deleted", "pipeline deleted")
