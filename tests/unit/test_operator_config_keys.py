"""spec.config may set no key the operator writes into the job config: it is applied last, so
it would silently win over the spec field the key comes from (often a CRD default the API
server filled in). The keys are found from job_config's own output, not listed here."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from stator.config import JobConfig
from stator_operator.job_config import job_config
from stator_operator.pipeline_spec import PipelineSpec, SpecError

CRD = Path(__file__).resolve().parents[2] / "crds" / "statefulpipelines.stator.dev.yaml"
VOLUME = {"storageClassName": "local-ssd", "size": "10Gi"}
# Every field of the CRD set, each away from its default (job_config writes some defaults
# itself: a field's effect shows only at another value). No spec.config: only what the
# fields give.
FULL: dict[str, Any] = {
    "image": "stator-runtime:1",
    "imagePullPolicy": "Always",
    "entrypoint": "pipelines.counts:build",
    "replicas": 4,
    "maxParallelism": 64,
    "upgradeMode": "last-state",
    "state": "suspended",
    "driver": {
        "env": [{"name": "EXTRA", "value": "1"}],
        "resources": {"requests": {"cpu": "1"}},
        "podTemplate": {"metadata": {"annotations": {"a": "b"}}},
        "prestart": False,
    },
    "executor": {
        "instances": 3,
        "cores": 2,
        "memory": "2g",
        "env": [{"name": "EXTRA", "value": "1"}],
    },
    "sparkConf": {"spark.sql.shuffle.partitions": "4"},
    "config": {},
    "checkpointing": {
        "storage": "s3://bucket/ck",
        "credentialsSecret": "s3",
        "endpoint": "http://minio:9000",
        "intervalEpochs": 2,
        "intervalSeconds": 30,
        "retained": 5,
        "incremental": False,
        "adopt": True,
        "asyncUpload": False,
        "maxConcurrent": 4,
        "timeoutSeconds": 60,
        "tolerableFailures": 5,
        "progressWindowSeconds": 120,
    },
    "savepoints": {
        "directory": "s3://bucket/sp",
        "formatType": "native",
        "triggerNonce": 1,
        "periodicSeconds": 600,
        "historyMaxCount": 9,
        "historyMaxAgeSeconds": 3600,
        "disposeOnDelete": True,
        "timeoutSeconds": 900,
    },
    "restore": {"initialSavepoint": "s3://bucket/sp/savepoint-1", "allowNonRestoredState": True},
    "failover": {
        "strategy": "full",
        "restartStrategy": "fixed-delay",
        "maxRestarts": 5,
        "restartDelaySeconds": 2,
        "maxRestartDelaySeconds": 30,
        "backoffMultiplier": 3,
        "backoffJitter": 0.2,
        "resetAfterSeconds": 300,
        "failureRateIntervalSeconds": 120,
        "readinessTimeoutSeconds": 60,
    },
    "localRecovery": {"enabled": False, "pinning": "required", "volume": VOLUME, "standby": True},
    "deletion": {"finalSavepoint": False, "timeoutSeconds": 60, "disposeFinalSavepoint": True},
    "autoscaler": {  # the operator's alone: job_config writes none of it
        "enabled": True,
        "dryRun": True,
        "minReplicas": 2,
        "maxReplicas": 8,
        "targetUtilization": 0.6,
        "catchUpSeconds": 120,
        "metricsWindowSeconds": 30,
        "scaleUpStabilizationSeconds": 15,
        "scaleDownStabilizationSeconds": 600,
        "maxScaleFactor": 3.0,
        "cooldownSeconds": 30,
    },
}
# A spec validate accepts, to add one spec.config key to (FULL is for job_config alone: some of
# its fields exclude each other).
BASE: dict[str, Any] = {
    "image": "stator-runtime:1",
    "entrypoint": "pipelines.counts:build",
    "checkpointing": {"storage": "file:///tmp/ck"},
}
# Keys the operator sets without a spec field: refused with "remove it".
OPERATOR_OWN = {"name", "control.port", "state.local_dir", "lease.name"}


def get(spec: dict[str, Any], *path: str) -> Any:
    """The value at ``path`` (None if absent)."""
    node: Any = spec
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _crd_paths(schema: dict[str, Any], prefix: str = "") -> Iterator[str]:
    """Every field of a CRD schema, dotted (sections and the fields under them)."""
    for name, sub in (schema.get("properties") or {}).items():
        yield f"{prefix}{name}"
        yield from _crd_paths(sub, f"{prefix}{name}.")


def _config_keys(cfg: dict[str, Any], cls: Any = JobConfig, prefix: str = "") -> dict[str, Any]:
    """A job config as runtime keys (dotted down to a JobConfig leaf: spark.conf is one key)
    and their values."""
    hints = typing.get_type_hints(cls)
    out: dict[str, Any] = {}
    for key, value in cfg.items():
        if dataclasses.is_dataclass(hints[key]):
            out.update(_config_keys(value, hints[key], f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _written(spec: dict[str, Any]) -> dict[str, Any] | None:
    """The keys job_config writes for ``spec``; None if it cannot write them (a required
    field missing)."""
    try:
        return _config_keys(job_config(PipelineSpec.read(spec), "counts", "team"))
    except KeyError:
        return None


def _without(spec: dict[str, Any], field: str) -> dict[str, Any]:
    out = copy.deepcopy(spec)
    *section, name = field.split(".")
    node = get(out, *section) if section else out
    del node[name]
    return out


SPEC_SCHEMA = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]
CRD_FIELDS = set(_crd_paths(SPEC_SCHEMA["openAPIV3Schema"]["properties"]["spec"]))
WRITTEN = _written(FULL) or {}


def test_the_full_spec_sets_every_crd_field() -> None:
    """So that a new CRD field that job_config writes is in WRITTEN below."""
    missing = sorted(f for f in CRD_FIELDS if get(FULL, *f.split(".")) is None)
    assert not missing, f"add to FULL: {missing}"
    assert WRITTEN


@pytest.mark.parametrize("key", sorted(WRITTEN))
def test_spec_config_may_not_set_a_key_job_config_writes(key: str) -> None:
    """Refused, naming the CRD field to use (one that exists and does write the key), or to
    remove it where the operator sets the key without a field."""
    for spelled in (key, key.replace("_", "-")):  # the runtime reads both
        with pytest.raises(SpecError) as info:
            PipelineSpec.parse({**BASE, "config": {spelled: json.dumps(WRITTEN[key])}})
        assert str(info.value).startswith(f"spec.config.{spelled} is set by the operator; ")
    fix = str(info.value).split("; ", 1)[1]
    fields = re.findall(r"\bspec\.([A-Za-z.]*[A-Za-z])", fix)
    if not fields:
        assert key in OPERATOR_OWN and fix.startswith("remove it"), fix
        return
    assert set(fields) <= CRD_FIELDS, fix
    without = _written(_without(FULL, fields[0]))
    assert without is None or without.get(key) != WRITTEN[key], f"{fields[0]} does not set {key}"


@pytest.mark.parametrize(
    ("section", "owned"),
    [("restart", "restart.strategy"), ("failover", "failover.strategy")],
)
def test_a_section_holding_such_keys_is_refused(section: str, owned: str) -> None:
    with pytest.raises(SpecError) as info:
        PipelineSpec.parse({**BASE, "config": {section: "{}"}})
    assert f"spec.config.{section}: a whole section would replace {owned}" in str(info.value)


def test_keys_without_a_spec_field_stay_allowed() -> None:
    """What job_config does not write has no other way in."""
    allowed = {
        "epoch.max_records": "3000",
        "checkpoint.min_pause_ms": "1000",
        "checkpoint.enabled": "true",
        "local_recovery.executor_wait_ms": "5000",
        "spark.task_attempts": "2",
        "lease.duration_ms": "20000",
    }
    assert not set(allowed) & set(WRITTEN)
    PipelineSpec.parse({**BASE, "config": allowed})


def test_a_key_spelled_with_dashes_joins_the_section_the_operator_writes() -> None:
    """``local-recovery.x`` beside the operator's ``local_recovery.enabled`` was a second
    section, and one of the two was dropped in silence."""
    spec = {
        **BASE,
        "localRecovery": {"enabled": False},
        "config": {"local-recovery.executor-wait-ms": "5000"},
    }
    PipelineSpec.parse(spec)
    written = job_config(PipelineSpec.read(spec), "counts", "team")["local_recovery"]
    assert written == {"enabled": False, "executor_wait_ms": 5000}
