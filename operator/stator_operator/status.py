"""The pipeline as the operator last read it, and every write to its status.

Each write is patched to the API server at once, before the step it announces is taken (the
write-ahead log of flows.py), and mirrored into the local copy so that the next decision in
the same handler call sees it. Patches are JSON merge patches: ``None`` removes a field."""

from __future__ import annotations

import datetime as dt
from typing import Any

from .operation import Operation
from .outcomes import ConditionReason, ConditionType
from .pipeline_spec import PipelineSpec
from .pipeline_status import (
    Condition,
    Deployment,
    LastOperation,
    PipelineStatus,
    SavepointRecord,
)
from .ports import StatusApi

STAMP = "%Y-%m-%dT%H:%M:%SZ"


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime(STAMP)


def stamp_ms(epoch_ms: int) -> str:
    return dt.datetime.fromtimestamp(epoch_ms / 1000, dt.UTC).strftime(STAMP)


def stamp_s(stamp: str | None) -> float:
    """A status time stamp as unix seconds (0 for none)."""
    if not stamp:
        return 0.0
    return dt.datetime.strptime(stamp, STAMP).replace(tzinfo=dt.UTC).timestamp()


def age_s(stamp: str | None) -> float:
    """Seconds since a status time stamp (0 for none)."""
    if not stamp:
        return 0.0
    return dt.datetime.now(dt.UTC).timestamp() - stamp_s(stamp)


class StatusWriter:
    """One StatefulPipeline: its metadata and spec as read, its status as written."""

    def __init__(self, kube: StatusApi, body: dict[str, Any]) -> None:
        self.kube = kube
        self.body = body

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.body["metadata"]["namespace"])

    @property
    def uid(self) -> str:
        """The pipeline's uid: it owns the pipeline's checkpoint root."""
        return str(self.body["metadata"].get("uid") or "")

    @property
    def raw_spec(self) -> dict[str, Any]:
        """The spec as given: what is recorded in status and compared."""
        return dict(self.body.get("spec") or {})

    @property
    def spec(self) -> PipelineSpec:
        """The spec's fields (its checks are the reconciler's: ``PipelineSpec.parse``)."""
        return PipelineSpec.read(self.raw_spec)

    @property
    def status(self) -> PipelineStatus:
        return PipelineStatus.from_dict(self.body.get("status") or {})

    @property
    def operation(self) -> Operation | None:
        return self.status.operation

    def write(self, **fields: Any) -> None:
        """Patch status now: stored names, typed values (an :class:`Operation` replaces the
        stored one whole; ``None`` removes a field)."""
        patch = {key: _stored(value, patch=True) for key, value in fields.items()}
        self.kube.patch_status(self.namespace, self.name, patch)
        status = dict(self.body.get("status") or {})
        for key, value in fields.items():
            if value is None:
                status.pop(key, None)
            else:
                status[key] = _stored(value, patch=False)
        self.body["status"] = status

    def condition(
        self, ctype: ConditionType, ok: bool, reason: ConditionReason, message: str
    ) -> None:
        kept = tuple(c for c in self.status.conditions if c.type != ctype)
        self.write(conditions=(*kept, Condition(ctype, ok, reason, message[:1000], now())))

    def has_condition(self, ctype: ConditionType, ok: bool) -> bool:
        found = self.status.condition(ctype)
        return found is not None and found.ok is ok


def _stored(value: Any, patch: bool) -> Any:
    """A typed status value in its stored form (as a merge patch, or as stored)."""
    if isinstance(value, Operation):
        return value.to_patch() if patch else value.to_json()
    if isinstance(value, LastOperation):
        return value.to_patch() if patch else value.to_dict()
    if isinstance(value, Deployment | SavepointRecord | Condition):
        return value.to_dict()
    if isinstance(value, tuple):
        return [_stored(v, patch) for v in value]
    return value
