"""The StatefulPipeline spec as the operator reads it, and how a spec change is classified."""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import Any

from stator.config import CREDENTIAL_KEYS, JobConfig
from stator.lineage import default_savepoint_root

from .naming import job_name

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
)
CONTROL_PORT = 8081
# The runtime's default, used where the operator needs the effective value of an absent
# spec.replicas (status.replicas, rescale detection); the job config only gets what is set.
DEFAULT_REPLICAS = JobConfig().parallelism


class SpecDiff(IntEnum):
    """What a spec change needs, ordered: a change of several fields needs the most any of
    them needs (as in the Flink operator)."""

    IGNORE = 0  # nothing to redeploy (no change, or fields with their own flows)
    SCALE = 1  # replicas alone: stop with a savepoint, restore at the new parallelism
    UPGRADE = 2  # anything else: redeploy by spec.upgradeMode


class UpgradeMode(StrEnum):
    SAVEPOINT = "savepoint"
    LAST_STATE = "last-state"
    STATELESS = "stateless"


class SpecError(ValueError):
    """A spec the CRD schema accepts but the operator cannot run; the message names the
    field and the fix."""


@dataclass(frozen=True)
class Change:
    """The one decision of what a spec change is; the flow it starts records it (flows read
    it from their operation, never from the specs again)."""

    diff: SpecDiff
    fields: tuple[str, ...]
    # The parallelism changes (a rescale, or an upgrade that also changes replicas): the
    # savepoint is canonical, and a pre-started driver runs an executor set of its own.
    rescales: bool = False


def get(spec: dict[str, Any], *path: str, default: Any = None) -> Any:
    node: Any = spec
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def replicas(spec: dict[str, Any]) -> int:
    """The parallelism the spec runs at: ``replicas``, else the runtime's default."""
    return int(spec.get("replicas", DEFAULT_REPLICAS))


def upgrade_mode(spec: dict[str, Any]) -> UpgradeMode:
    return UpgradeMode(spec.get("upgradeMode", UpgradeMode.SAVEPOINT))


def readiness_timeout(spec: dict[str, Any]) -> float:
    """Seconds a new driver gets to become ready (``failover.readinessTimeoutSeconds``)."""
    return float(get(spec, "failover", "readinessTimeoutSeconds", default=300))


def savepoint_timeout(spec: dict[str, Any]) -> float:
    """Seconds the operator waits for a savepoint it asked for (``savepoints.timeoutSeconds``)."""
    return float(get(spec, "savepoints", "timeoutSeconds", default=300))


def prestart(spec: dict[str, Any]) -> bool:
    """Whether an upgrade or rescale by savepoint starts its new driver before it stops the
    old one (``driver.prestart``, default true)."""
    return bool(get(spec, "driver", "prestart", default=True))


def savepoint_dir(spec: dict[str, Any]) -> str:
    """Where the pipeline's savepoints go: ``savepoints.directory``, else beside its
    checkpoints."""
    named = get(spec, "savepoints", "directory")
    return str(named or default_savepoint_root(str(get(spec, "checkpointing", "storage"))))


def comparable(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec without the fields whose change needs no redeploy, with an absent
    ``replicas`` or ``savepoints.directory`` at its effective value (leaving it out is not a
    change)."""
    out = copy.deepcopy(spec)
    out["replicas"] = replicas(spec)
    out["savepoints"] = {**(spec.get("savepoints") or {}), "directory": savepoint_dir(spec)}
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


def classify(running: dict[str, Any] | None, desired: dict[str, Any]) -> Change:
    """What it takes to go from the spec that runs to the one that is wanted."""
    if running is None:
        return Change(SpecDiff.UPGRADE, ("*",))
    changed = tuple(_diff(comparable(running), comparable(desired)))
    diff = max(
        (SpecDiff.SCALE if field == "replicas" else SpecDiff.UPGRADE for field in changed),
        default=SpecDiff.IGNORE,
    )
    return Change(diff, changed, rescales="replicas" in changed)


# spec.config keys (or sections) the operator sets itself or from a spec field, and what to
# do instead. Every key job_config writes is here: spec.config is applied last, so it would
# silently win over the field (often a default the API server filled in), and a value the
# operator uses itself (finding savepoints, reaching storage, its Lease, restarting the driver
# pod) would reach the driver alone.
OPERATOR_CONFIG = {
    "name": "remove it (the job is named <namespace>.<name> after the pipeline)",
    "parallelism": "use spec.replicas instead",
    "max_parallelism": "use spec.maxParallelism instead",
    "control": "remove it (the operator sets up the driver's control API)",
    "restore": "use spec.restore or spec.upgradeMode instead",
    "checkpoint.storage": "use spec.checkpointing.storage instead",
    "s3.endpoint_url": "use spec.checkpointing.endpoint instead",
    "savepoint.dir": "use spec.savepoints.directory instead",
    "savepoint.format_type": "use spec.savepoints.formatType instead",
    "spark.master": "use spec.executor for executor pods, or leave it out",
    "spark.conf": "use spec.sparkConf instead",
    "lease.name": "remove it (the driver takes the Lease the operator creates for it)",
    "state.local_dir": "remove it (state is kept on the pod's state volume)",
    "checkpoint.retained": "use spec.checkpointing.retained instead",
    "checkpoint.incremental": "use spec.checkpointing.incremental instead",
    "checkpoint.every_epochs": "use spec.checkpointing.intervalEpochs instead",
    "checkpoint.interval_ms": "use spec.checkpointing.intervalSeconds instead",
    "checkpoint.async_upload": "use spec.checkpointing.asyncUpload instead",
    "checkpoint.max_concurrent": "use spec.checkpointing.maxConcurrent instead",
    "checkpoint.timeout_ms": "use spec.checkpointing.timeoutSeconds instead",
    "checkpoint.owner": "remove it (the pipeline's uid owns its checkpoint root)",
    "checkpoint.adopt": "use spec.checkpointing.adopt instead",
    "restart.strategy": "use spec.failover.restartStrategy instead",
    "restart.attempts": "use spec.failover.maxRestarts instead",
    "restart.delay_ms": "use spec.failover.restartDelaySeconds instead",
    "restart.max_delay_ms": "use spec.failover.maxRestartDelaySeconds instead",
    "restart.multiplier": "use spec.failover.backoffMultiplier instead",
    "restart.jitter": "use spec.failover.backoffJitter instead",
    "restart.reset_after_ms": "use spec.failover.resetAfterSeconds instead",
    "restart.interval_ms": "use spec.failover.failureRateIntervalSeconds instead",
    "failover.strategy": "use spec.failover.strategy instead",
    "local_recovery.enabled": "use spec.localRecovery.enabled instead",
    "local_recovery.standby": "use spec.localRecovery.standby instead",
}


def _operator_config(key: str) -> str | None:
    """Why spec.config ``key`` is refused, if the operator sets it or it is a whole section
    (a YAML mapping) holding a key the operator sets."""
    name = key.replace("-", "_")  # as the runtime reads it
    for owned, instead in OPERATOR_CONFIG.items():
        if name == owned or name.startswith(f"{owned}."):
            return f"spec.config.{key} is set by the operator; {instead}"
        if owned.startswith(f"{name}."):
            return (
                f"spec.config.{key}: a whole section would replace {owned}, which the "
                f"operator sets; set its keys one by one ({key}.<key>)"
            )
    return None


# Fields holding a location the driver and the operator reach with the pipeline's credentials.
S3_FIELDS = (
    ("checkpointing", "storage"),
    ("savepoints", "directory"),
    ("restore", "initialSavepoint"),
)


def validate(spec: dict[str, Any]) -> None:
    """Checks the schema cannot express."""
    for path in S3_FIELDS:
        value = get(spec, *path, default="") or ""
        scheme = str(value).split(":", 1)[0].lower() if ":" in str(value) else ""
        if scheme in ("s3", "s3a") and not get(spec, "checkpointing", "credentialsSecret"):
            raise SpecError(
                f"spec.{'.'.join(path)} is on s3 ({value}): spec.checkpointing.credentialsSecret "
                f"is required for s3:// locations: name a Secret with AWS_ACCESS_KEY_ID and "
                f"AWS_SECRET_ACCESS_KEY"
            )
    _check_local_recovery(spec)
    for key in get(spec, "config", default={}) or {}:
        name = key.replace("-", "_")  # as the runtime reads it
        if name in CREDENTIAL_KEYS:
            raise SpecError(
                f"spec.config.{key}: credentials are not accepted in plain text (they would "
                f"be stored in a ConfigMap); put them in a Secret with AWS_ACCESS_KEY_ID and "
                f"AWS_SECRET_ACCESS_KEY and name it in spec.checkpointing.credentialsSecret"
            )
        refused = _operator_config(key)
        if refused:
            raise SpecError(refused)


def checkpoint_storage(spec: dict[str, Any]) -> str:
    return str(get(spec, "checkpointing", "storage", default="") or "")


def checkpoint_root(spec: dict[str, Any], name: str, namespace: str) -> str:
    """Where the pipeline's driver keeps its checkpoints (no trailing '/')."""
    return f"{checkpoint_storage(spec).rstrip('/')}/{job_name(namespace, name)}"


def check_transition(
    running: dict[str, Any], spec: dict[str, Any], suspended_with: str | None
) -> None:
    """Changes from the running spec that would do something else than they say without a
    word: a restore from ``latest`` looks for checkpoints under the *new* spec's storage,
    which holds none of this job's (the job would start empty), and a new
    ``restore.initialSavepoint`` is read by no one (only the first deployment restores from
    it). ``suspended_with``: the restore source of a suspended pipeline (None: not
    suspended)."""
    was = get(running, "restore", "initialSavepoint", default="") or ""
    now = get(spec, "restore", "initialSavepoint", default="") or ""
    if now and now != was:
        raise SpecError(
            f"spec.restore.initialSavepoint changed from {was or 'none'} to {now}: only the "
            f"first deployment restores from it, and this pipeline runs from its own "
            f"checkpoints and savepoints; put it back (or remove it), or delete the pipeline "
            f"and apply it again to start from {now}"
        )
    old, new = checkpoint_storage(running), checkpoint_storage(spec)
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
    if upgrade_mode(spec) is UpgradeMode.LAST_STATE:
        raise SpecError(
            f"{moved}: a last-state upgrade resumes from the latest checkpoint, and this "
            f"job's checkpoints are under {old}; set upgradeMode: savepoint (the savepoint "
            f"carries the state over) or stateless (start empty), or put the storage back"
        )


class Pinning(StrEnum):
    """Where executors keep their state, and what happens when its node is lost."""

    REQUIRED = "required"  # a local volume; the executor waits for its node to come back
    PREFERRED = "preferred"  # a local volume; released to another node when its node is lost
    OFF = "off"  # no volume of its own: state lives as long as the executor pod


def pinning(spec: dict[str, Any]) -> Pinning:
    """``localRecovery.pinning``; by default ``preferred`` with a volume, ``off`` without."""
    named = get(spec, "localRecovery", "pinning")
    if named is not None:
        return Pinning(named)
    return Pinning.PREFERRED if get(spec, "localRecovery", "volume") else Pinning.OFF


def executor_instances(spec: dict[str, Any]) -> int:
    """Executor pods: ``spec.executor.instances``, by default enough cores for ``replicas``."""
    executor = spec.get("executor") or {}
    cores = int(executor.get("cores", 1))
    replicas = int(spec.get("replicas", JobConfig.parallelism))
    return int(executor.get("instances", -(-replicas // cores)))


def _check_local_recovery(spec: dict[str, Any]) -> None:
    local = spec.get("localRecovery")
    if local is None:
        return
    if local.get("standby") and (spec.get("executor") is None or executor_instances(spec) < 2):
        raise SpecError(
            "spec.localRecovery.standby keeps each keyed subtask's checkpoint on a second "
            "executor pod: give spec.executor at least 2 instances, or remove standby"
        )
    if local.get("standby") and local.get("enabled") is False:
        raise SpecError(
            "spec.localRecovery.standby: local recovery is disabled (enabled: false), and "
            "only local recovery reads standby copies; enable it or remove standby"
        )
    if spec.get("executor") is None and (local.get("volume") or local.get("pinning")):
        raise SpecError(
            "spec.localRecovery.volume and .pinning place executor pods, but the pipeline has "
            "no spec.executor (it runs in the driver pod): add spec.executor, or remove them"
        )
    named = local.get("pinning")
    if named in (Pinning.REQUIRED, Pinning.PREFERRED) and not local.get("volume"):
        raise SpecError(
            f"spec.localRecovery.pinning: {named} keeps each executor's state on a local "
            f"volume of its node; name one in spec.localRecovery.volume (storageClassName of "
            f"local PersistentVolumes, size), or set pinning: off"
        )
    if named == Pinning.OFF and local.get("volume"):
        raise SpecError(
            "spec.localRecovery.volume: with pinning: off executors keep state in the pod "
            "only; remove the volume, or choose pinning: preferred or required"
        )
    if local.get("enabled") is False and local.get("volume"):
        raise SpecError(
            "spec.localRecovery.volume: local recovery is disabled (enabled: false), so "
            "nothing would use the volume; remove it or enable local recovery"
        )


def attempt_fingerprint(spec: dict[str, Any]) -> str:
    """A digest of the whole spec but ``state`` (and the savepoint trigger): what a failed
    flow tried, so that any change (a longer savepoint timeout, another upgrade mode) tries
    again while resuming or suspending does not."""
    rest = {k: v for k, v in spec.items() if k != "state"}
    savepoints = {k: v for k, v in (rest.get("savepoints") or {}).items() if k != "triggerNonce"}
    if savepoints:
        rest["savepoints"] = savepoints
    return hashlib.sha256(json.dumps(rest, sort_keys=True).encode()).hexdigest()[:16]


def fingerprint(spec: dict[str, Any]) -> str:
    """A short digest of the fields that matter, to recognise a spec seen before."""
    return hashlib.sha256(json.dumps(comparable(spec), sort_keys=True).encode()).hexdigest()[:16]
