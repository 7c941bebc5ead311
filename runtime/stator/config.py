"""Job configuration: frozen dataclasses with documented defaults, loaded from YAML and
``--set key=value`` overrides. An unknown key or a value of the wrong type is an error that
names the key, what it expected, and (for a misspelling) the key that was probably meant."""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import tempfile
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from .errors import ConfigError
from .keygroups import MAX_MAX_PARALLELISM
from .state.options import RocksDBOptions
from .storage import S3Options

# Not "<tmp>/stator": a directory of that name would shadow the package for scripts in /tmp.
DEFAULT_ROOT = Path(os.environ.get("STATOR_HOME") or Path(tempfile.gettempdir()) / "stator-data")
# Config keys whose values are never shown (errors, logs, status).
CREDENTIAL_KEYS = ("s3.access_key_id", "s3.secret_access_key")
# A job's name is one path segment of its checkpoint and savepoint roots (the operator's is
# <namespace>.<name>).
JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


@dataclass(frozen=True)
class EpochConfig:
    # Records read per epoch, over all splits of all sources. Larger epochs amortize Spark's
    # per-job overhead; smaller ones lower latency and the memory a task needs.
    max_records: int = 200_000
    # An epoch's time budget (``driver/epoch_budget.py``): > 0 reads at most what recent
    # epochs processed in this long, so a backlog or a burst is taken in epochs of about
    # this duration instead of one long epoch whose records all wait for its end. 0: none
    # (only max_records). For low latency: docs/runtime.md "Latency".
    max_ms: int = 0
    # When no input is available, wait this long before planning again.
    idle_wait_ms: int = 200
    # How an epoch runs: "per-epoch", one Spark job per epoch; "long-running", one Spark
    # job whose source and keyed tasks stay up across epochs and take each epoch from the
    # driver, their data sent task to task (``longrun/``): no per-epoch Spark scheduling,
    # for low latency (docs/runtime.md "Latency"). It needs a task slot per source split
    # and per keyed subtask at once.
    tasks: str = "per-epoch"
    # Stop when every source is exhausted (bounded sources); otherwise wait for more input.
    stop_when_finished: bool = True


PER_EPOCH, LONG_RUNNING = "per-epoch", "long-running"
EPOCH_TASKS = (PER_EPOCH, LONG_RUNNING)

INLINE_LIMIT = 1 << 20  # checkpoint.inline_max_bytes at most


@dataclass(frozen=True)
class CheckpointConfig:
    # Where checkpoints live: file:///path or s3://bucket/prefix. The job's name is appended.
    storage: str = f"file://{DEFAULT_ROOT}/checkpoints"
    enabled: bool = True
    # Checkpoint every N epochs...
    every_epochs: int = 1
    # ...or, if > 0, this long after the previous checkpoint was triggered (Flink's interval;
    # setting both is refused).
    interval_ms: int = 0
    # Either way, never sooner than this after the previous checkpoint ended (completed or
    # failed), and while > 0 one checkpoint at a time (Flink's minimum pause): processing
    # gets this much time between checkpoints however long they take.
    min_pause_ms: int = 0
    retained: int = 3
    incremental: bool = True
    # Upload in the background (Flink's asynchronous part): a keyed task takes the RocksDB
    # snapshot, hands its upload to its worker's uploader process and returns, so the next
    # epochs overlap the upload. The checkpoint completes, and sinks commit, when every
    # upload is confirmed. Off: the task uploads before it returns (processing waits for
    # the store; sinks commit as soon as the epoch ends).
    async_upload: bool = True
    # Checkpoints whose uploads may be in flight at once. An epoch that takes a checkpoint
    # waits while this many are in flight: it bounds how far processing runs ahead of the
    # store (and so the replay after a failure and the delay of sink commits).
    max_concurrent: int = 2
    # A checkpoint whose uploads are not confirmed within this time fails (the next one is
    # taken as usual); an uploader stops sending files for it past this time.
    timeout_ms: int = 600_000
    # Private database files of at most this many bytes (RocksDB's CURRENT, MANIFEST, OPTIONS;
    # small SSTs of full checkpoints: shared ones stay objects, which later checkpoints
    # re-reference) go into the checkpoint's metadata instead of objects of their own (Flink's
    # state.storage.fs.memory-threshold, 20 KB by default): most of a checkpoint's requests
    # are for them. 0: every file is an object. At most 1 MiB per file (the metadata is read
    # whole, and held by the driver: a large value with full checkpoints inlines every SST
    # up to it).
    inline_max_bytes: int = 20_480
    # The job that owns the checkpoint root (``checkpoint/ownership.py``; the operator sets
    # a pipeline's uid). Empty: no owner marker is written or checked.
    owner: str = ""
    # Take the root over from another owner instead of refusing to start (a pipeline
    # recreated under its predecessor's name, which no longer runs).
    adopt: bool = False
    # Health (``driver/checkpoint_health.py``; docs/runtime.md "Checkpoint health"): the job
    # fails over, through the restart strategy, to its latest completed checkpoint when
    # more than this many checkpoints in a row fail (Flink's
    # execution.checkpointing.tolerable-failed-checkpoints). A completed checkpoint and a
    # failover start the count over; checkpoints aborted because the job fails over do not
    # count. -1: never (a failed checkpoint is only retried by the next).
    tolerable_failures: int = 3
    # ...or when the output and state of an epoch have waited this long for a checkpoint
    # that covers them (the Flink operator's checkpoint-progress check). Only epochs that
    # ran count: an idle job with nothing to cover is healthy. 0: off.
    progress_window_ms: int = 0


@dataclass(frozen=True)
class SavepointConfig:
    # Where savepoints go unless a trigger names a target: <dir>/<job>/savepoint-<epoch>-<id>.
    dir: str = f"file://{DEFAULT_ROOT}/savepoints"
    # Per key-group compression of canonical savepoint files.
    compression: Literal["zlib", "none"] = "zlib"
    # Savepoints unless a trigger says otherwise (Flink's format types): ``canonical``
    # (key-group files in Stator's own format; a restore at another parallelism reads only
    # what it owns; state_reader reads it) or ``native`` (each subtask's RocksDB files: written
    # and restored at the object store's speed, but a rescaling restore reads every
    # overlapping subtask's whole database). docs/savepoints.md compares them.
    format_type: Literal["canonical", "native"] = "canonical"
    # Whether a trigger may name a target outside ``dir`` (the control API refuses it
    # otherwise: a caller could make the job write anywhere its credentials reach).
    any_target: bool = False


@dataclass(frozen=True)
class ControlConfig:
    # The driver's HTTP control API (status, checkpoints, savepoints, health, metrics).
    # port -1 turns it off, 0 picks a free port; in Kubernetes the operator sets host 0.0.0.0
    # and a fixed port.
    host: str = "127.0.0.1"
    port: int = -1
    # After a stop-with-savepoint, keep answering until a client has read the result (the
    # operator polls for it), at most this long.
    linger_ms: int = 30_000
    # A file holding the bearer token every request but /healthz and /readyz must carry
    # (the operator mounts one from the pipeline's Secret). None: no authentication, for a
    # control API on 127.0.0.1.
    token_file: str | None = None
    # A file holding a second, read-only token: it may GET (status, checkpoints, savepoints,
    # history, metrics) and nothing else, for scrapers and dashboards that must not be able to
    # stop the job (the operator mounts one from the pipeline's ``NAME-read`` Secret). Needs
    # ``token_file``: without it the whole API is open anyway.
    read_token_file: str | None = None
    # The exit status of `stator run` when the job ends stopped by a stop-with-savepoint
    # (a finished job exits 0). The operator sets 3, so that a stop it did not ask for is
    # not mistaken for a job that read all its input.
    stopped_exit_code: int = 0


@dataclass(frozen=True)
class LeaseConfig:
    # At most one driver of a job writes checkpoints, savepoints and sink commits: in
    # Kubernetes the driver holds a Lease (coordination.k8s.io) of this name in its own
    # namespace (the operator creates it and sets the name) and writes nothing unless it
    # surely holds it (stator.ha.fencing). None: no lease (one machine, one driver).
    name: str | None = None
    # A replacement driver takes over when the holder has not renewed for this long; the
    # holder stops writing ``renew_ms`` before that.
    duration_ms: int = 15_000
    renew_ms: int = 5_000


@dataclass(frozen=True)
class StateConfig:
    # Executor-local directory for RocksDB databases and local snapshots.
    local_dir: str = str(DEFAULT_ROOT / "state")
    rocksdb: RocksDBOptions = field(default_factory=RocksDBOptions)
    # Decoded values a Python worker keeps per subtask between epochs, so the next epoch
    # does not re-read them from RocksDB (0 turns it off). About 150 bytes per entry.
    warm_cache_entries: int = 500_000


@dataclass(frozen=True)
class LocalRecoveryConfig:
    # Keep each checkpoint's files on the executor too (hard links to the live database: no
    # extra bytes written) and restore from them when they match the checkpoint's metadata.
    # The object store stays the primary copy and the truth. Off: every restore downloads.
    enabled: bool = True
    # With several executors: after a failure, how long the job waits for a lost executor's
    # replacement (same node and volume, same local copies) before that executor's subtasks
    # restore from the object store elsewhere. Waited only while fewer executors are
    # registered than requested; also the longest the first epoch waits for the requested
    # executors to register before spreading its subtasks over those that did.
    executor_wait_ms: int = 20_000
    # With several executors: also keep each keyed subtask's latest completed checkpoint on a
    # second executor (read from the object store in the background, after each checkpoint:
    # its new files only). When an executor is lost its subtasks resume on the running
    # executors that hold their copies, without waiting for a replacement. Costs each
    # checkpoint's new files read once more and the copies' room on the executors' disks.
    standby: bool = False


@dataclass(frozen=True)
class RestartConfig:
    # What a failed epoch does (driver/restart.py has the rules):
    # fixed-delay: up to `attempts` restarts in the job's life, `delay_ms` apart.
    # exponential-backoff: `delay_ms`, x `multiplier` per restart up to `max_delay_ms`, each
    #   spread by +-`jitter` (a fraction); after `reset_after_ms` without a failure the delay
    #   and the count start over; at most `attempts` restarts between resets.
    # failure-rate: give up when more than `attempts` failures fall within `interval_ms`;
    #   otherwise restart after `delay_ms`.
    # none: fail the job on the first failure.
    strategy: Literal["fixed-delay", "exponential-backoff", "failure-rate", "none"] = "fixed-delay"
    attempts: int = 3
    delay_ms: int = 1000
    max_delay_ms: int = 60_000
    multiplier: float = 2.0
    jitter: float = 0.1
    reset_after_ms: int = 600_000
    interval_ms: int = 60_000


@dataclass(frozen=True)
class FailoverConfig:
    # What a failed epoch restarts (driver/regions.py): "region" restarts only the failover
    # region it failed in (a weakly connected part of the graph; FLIP-1) while the others
    # keep processing and committing, each region with its own epochs, checkpoints (under
    # <checkpoint.storage>/<job>/regions/<region>/) and restart strategy; "full" runs the
    # whole graph as one job and rewinds all of it. A job with one region runs the same way
    # under both.
    strategy: Literal["region", "full"] = "region"


# Spark settings Stator runs with whatever the user configures (``spark.conf`` may not
# change them), and why.
SPARK_REQUIRED = {  # key -> (value, why)
    "spark.speculation": (
        "false",
        "a speculative copy of a keyed task would open the same RocksDB twice",
    ),
    "spark.python.worker.reuse": (
        "true",
        "Python workers keep their uploader and caches across epochs",
    ),
}


# Spark settings Stator derives from its own keys (``spark.conf`` may not set them: Stator's
# reading of them, e.g. which task attempt is the last, would disagree with Spark's).
SPARK_BY_KEY = {
    "spark.task.maxFailures": "spark.task_attempts",
    "spark.master": "spark.master",
}


@dataclass(frozen=True)
class SparkConfig:
    # local[N], local-cluster[...], a Spark master URL, or "kubernetes": executors as pods,
    # the driver being in a pod the operator created (cluster/kubernetes.py).
    master: str = "local[*]"
    # Attempts of each task (Spark's spark.task.maxFailures, for every master; local[N]
    # alone never retries a task).
    task_attempts: int = 4
    ui: bool = False
    conf: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RestoreConfig:
    # "latest": the newest completed checkpoint of this job, if any; "none": start empty
    # (refused if checkpoints exist, unless force_empty); or the URI of a checkpoint (chk-N)
    # or savepoint directory. A different parallelism than the state was written with rescales.
    source: str = "latest"
    force_empty: bool = False
    # The run this job continues or starts (the operator sets its flow's id; its checkpoints
    # record it). If this job's checkpoints include some of this lineage, the newest of
    # them is restored whatever ``source`` says: a restarted driver resumes its own run, not
    # the run's starting point (a savepoint, empty state) nor another run's checkpoint.
    lineage: str | None = None
    # Restoring state that the new code no longer has (an operator uid, or a state name in an
    # operator) fails unless this is set; then that state is dropped.
    allow_non_restored_state: bool = False


@dataclass(frozen=True)
class JobConfig:
    # Defaults to the pipeline's name. Checkpoints and local state are kept per job name.
    name: str | None = None
    # Subtasks of each keyed operator, unless the pipeline pins an operator's parallelism
    # explicitly (``.process(..., parallelism=N)``). The operator sets it from spec.replicas.
    parallelism: int = 2
    # Key-groups of every keyed operator: the upper bound of parallelism, fixed for the life
    # of the state. None: the pipeline's Pipeline(max_parallelism=...), else 128. If both the
    # config and the pipeline set it, they must agree. The operator sets it from
    # spec.maxParallelism.
    max_parallelism: int | None = None
    epoch: EpochConfig = field(default_factory=EpochConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    s3: S3Options = field(default_factory=S3Options)
    state: StateConfig = field(default_factory=StateConfig)
    local_recovery: LocalRecoveryConfig = field(default_factory=LocalRecoveryConfig)
    restart: RestartConfig = field(default_factory=RestartConfig)
    failover: FailoverConfig = field(default_factory=FailoverConfig)
    spark: SparkConfig = field(default_factory=SparkConfig)
    restore: RestoreConfig = field(default_factory=RestoreConfig)
    savepoint: SavepointConfig = field(default_factory=SavepointConfig)
    control: ControlConfig = field(default_factory=ControlConfig)
    lease: LeaseConfig = field(default_factory=LeaseConfig)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    def __post_init__(self) -> None:
        if self.name is not None and not JOB_NAME.match(self.name):
            raise ConfigError(
                f"name {self.name!r}: a job name is letters, digits, '.', '_' and '-' (at most "
                f"253, starting with a letter or digit): it names the job's directory under "
                f"checkpoint.storage and savepoint.dir"
            )
        if not -1 <= self.control.port <= 65535:
            raise ConfigError(
                f"control.port must be -1 (off), 0 (any free port) or 1-65535, "
                f"got {self.control.port}"
            )
        _positive(self, "parallelism", self.parallelism)
        if (
            self.max_parallelism is not None
            and not 1 <= self.max_parallelism <= MAX_MAX_PARALLELISM
        ):
            raise ConfigError(
                f"max_parallelism must be 1 to {MAX_MAX_PARALLELISM} (the key-groups of every "
                f"keyed operator, fixed for the life of the state), got {self.max_parallelism}; "
                f"leave it out for the pipeline's (else 128)"
            )
        _check_epoch(self)
        _at_least_zero("control.linger_ms", self.control.linger_ms)
        if self.control.read_token_file and not self.control.token_file:
            raise ConfigError(
                "control.read_token_file is set without control.token_file: a read-only "
                "token means nothing while the API takes requests without one; set "
                "control.token_file too, or unset control.read_token_file"
            )
        _at_least_zero("state.warm_cache_entries", self.state.warm_cache_entries)
        if not 0 <= self.control.stopped_exit_code <= 255:
            raise ConfigError(
                f"control.stopped_exit_code is a process exit status, 0 to 255, got "
                f"{self.control.stopped_exit_code}"
            )
        _positive(self, "checkpoint.every_epochs", self.checkpoint.every_epochs)
        _check_schedule(self.checkpoint)
        _positive(self, "checkpoint.retained", self.checkpoint.retained)
        _positive(self, "checkpoint.max_concurrent", self.checkpoint.max_concurrent)
        _positive(self, "checkpoint.timeout_ms", self.checkpoint.timeout_ms)
        _check_health(self.checkpoint)
        if not 0 <= self.checkpoint.inline_max_bytes <= INLINE_LIMIT:
            raise ConfigError(
                f"checkpoint.inline_max_bytes must be 0 (off) to {INLINE_LIMIT} (1 MiB), got "
                f"{self.checkpoint.inline_max_bytes}"
            )
        _positive(self, "spark.task_attempts", self.spark.task_attempts)
        _check_restart(self.restart)
        _positive(self, "lease.renew_ms", self.lease.renew_ms)
        if self.lease.duration_ms < 2 * self.lease.renew_ms:
            raise ConfigError(
                f"lease.duration_ms ({self.lease.duration_ms}) must be at least twice "
                f"lease.renew_ms ({self.lease.renew_ms}): the driver stops writing one renewal "
                f"period before its lease could lapse; raise duration_ms or lower renew_ms"
            )
        if self.local_recovery.executor_wait_ms < 0:
            raise ConfigError("local_recovery.executor_wait_ms must be >= 0")
        if self.local_recovery.standby and not self.local_recovery.enabled:
            raise ConfigError(
                "local_recovery.standby keeps copies that only local recovery reads: set "
                "local_recovery.enabled=true, or standby=false"
            )
        for key, value in self.spark.conf.items():
            if key in SPARK_BY_KEY:
                raise ConfigError(
                    f"spark.conf.{key}: Stator sets it from {SPARK_BY_KEY[key]}; set that instead"
                )
            needed, why = SPARK_REQUIRED.get(key, (None, ""))
            if needed is not None and str(value).strip().lower() != needed:
                raise ConfigError(
                    f"spark.conf.{key}: Stator runs with {key}={needed} ({why}); remove the setting"
                )
        _check_storage_uri("checkpoint.storage", self.checkpoint.storage)
        _check_storage_uri("savepoint.dir", self.savepoint.dir)


def _check_epoch(cfg: JobConfig) -> None:
    _positive(cfg, "epoch.max_records", cfg.epoch.max_records)
    _at_least_zero("epoch.idle_wait_ms", cfg.epoch.idle_wait_ms)
    _at_least_zero("epoch.max_ms", cfg.epoch.max_ms)
    if cfg.epoch.tasks not in EPOCH_TASKS:
        raise ConfigError(
            f"epoch.tasks must be one of {', '.join(EPOCH_TASKS)}, got {cfg.epoch.tasks!r}: "
            f"per-epoch runs each epoch as a Spark job, long-running keeps the tasks up "
            f"across epochs (lower latency)"
        )


def _check_storage_uri(key: str, uri: str) -> None:
    if not (uri.startswith(("file:///", "s3://", "s3a://")) or uri.startswith("/")):
        raise ConfigError(
            f"{key}: unsupported storage URI {uri!r}; use file:///absolute/path or "
            f"s3://bucket/prefix"
        )


def _check_schedule(ck: CheckpointConfig) -> None:
    for key in ("interval_ms", "min_pause_ms"):
        if getattr(ck, key) < 0:
            raise ConfigError(f"checkpoint.{key} must be >= 0")
    if ck.interval_ms > 0 and ck.every_epochs != 1:
        raise ConfigError(
            f"checkpoint.every_epochs ({ck.every_epochs}) and checkpoint.interval_ms "
            f"({ck.interval_ms}) are two schedules: set one (every_epochs counts epochs, "
            f"interval_ms time)"
        )


def _check_health(ck: CheckpointConfig) -> None:
    if ck.tolerable_failures < -1:
        raise ConfigError(
            f"checkpoint.tolerable_failures is how many failed checkpoints in a row the job "
            f"tolerates: 0 or more, or -1 for no limit, got {ck.tolerable_failures}"
        )
    window = ck.progress_window_ms
    if window < 0:
        raise ConfigError(f"checkpoint.progress_window_ms must be >= 0 (0: off), got {window}")
    if window == 0:
        return
    if not ck.enabled:
        raise ConfigError(
            f"checkpoint.progress_window_ms ({window}) watches checkpoints, but "
            f"checkpoint.enabled is false: enable checkpoints or set the window to 0"
        )
    for key in ("interval_ms", "min_pause_ms"):
        wait = getattr(ck, key)
        if window <= wait:
            raise ConfigError(
                f"checkpoint.progress_window_ms ({window}) must exceed checkpoint.{key} "
                f"({wait}): an epoch may wait that long for the next checkpoint to begin, so "
                f"the window could never be met; raise the window or lower {key}"
            )


def _check_restart(r: RestartConfig) -> None:
    for key in ("attempts", "delay_ms", "max_delay_ms", "reset_after_ms", "interval_ms"):
        if getattr(r, key) < 0:
            raise ConfigError(f"restart.{key} must be >= 0")
    if r.multiplier < 1:
        raise ConfigError(
            f"restart.multiplier must be >= 1 (the delay never shrinks), got {r.multiplier}"
        )
    if not 0 <= r.jitter <= 1:
        raise ConfigError(f"restart.jitter is a fraction of the delay: 0 to 1, got {r.jitter}")
    if r.strategy != "exponential-backoff":
        return  # the other strategies have one delay: max_delay_ms and reset_after_ms unused
    if r.max_delay_ms < r.delay_ms:
        raise ConfigError(
            f"restart.max_delay_ms ({r.max_delay_ms}) is below restart.delay_ms ({r.delay_ms}); "
            f"raise max_delay_ms or lower delay_ms"
        )
    if r.reset_after_ms < 1:
        raise ConfigError(
            "restart.reset_after_ms must be >= 1 with exponential-backoff: at 0 every failure "
            "would start the count over, and the strategy never gives up"
        )


def _positive(_: object, key: str, value: int) -> None:
    if value < 1:
        raise ConfigError(f"{key} must be >= 1, got {value}")


def _at_least_zero(key: str, value: int) -> None:
    if value < 0:
        raise ConfigError(f"{key} must be >= 0, got {value}")


# ---------------------------------------------------------------------------- loading


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> JobConfig:
    """Config from a YAML file (optional) plus ``key.path=value`` overrides (YAML values)."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist")
        try:
            loaded = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {p} is not valid YAML: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {p} must hold a mapping at the top level")
        data = loaded
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. checkpoint.retained=5")
        key, raw = item.split("=", 1)
        node = data
        parts = key.strip().split(".")
        spark_conf = [p.replace("-", "_") for p in parts[:2]] == ["spark", "conf"]
        if spark_conf and len(parts) > 2:  # Spark's keys hold dots
            parts = [*parts[:2], ".".join(parts[2:])]
        for part in parts[:-1]:
            nxt = node.setdefault(_spelled(node, part), {})
            if not isinstance(nxt, dict):
                raise ConfigError(f"--set {key}: '{part}' is not a section")
            node = nxt
        leaf = parts[-1] if spark_conf else _spelled(node, parts[-1])
        node[leaf] = yaml.safe_load(raw) if raw != "" else ""
    config: JobConfig = build(JobConfig, data, "")
    return config


def _spelled(node: dict[str, Any], key: str) -> str:
    """How ``node`` already spells ``key`` ('-' and '_' are the same in config keys), so that
    a --set replaces what the file wrote instead of adding a second spelling."""
    name = key.replace("-", "_")
    return next((k for k in node if str(k).replace("-", "_") == name), key)


def build(cls: type[Any], data: Any, where: str) -> Any:
    """A dataclass instance from nested mappings, checking every key and type."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'} must be a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        full = f"{where}.{name}" if where else name
        if name in spelled:  # one would silently replace the other
            raise ConfigError(
                f"config key '{full}' is given twice, as '{spelled[name]}' and '{key}': "
                f"'-' and '_' are the same in config keys; keep one"
            )
        spelled[name] = str(key)
        if name not in fields or not fields[name].init:
            close = difflib.get_close_matches(name, list(fields), n=1)
            hint = f"; did you mean '{(where + '.') if where else ''}{close[0]}'?" if close else ""
            known = ", ".join(sorted(fields))
            raise ConfigError(f"unknown config key '{full}'{hint} (known here: {known})")
        kwargs[name] = _coerce(hints[name], value, full)
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"{where or 'config'}: {exc}") from exc


def _coerce(tp: Any, value: Any, where: str) -> Any:  # noqa: PLR0911, PLR0912
    shown = "***" if where in CREDENTIAL_KEYS else repr(value)  # never echo a secret
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return build(tp, value, where)  # type: ignore[arg-type]
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, where)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{where}: unexpected value {shown}")
    if origin is Literal:
        if value not in args:
            choices = ", ".join(repr(a) for a in args)
            raise ConfigError(f"{where} must be one of {choices}, got {shown}")
        return value
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a mapping, got {shown}")
        return {str(k): str(v) for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {shown}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an integer, got {shown}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where} must be a number, got {shown}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string, got {shown}")
        return value
    raise ConfigError(f"{where}: unsupported config type {tp}")


def to_dict(cfg: Any) -> dict[str, Any]:
    """The effective config, with credentials removed (for logs and status)."""
    out: dict[str, Any] = dataclasses.asdict(cfg)
    for key in CREDENTIAL_KEYS:
        section, name = key.split(".")
        if out.get(section, {}).get(name):
            out[section][name] = "***"
    return out
