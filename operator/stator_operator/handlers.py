"""kopf handlers: each call lets a StatefulPipeline (pipeline.py: observe, then reconcile) take
its next steps, one pipeline at a time."""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import kopf
from kubernetes.client.rest import ApiException

from . import resources
from .flows import QUICK_S
from .k8s import GROUP, PLURAL, VERSION, Kube
from .outcomes import EventReason
from .pipeline import Pipeline

MAX_STEPS_PER_CALL = 16
MAX_WORKERS = 16
# A step that asks to look again within QUICK_S (flows.py) is looked at again within the
# same call, for at most QUICK_BUDGET_S per call, not at the one-second timer's next tick.
QUICK_BUDGET_S = 3.0
DELETE_CALL_S = 20  # then kopf calls the finalizer again, with a fresh body


@dataclass
class Shared:
    """What every handler call shares, set up once at start (kopf's ``memo``): one API client
    per operator process, one lock per pipeline, and the settings read from the environment."""

    kube: Kube
    # False (STATOR_REQUIRE_RESTRICTED=false, the chart's podSecurity.requireRestricted):
    # pipelines run in namespaces whose Pod Security admission is not "restricted" too.
    require_restricted: bool = True
    locks: dict[str, threading.Lock] = field(default_factory=dict)
    guard: threading.Lock = field(default_factory=threading.Lock)

    def lock(self, body: Any) -> threading.Lock:
        """kopf runs timers beside change handlers: one flow step at a time per pipeline."""
        with self.guard:
            return self.locks.setdefault(str(body["metadata"]["uid"]), threading.Lock())


def shared(memo: kopf.Memo) -> Shared:
    found = memo.get("shared")
    assert isinstance(found, Shared), "set up by the startup handler (setup)"
    return found


@kopf.on.startup()
def setup(memo: kopf.Memo, **_: Any) -> None:
    """The handlers' shared state; kopf hands each handler a shallow copy of ``memo``, so all
    of them see this one object."""
    restricted = os.environ.get("STATOR_REQUIRE_RESTRICTED", "true").lower() != "false"
    memo["shared"] = Shared(Kube(), require_restricted=restricted)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.finalizer = "stator.dev/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="stator.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="stator.dev")
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = 120
    # Sync handlers run in this many threads; a pipeline holds at most one (``_advance``).
    settings.execution.max_workers = MAX_WORKERS
    if os.environ.get("STATOR_WATCH_NAMESPACES"):
        # Namespaced mode: the watched namespaces are exact names and the operator may not
        # list namespaces (least privilege). Without this kopf first retries that forbidden
        # list for about a minute before it watches anything. (CRDs are still listed once at
        # start: the chart installs the CRD before the operator.)
        settings.scanning.disabled = True


def _pipeline(state: Shared, body: Any) -> Pipeline:
    raw = {
        "metadata": dict(body["metadata"]),
        "spec": dict(body.get("spec") or {}),
        "status": dict(body.get("status") or {}),
    }

    def event(etype: str, reason: EventReason, message: str) -> None:
        state.kube.post_event(resources.event(raw, etype, reason, message))

    return Pipeline.build(state.kube, raw, event, require_restricted=state.require_restricted)


def _advance(state: Shared, body: Any) -> float:
    """One call's steps of a pipeline. A pipeline whose previous call still runs (a slow
    endpoint, a slow API server) is skipped, not waited for: each pipeline holds at most one
    of kopf's workers, so one slow pipeline cannot starve the others; the timer comes back."""
    lock = state.lock(body)
    if not lock.acquire(blocking=False):
        return 0.0
    try:
        return _advance_locked(state, body)
    finally:
        lock.release()


def _advance_locked(state: Shared, body: Any) -> float:
    meta = body["metadata"]
    try:  # the body kopf hands over may predate our own last status write
        fresh = state.kube.get_pipeline(meta["namespace"], meta["name"])
    except ApiException as exc:
        if exc.status == 404:
            return 0.0
        raise
    if fresh["metadata"].get("deletionTimestamp"):
        return 0.0
    pipeline = _pipeline(state, fresh)
    delay = 0.0
    deadline = time.monotonic() + QUICK_BUDGET_S
    for _ in range(MAX_STEPS_PER_CALL):
        delay = pipeline.reconcile()
        if delay > QUICK_S or time.monotonic() + delay > deadline:
            break
        time.sleep(delay)
    return delay


@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
@kopf.on.resume(GROUP, VERSION, PLURAL)
def changed(body: Any, memo: kopf.Memo, **_: Any) -> None:
    """React at once (the timer below would get there within a second anyway)."""
    if not body["metadata"].get("deletionTimestamp"):
        _advance(shared(memo), body)


@kopf.timer(GROUP, VERSION, PLURAL, interval=1.0, sharp=False)
def tick(body: Any, memo: kopf.Memo, **_: Any) -> None:
    if not body["metadata"].get("deletionTimestamp"):
        _advance(shared(memo), body)


@kopf.on.delete(GROUP, VERSION, PLURAL)
def deleted(body: Any, memo: kopf.Memo, **_: Any) -> None:
    """Finalizer: the reconciler's deletion flow, in calls of at most ``DELETE_CALL_S``."""
    state = shared(memo)
    with state.lock(body):
        pipeline = _pipeline(state, body)
        started = time.monotonic()
        while (delay := pipeline.delete()) is not None:
            if time.monotonic() - started > DELETE_CALL_S:
                raise kopf.TemporaryError("deletion in progress", delay=1)
            if delay:
                time.sleep(min(delay, 1.0))
