"""One StatefulPipeline as the operator handles it: every look observes first, then reconciles
(the observer and the reconciler share the pipeline's status writer)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stator.control.client import ControlClient

from .observer import Observer
from .ports import Connect, EventSink, KubeApi
from .reconciler import Reconciler
from .status import StatusWriter
from .storage import SavepointStorage


@dataclass
class Pipeline:
    observer: Observer
    reconciler: Reconciler

    @classmethod
    def build(
        cls,
        kube: KubeApi,
        body: dict[str, Any],
        event: EventSink,
        connect: Connect = ControlClient,
        allow_file_storage: bool = False,
        require_restricted: bool = True,
    ) -> Pipeline:
        storage = SavepointStorage(kube, allow_file=allow_file_storage)
        return cls(
            Observer(kube, storage, connect),
            Reconciler(StatusWriter(kube, body), kube, storage, event, require_restricted),
        )

    def reconcile(self) -> float:
        """One step; seconds until the next look (0: at once)."""
        return self.reconciler.reconcile(self.observer.observe(self.reconciler.pipeline))

    def delete(self) -> float | None:
        """One step of deletion; None once the pipeline may go."""
        return self.reconciler.delete(self.observer.observe(self.reconciler.pipeline))
