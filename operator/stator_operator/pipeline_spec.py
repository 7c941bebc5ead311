"""The StatefulPipeline spec, parsed once: typed, frozen, with the CRD's defaults applied here
(``_read``, the one place) and nowhere else (a unit test holds them to the CRD's openAPI
``default:`` values).

:meth:`PipelineSpec.parse` also runs the checks the CRD schema cannot express (a spec the
API server accepts but the operator cannot run: :class:`SpecError`, naming the field and the
fix). :meth:`PipelineSpec.read` reads a spec without them: one recorded in status (the
running deployment's, a flow's target), checked when it was accepted; today's checks are for
the next spec, not the one that runs. The raw mapping is kept (``raw``) for what must pass
through verbatim: the spec recorded in status, its fingerprints and comparisons."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from stator.config import CREDENTIAL_KEYS, JobConfig
from stator.lineage import default_savepoint_root

from .naming import job_name

# The runtime's default, the effective value of an absent spec.replicas (status.replicas,
# rescale detection); the job config only gets what is set.
DEFAULT_REPLICAS = JobConfig().parallelism


class SpecError(ValueError):
    """A spec the CRD schema accepts but the operator cannot run; the message names the
    field and the fix."""


class UpgradeMode(StrEnum):
    SAVEPOINT = "savepoint"
    LAST_STATE = "last-state"
    STATELESS = "stateless"


class DesiredState(StrEnum):
    """``spec.state``."""

    RUNNING = "running"
    SUSPENDED = "suspended"


class Pinning(StrEnum):
    """Where executors keep their state, and what happens when its node is lost."""

    REQUIRED = "required"  # a local volume; the executor waits for its node to come back
    PREFERRED = "preferred"  # a local volume; released to another node when its node is lost
    OFF = "off"  # no volume of its own: state lives as long as the executor pod


@dataclass(frozen=True)
class DriverSpec:
    # Passed into the driver pod as given (admission.check_pods names a malformed one).
    env: tuple[Any, ...]
    resources: Any
    pod_template: Any
    # An upgrade or rescale by savepoint starts its new driver before it stops the old one.
    prestart: bool


@dataclass(frozen=True)
class ExecutorSpec:
    instances: int | None  # None: enough cores for the replicas
    cores: int
    memory: str
    env: tuple[Any, ...]


@dataclass(frozen=True)
class CheckpointingSpec:
    storage: str
    credentials_secret: str | None
    endpoint: str | None
    interval_epochs: int
    interval_seconds: int
    retained: int
    incremental: bool
    adopt: bool
    # None: not set; the runtime's default (JobConfig), which equals the CRD's (a unit test
    # holds them together). The job config passes only what the spec sets.
    async_upload: bool | None
    max_concurrent: int | None
    timeout_seconds: int | None
    tolerable_failures: int | None
    progress_window_seconds: int | None


@dataclass(frozen=True)
class SavepointsSpec:
    directory: str | None  # None: beside the checkpoints
    format_type: str | None  # None: the runtime's (canonical)
    timeout_seconds: float
    trigger_nonce: int | None
    periodic_seconds: int  # 0: none
    history_max_count: int
    history_max_age_seconds: int | None
    dispose_on_delete: bool


@dataclass(frozen=True)
class RestoreSpec:
    initial_savepoint: str | None
    allow_non_restored_state: bool


@dataclass(frozen=True)
class FailoverSpec:
    strategy: str
    restart_strategy: str
    max_restarts: int
    # None: not set; the runtime's default (config.RestartConfig).
    restart_delay_seconds: float | None
    max_restart_delay_seconds: float | None
    backoff_multiplier: float | None
    backoff_jitter: float | None
    reset_after_seconds: float | None
    failure_rate_interval_seconds: float | None
    readiness_timeout_seconds: float


@dataclass(frozen=True)
class VolumeSpec:
    storage_class_name: str
    size: str


@dataclass(frozen=True)
class LocalRecoverySpec:
    enabled: bool
    standby: bool
    pinning: Pinning | None  # None: preferred with a volume, off without
    volume: VolumeSpec | None


@dataclass(frozen=True)
class DeletionSpec:
    final_savepoint: bool
    dispose_final_savepoint: bool
    timeout_seconds: float


@dataclass(frozen=True)
class AutoscalerSpec:
    """``spec.autoscaler``: keep up with the input at the least parallelism (docs/operator.md
    "Autoscaling"; the decision is ``autoscaling/decision.py``). Off unless ``enabled``."""

    enabled: bool = False
    dry_run: bool = False  # decide and record, never patch replicas
    min_replicas: int = 1
    max_replicas: int | None = None  # None: the job's maxParallelism
    # The busiest keyed subtask's share of busy time a chosen parallelism aims at: the rest
    # is headroom (an epoch's fixed cost, bursts).
    target_utilization: float = 0.7
    # The backlog (the lag, and what builds up while a rescale stops the job) is to be read
    # within this long; a job that cannot do so at its parallelism is scaled up.
    catch_up_seconds: int = 300
    metrics_window_seconds: int = 60  # the rates and busy time a decision reads
    # A new parallelism must have been recommended for this long before it is applied (the
    # lowest over the window up, the highest down: HPA's stabilization, and its defaults:
    # a scale-up answers lag at once, a scale-down waits out a lull).
    scale_up_stabilization_seconds: int = 0
    scale_down_stabilization_seconds: int = 300
    max_scale_factor: float = 2.0  # one step at most multiplies or divides replicas by this
    cooldown_seconds: int = 60  # after a rescale: no decision, metrics from its new driver


@dataclass(frozen=True)
class PipelineSpec:
    raw: dict[str, Any]  # the spec as given, for what passes it through verbatim (read only)
    image: str
    entrypoint: str
    image_pull_policy: str
    replicas: int | None  # None: the runtime's default (``parallelism``)
    max_parallelism: int | None
    upgrade_mode: UpgradeMode
    state: DesiredState
    driver: DriverSpec
    executor: ExecutorSpec | None  # None: Spark runs in the driver pod
    spark_conf: Mapping[str, Any]
    config: Mapping[str, Any]  # user keys, to the job config
    checkpointing: CheckpointingSpec
    savepoints: SavepointsSpec
    restore: RestoreSpec
    failover: FailoverSpec
    local_recovery: LocalRecoverySpec | None  # None: not given (the runtime's)
    deletion: DeletionSpec
    autoscaler: AutoscalerSpec

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> PipelineSpec:
        """The spec, checked: raises :class:`SpecError` naming the field."""
        spec = cls.read(raw)
        _check(spec)
        return spec

    @classmethod
    def read(cls, raw: Mapping[str, Any]) -> PipelineSpec:
        """The spec with its defaults, without the checks (see the module docstring)."""
        return _read(raw)

    @property
    def parallelism(self) -> int:
        """The parallelism the spec runs at: ``replicas``, else the runtime's default."""
        return DEFAULT_REPLICAS if self.replicas is None else self.replicas

    @property
    def savepoint_dir(self) -> str:
        """Where the pipeline's savepoints go: ``savepoints.directory``, else beside its
        checkpoints."""
        named = self.savepoints.directory
        return named or default_savepoint_root(self.checkpointing.storage)

    def checkpoint_root(self, name: str, namespace: str) -> str:
        """Where the pipeline's driver keeps its checkpoints (no trailing '/')."""
        return f"{self.checkpointing.storage.rstrip('/')}/{job_name(namespace, name)}"

    @property
    def pinning(self) -> Pinning:
        """``localRecovery.pinning``; by default ``preferred`` with a volume, ``off``
        without."""
        local = self.local_recovery
        if local is not None and local.pinning is not None:
            return local.pinning
        return Pinning.PREFERRED if local is not None and local.volume else Pinning.OFF

    @property
    def executor_instances(self) -> int:
        """Executor pods: ``executor.instances``, by default enough cores for ``replicas``."""
        if self.executor is None:
            return self.parallelism  # one core each (the default of ``executor.cores``)
        if self.executor.instances is not None:
            return self.executor.instances
        return -(-self.parallelism // self.executor.cores)


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
    "checkpoint.tolerable_failures": "use spec.checkpointing.tolerableFailures instead",
    "checkpoint.progress_window_ms": "use spec.checkpointing.progressWindowSeconds instead",
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


def _check(spec: PipelineSpec) -> None:
    """Checks the schema cannot express."""
    locations = (
        ("checkpointing.storage", spec.checkpointing.storage),
        ("savepoints.directory", spec.savepoints.directory),
        ("restore.initialSavepoint", spec.restore.initial_savepoint),
    )  # reached by the driver and the operator with the pipeline's credentials
    for field_name, value in locations:
        scheme = value.split(":", 1)[0].lower() if value and ":" in value else ""
        if scheme in ("s3", "s3a") and not spec.checkpointing.credentials_secret:
            raise SpecError(
                f"spec.{field_name} is on s3 ({value}): spec.checkpointing.credentialsSecret "
                f"is required for s3:// locations: name a Secret with AWS_ACCESS_KEY_ID and "
                f"AWS_SECRET_ACCESS_KEY"
            )
    _check_local_recovery(spec)
    _check_progress_window(spec.checkpointing)
    _check_autoscaler(spec)
    for key in spec.config:
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


def _check_progress_window(ck: CheckpointingSpec) -> None:
    """The window against the interval, in the spec's own fields (the runtime's check names
    its keys)."""
    window = ck.progress_window_seconds or 0
    if 0 < window <= ck.interval_seconds:
        raise SpecError(
            f"spec.checkpointing.progressWindowSeconds ({window}) must exceed "
            f"spec.checkpointing.intervalSeconds ({ck.interval_seconds}): an epoch may wait "
            f"that long for the next checkpoint to begin, so the window could never be met; "
            f"raise the window or lower the interval"
        )


def _check_autoscaler(spec: PipelineSpec) -> None:
    """Bounds the schema cannot relate to each other, and what would keep executors from
    following the replicas the autoscaler chooses."""
    auto = spec.autoscaler
    if not auto.enabled:
        return
    if not 0 < auto.target_utilization <= 1:
        raise SpecError(
            f"spec.autoscaler.targetUtilization ({auto.target_utilization}) must be above 0 "
            f"and at most 1 (the busiest subtask's busy share); 0.7 leaves 30% headroom"
        )
    if auto.max_scale_factor <= 1:
        raise SpecError(
            f"spec.autoscaler.maxScaleFactor ({auto.max_scale_factor}) must exceed 1, or no "
            f"rescale could change replicas; 2 at most doubles or halves them"
        )
    low, high = auto.min_replicas, auto.max_replicas
    if high is not None and low > high:
        raise SpecError(
            f"spec.autoscaler.minReplicas ({low}) exceeds spec.autoscaler.maxReplicas "
            f"({high}); lower minReplicas or raise maxReplicas"
        )
    limit = spec.max_parallelism
    for field_name, value in (("minReplicas", low), ("maxReplicas", high)):
        if limit is not None and value is not None and value > limit:
            raise SpecError(
                f"spec.autoscaler.{field_name} ({value}) exceeds spec.maxParallelism "
                f"({limit}): a keyed operator has at most one subtask per key-group; lower "
                f"{field_name}"
            )
    if spec.executor is not None and spec.executor.instances is not None:
        raise SpecError(
            "spec.executor.instances fixes the executor pods, but with spec.autoscaler "
            "enabled they follow the replicas it chooses (enough cores for them); remove "
            "spec.executor.instances"
        )
    local = spec.local_recovery
    if local is not None and local.standby and spec.executor is not None:
        cores = spec.executor.cores
        if -(-low // cores) < 2:
            raise SpecError(
                f"spec.localRecovery.standby needs at least 2 executor pods, and at "
                f"spec.autoscaler.minReplicas ({low}) with {cores} core(s) each there would be "
                f"one; raise minReplicas to {cores + 1} or more, or remove standby"
            )


def _check_local_recovery(spec: PipelineSpec) -> None:
    local = spec.local_recovery
    if local is None:
        return
    if local.standby and (spec.executor is None or spec.executor_instances < 2):
        raise SpecError(
            "spec.localRecovery.standby keeps each keyed subtask's checkpoint on a second "
            "executor pod: give spec.executor at least 2 instances, or remove standby"
        )
    if local.standby and not local.enabled:
        raise SpecError(
            "spec.localRecovery.standby: local recovery is disabled (enabled: false), and "
            "only local recovery reads standby copies; enable it or remove standby"
        )
    if spec.executor is None and (local.volume or local.pinning):
        raise SpecError(
            "spec.localRecovery.volume and .pinning place executor pods, but the pipeline has "
            "no spec.executor (it runs in the driver pod): add spec.executor, or remove them"
        )
    named = local.pinning
    if named in (Pinning.REQUIRED, Pinning.PREFERRED) and not local.volume:
        raise SpecError(
            f"spec.localRecovery.pinning: {named} keeps each executor's state on a local "
            f"volume of its node; name one in spec.localRecovery.volume (storageClassName of "
            f"local PersistentVolumes, size), or set pinning: off"
        )
    if named is Pinning.OFF and local.volume:
        raise SpecError(
            "spec.localRecovery.volume: with pinning: off executors keep state in the pod "
            "only; remove the volume, or choose pinning: preferred or required"
        )
    if not local.enabled and local.volume:
        raise SpecError(
            "spec.localRecovery.volume: local recovery is disabled (enabled: false), so "
            "nothing would use the volume; remove it or enable local recovery"
        )


# ---------------------------------------------------------------------------- reading


T = TypeVar("T")


class _Section:
    """One mapping of the spec, read field by field; a value of the wrong type is a
    SpecError naming its field."""

    def __init__(self, raw: Any, path: str) -> None:
        self.raw: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
        self.path = path

    def get(self, key: str, convert: Callable[[Any], T], default: T) -> T:
        value = self.raw.get(key)
        if value is None:
            return default
        try:
            return convert(value)
        except (TypeError, ValueError) as exc:
            raise SpecError(f"{self.path}.{key}: {value!r:.80} is not valid ({exc})") from exc

    def optional(self, key: str, convert: Callable[[Any], T]) -> T | None:
        return self.get(key, convert, None)

    def section(self, key: str) -> _Section:
        return _Section(self.raw.get(key), f"{self.path}.{key}")

    def has(self, key: str) -> bool:
        return self.raw.get(key) is not None


def _read(raw: Mapping[str, Any]) -> PipelineSpec:
    top = _Section(raw, "spec")
    d, e, c = top.section("driver"), top.section("executor"), top.section("checkpointing")
    s, r, f = top.section("savepoints"), top.section("restore"), top.section("failover")
    lr, dl = top.section("localRecovery"), top.section("deletion")
    a = top.section("autoscaler")
    volume = lr.section("volume")
    return PipelineSpec(
        raw=dict(raw),
        image=top.get("image", str, ""),
        entrypoint=top.get("entrypoint", str, ""),
        image_pull_policy=top.get("imagePullPolicy", str, "IfNotPresent"),
        replicas=top.optional("replicas", int),
        max_parallelism=top.optional("maxParallelism", int),
        upgrade_mode=top.get("upgradeMode", UpgradeMode, UpgradeMode.SAVEPOINT),
        state=top.get("state", DesiredState, DesiredState.RUNNING),
        driver=DriverSpec(
            env=tuple(d.raw.get("env") or ()),
            resources=d.raw.get("resources") or None,
            pod_template=d.raw.get("podTemplate") or None,
            prestart=d.get("prestart", bool, True),
        ),
        executor=None
        if not top.has("executor")
        else ExecutorSpec(
            instances=e.optional("instances", int),
            cores=e.get("cores", int, 1),
            memory=e.get("memory", str, "1g"),
            env=tuple(e.raw.get("env") or ()),
        ),
        spark_conf=dict(top.section("sparkConf").raw),
        config=dict(top.section("config").raw),
        checkpointing=CheckpointingSpec(
            storage=c.get("storage", str, ""),
            credentials_secret=c.optional("credentialsSecret", str) or None,
            endpoint=c.optional("endpoint", str) or None,
            interval_epochs=c.get("intervalEpochs", int, 1),
            interval_seconds=c.get("intervalSeconds", int, 0),
            retained=c.get("retained", int, 3),
            incremental=c.get("incremental", bool, True),
            adopt=c.get("adopt", bool, False),
            async_upload=c.optional("asyncUpload", bool),
            max_concurrent=c.optional("maxConcurrent", int),
            timeout_seconds=c.optional("timeoutSeconds", int),
            tolerable_failures=c.optional("tolerableFailures", int),
            progress_window_seconds=c.optional("progressWindowSeconds", int),
        ),
        savepoints=SavepointsSpec(
            directory=s.optional("directory", str) or None,
            format_type=s.optional("formatType", str) or None,
            timeout_seconds=s.get("timeoutSeconds", float, 300.0),
            trigger_nonce=s.optional("triggerNonce", int),
            periodic_seconds=s.get("periodicSeconds", int, 0),
            history_max_count=s.get("historyMaxCount", int, 5) or 5,
            history_max_age_seconds=s.optional("historyMaxAgeSeconds", int) or None,
            dispose_on_delete=s.get("disposeOnDelete", bool, False),
        ),
        restore=RestoreSpec(
            initial_savepoint=r.optional("initialSavepoint", str) or None,
            allow_non_restored_state=r.get("allowNonRestoredState", bool, False),
        ),
        failover=FailoverSpec(
            strategy=f.get("strategy", str, "region"),
            restart_strategy=f.get("restartStrategy", str, "exponential-backoff"),
            max_restarts=f.get("maxRestarts", int, 10),
            restart_delay_seconds=f.optional("restartDelaySeconds", float),
            max_restart_delay_seconds=f.optional("maxRestartDelaySeconds", float),
            backoff_multiplier=f.optional("backoffMultiplier", float),
            backoff_jitter=f.optional("backoffJitter", float),
            reset_after_seconds=f.optional("resetAfterSeconds", float),
            failure_rate_interval_seconds=f.optional("failureRateIntervalSeconds", float),
            readiness_timeout_seconds=f.get("readinessTimeoutSeconds", float, 300.0),
        ),
        local_recovery=None
        if not top.has("localRecovery")
        else LocalRecoverySpec(
            enabled=lr.get("enabled", bool, True),
            standby=lr.get("standby", bool, False),
            pinning=lr.optional("pinning", Pinning),
            volume=VolumeSpec(
                storage_class_name=volume.get("storageClassName", str, ""),
                size=volume.get("size", str, ""),
            )
            if volume.raw
            else None,
        ),
        deletion=DeletionSpec(
            final_savepoint=dl.get("finalSavepoint", bool, True),
            dispose_final_savepoint=dl.get("disposeFinalSavepoint", bool, False),
            timeout_seconds=dl.get("timeoutSeconds", float, 300.0),
        ),
        autoscaler=AutoscalerSpec(
            enabled=a.get("enabled", bool, False),
            dry_run=a.get("dryRun", bool, False),
            min_replicas=a.get("minReplicas", int, 1),
            max_replicas=a.optional("maxReplicas", int),
            target_utilization=a.get("targetUtilization", float, 0.7),
            catch_up_seconds=a.get("catchUpSeconds", int, 300),
            metrics_window_seconds=a.get("metricsWindowSeconds", int, 60),
            scale_up_stabilization_seconds=a.get("scaleUpStabilizationSeconds", int, 0),
            scale_down_stabilization_seconds=a.get("scaleDownStabilizationSeconds", int, 300),
            max_scale_factor=a.get("maxScaleFactor", float, 2.0),
            cooldown_seconds=a.get("cooldownSeconds", int, 60),
        ),
    )
