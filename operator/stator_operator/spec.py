"""How a change of the StatefulPipeline spec is classified (pipeline_spec.py reads a spec)."""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from .operation import OpKind
from .pipeline_spec import DesiredState, PipelineSpec, SpecError, UpgradeMode

# Fields whose change needs no redeploy: handled by their own flows or read when needed.
# Not savepoints.directory: the driver's job config has it (savepoint.dir).
NO_REDEPLOY = (
    ("state",),
    ("savepoints", "triggerNonce"),
    ("savepoints", "periodicSeconds"),
    ("savepoints", "historyMaxCount"),
    ("savepoints", "historyMaxAgeSeconds"),
    ("savepoints", "disposeOnDelete"),
    ("deletion",),
    ("restore", "initialSavepoint"),
    ("failover", "readinessTimeoutSeconds"),
    ("driver", "prestart"),
    ("upgradeMode",),  # how the next change is applied, not a change of the job
    ("savepoints", "formatType"),  # the next savepoint's format
    ("savepoints", "timeoutSeconds"),
    ("autoscaler",),  # read by the operator only; it changes replicas, which do redeploy
)


class SpecDiff(IntEnum):
    """What a spec change needs, ordered: a change of several fields needs the most any of
    them needs (as in the Flink operator)."""

    IGNORE = 0  # nothing to redeploy (no change, or fields with their own flows)
    SCALE = 1  # replicas alone: stop with a savepoint, restore at the new parallelism
    UPGRADE = 2  # anything else: redeploy by spec.upgradeMode


@dataclass(frozen=True)
class Change:
    """The one decision of what a spec change is; the flow it starts records it (flows read
    it from their operation, never from the specs again)."""

    diff: SpecDiff
    fields: tuple[str, ...]
    # The parallelism changes (a rescale, or an upgrade that also changes replicas): the
    # savepoint is canonical, and a pre-started driver runs an executor set of its own.
    rescales: bool = False
    # The flow it takes: deploy, suspend, resume, upgrade or rescale; None: none (the spec
    # runs as it is, or a suspended pipeline stays suspended).
    kind: OpKind | None = None


def comparable(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The spec without the fields whose change needs no redeploy, with an absent
    ``replicas`` or ``savepoints.directory`` at its effective value (leaving it out is not a
    change)."""
    typed = PipelineSpec.read(spec)
    out = copy.deepcopy(dict(spec))
    out["replicas"] = typed.parallelism
    out["savepoints"] = {**(spec.get("savepoints") or {}), "directory": typed.savepoint_dir}
    for path in NO_REDEPLOY:
        node = out
        for part in path[:-1]:
            node = node.get(part, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node.pop(path[-1], None)
    return out


def _diff(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) or isinstance(b, dict):  # an absent section equals an empty one
        a, b = ({} if a is None else a), ({} if b is None else b)
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for key in sorted(set(a) | set(b)):
            out += _diff(a.get(key), b.get(key), f"{prefix}.{key}" if prefix else key)
        return out
    return [] if a == b else [prefix]


def classify(
    running: Mapping[str, Any] | None, desired: Mapping[str, Any], suspended: bool = False
) -> Change:
    """What it takes to go from the spec that runs (None: nothing deployed yet; suspended:
    the pipeline is) to the one that is wanted: the one place that decides it (specs
    compared as given, the CRD's defaults filled in by the API server)."""
    wants = PipelineSpec.read(desired).state
    if running is None:
        first = None if wants is DesiredState.SUSPENDED else OpKind.DEPLOY
        return Change(SpecDiff.UPGRADE, ("*",), kind=first)
    changed = tuple(_diff(comparable(running), comparable(desired)))
    diff = max(
        (SpecDiff.SCALE if field == "replicas" else SpecDiff.UPGRADE for field in changed),
        default=SpecDiff.IGNORE,
    )
    kind: OpKind | None
    if suspended:
        kind = OpKind.RESUME if wants is DesiredState.RUNNING else None
    elif wants is DesiredState.SUSPENDED:
        kind = OpKind.SUSPEND
    else:
        kind = {SpecDiff.SCALE: OpKind.RESCALE, SpecDiff.UPGRADE: OpKind.UPGRADE}.get(diff)
    return Change(diff, changed, rescales="replicas" in changed, kind=kind)


def check_transition(running: PipelineSpec, spec: PipelineSpec, suspended_with: str | None) -> None:
    """Changes from the running spec that would do something else than they say without a
    word: a restore from ``latest`` looks for checkpoints under the *new* spec's storage,
    which holds none of this job's (the job would start empty), and a new
    ``restore.initialSavepoint`` is read by no one (only the first deployment restores from
    it). ``suspended_with``: the restore source of a suspended pipeline (None: not
    suspended)."""
    was = running.restore.initial_savepoint or ""
    now = spec.restore.initial_savepoint or ""
    if now and now != was:
        raise SpecError(
            f"spec.restore.initialSavepoint changed from {was or 'none'} to {now}: only the "
            f"first deployment restores from it, and this pipeline runs from its own "
            f"checkpoints and savepoints; put it back (or remove it), or delete the pipeline "
            f"and apply it again to start from {now}"
        )
    old, new = running.checkpointing.storage, spec.checkpointing.storage
    if old == new:
        return
    moved = f"spec.checkpointing.storage changed from {old} to {new}"
    if suspended_with is not None:
        if suspended_with == "latest":
            raise SpecError(
                f"{moved}, but the pipeline was suspended without a savepoint and resumes "
                f"from its latest checkpoint, which is under {old}: put the storage back to "
                f"resume, then change it with upgradeMode: savepoint"
            )
        return  # it resumes from its savepoint
    if spec.upgrade_mode is UpgradeMode.LAST_STATE:
        raise SpecError(
            f"{moved}: a last-state upgrade resumes from the latest checkpoint, and this "
            f"job's checkpoints are under {old}; set upgradeMode: savepoint (the savepoint "
            f"carries the state over) or stateless (start empty), or put the storage back"
        )


def attempt_fingerprint(spec: Mapping[str, Any]) -> str:
    """A digest of the whole spec but ``state`` (and the savepoint trigger): what a failed
    flow tried, so that any change (a longer savepoint timeout, another upgrade mode) tries
    again while resuming or suspending does not."""
    rest = {k: v for k, v in spec.items() if k != "state"}
    savepoints = {k: v for k, v in (rest.get("savepoints") or {}).items() if k != "triggerNonce"}
    if savepoints:
        rest["savepoints"] = savepoints
    return hashlib.sha256(json.dumps(rest, sort_keys=True).encode()).hexdigest()[:16]


def fingerprint(spec: Mapping[str, Any]) -> str:
    """A short digest of the fields that matter, to recognise a spec seen before."""
    return hashlib.sha256(json.dumps(comparable(spec), sort_keys=True).encode()).hexdigest()[:16]
