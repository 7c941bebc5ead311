"""The pipeline as the operator last read it, and every write to its status.

Each write is patched to the API server at once, before the step it announces is taken (the
write-ahead log of flows.py), and mirrored into the local copy so that the next decision in
the same handler call sees it. Patches are JSON merge patches: ``None`` removes a field."""

from __future__ import annotations

import datetime as dt
from typing import Any

from .operation import Operation
from .pipeline_spec import PipelineSpec
from .ports import StatusApi

STAMP = "%Y-%m-%dT%H:%M:%SZ"


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime(STAMP)


def stamp_ms(epoch_ms: int) -> str:
    return dt.datetime.fromtimestamp(epoch_ms / 1000, dt.UTC).strftime(STAMP)


def age_s(stamp: str | None) -> float:
    """Seconds since a status time stamp (0 for none)."""
    if not stamp:
        return 0.0
    t = dt.datetime.strptime(stamp, STAMP).replace(tzinfo=dt.UTC)
    return (dt.datetime.now(dt.UTC) - t).total_seconds()


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
    def status(self) -> dict[str, Any]:
        return dict(self.body.get("status") or {})

    @property
    def operation(self) -> Operation | None:
        raw = self.status.get("operation")
        return Operation.from_json(raw) if raw else None

    def write(self, **fields: Any) -> None:
        """Patch status now. An :class:`Operation` value replaces the stored one whole."""
        patch = {k: v.to_patch() if isinstance(v, Operation) else v for k, v in fields.items()}
        self.kube.patch_status(self.namespace, self.name, patch)
        status = self.status
        for key, value in fields.items():
            if value is None:
                status.pop(key, None)
            else:
                status[key] = value.to_json() if isinstance(value, Operation) else value
        self.body["status"] = status

    def condition(self, ctype: str, ok: bool, reason: str, message: str) -> None:
        conditions = [c for c in self.status.get("conditions", []) if c.get("type") != ctype]
        conditions.append(
            {
                "type": ctype,
                "status": "True" if ok else "False",
                "reason": reason,
                "message": message[:1000],
                "lastTransitionTime": now(),
            }
        )
        self.write(conditions=conditions)

    def has_condition(self, ctype: str, ok: bool) -> bool:
        found = {c.get("type"): c for c in self.status.get("conditions", [])}.get(ctype)
        return found is not None and found.get("status") == ("True" if ok else "False")
