"""The parsed StatefulPipeline spec: its defaults are the CRD's (the two cannot drift), and a
spec is parsed once, typed, with the checks the schema cannot express."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from stator.config import JobConfig
from stator_operator.pipeline_spec import (
    DesiredState,
    Pinning,
    PipelineSpec,
    SpecError,
    UpgradeMode,
)

CRD = Path(__file__).resolve().parents[2] / "crds" / "statefulpipelines.stator.dev.yaml"
SCHEMA = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
REQUIRED = {
    "image": "stator-runtime:1",
    "entrypoint": "pipelines.counts:build",
    "checkpointing": {"storage": "file:///data/ck"},
}
# CRD defaults the parsed spec leaves unset (None) because the job config passes only what the
# spec sets: the runtime's default applies, which must then be the CRD's (key, unit factor).
RUNTIME_DEFAULTS = {
    "checkpointing.asyncUpload": ("async_upload", 1),
    "checkpointing.maxConcurrent": ("max_concurrent", 1),
    "checkpointing.timeoutSeconds": ("timeout_ms", 1000),
    "checkpointing.tolerableFailures": ("tolerable_failures", 1),
    "checkpointing.progressWindowSeconds": ("progress_window_ms", 1000),
}


def _defaults(schema: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every ``default:`` of the CRD's spec schema, by dotted field path."""
    for name, sub in (schema.get("properties") or {}).items():
        if "default" in sub:
            yield f"{prefix}{name}", sub["default"]
        yield from _defaults(sub, f"{prefix}{name}.")


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


def _parsed(spec: PipelineSpec, path: str) -> Any:
    node: Any = spec
    for part in path.split("."):
        node = getattr(node, _snake(part))
    return node


CRD_DEFAULTS = sorted(_defaults(SCHEMA["properties"]["spec"]))


def test_the_crd_has_defaults_to_check() -> None:
    assert len(CRD_DEFAULTS) > 20
    assert set(RUNTIME_DEFAULTS) <= {path for path, _ in CRD_DEFAULTS}


@pytest.mark.parametrize("sections", ["absent", "empty"])
@pytest.mark.parametrize(("path", "default"), CRD_DEFAULTS)
def test_parse_applies_the_crd_defaults(path: str, default: Any, sections: str) -> None:
    """A field left out parses to the CRD's default, whether its section is left out or
    given empty (the API server fills in the latter); where the parsed spec leaves it to the
    runtime, the runtime's default is the CRD's."""
    raw: dict[str, Any] = dict(REQUIRED)
    if sections == "empty":
        raw.update({s: {} for s in ("driver", "executor", "localRecovery")})
    section = path.split(".", maxsplit=1)[0]
    if sections == "absent" and section in ("executor", "localRecovery"):
        raw[section] = {}  # optional sections: their defaults apply once they are given
    value = _parsed(PipelineSpec.parse(raw), path)
    if path in RUNTIME_DEFAULTS:
        key, factor = RUNTIME_DEFAULTS[path]
        assert value is None, "left to the runtime"
        assert getattr(JobConfig().checkpoint, key) == default * factor
        return
    assert value == default, f"spec.{path}: parsed {value!r}, the CRD's default is {default!r}"


def test_a_parsed_spec_is_typed_and_frozen() -> None:
    spec = PipelineSpec.parse(
        {
            **REQUIRED,
            "upgradeMode": "last-state",
            "state": "suspended",
            "replicas": 4,
            "executor": {"cores": 2},
            "localRecovery": {"volume": {"storageClassName": "local", "size": "1Gi"}},
            "checkpointing": {"storage": "s3://bucket/ck", "credentialsSecret": "s3"},
        }
    )
    assert spec.upgrade_mode is UpgradeMode.LAST_STATE and spec.state is DesiredState.SUSPENDED
    assert (spec.parallelism, spec.executor_instances) == (4, 2)
    assert spec.pinning is Pinning.PREFERRED
    assert spec.savepoint_dir == "s3://bucket/ck/savepoints"
    assert spec.checkpoint_root("counts", "team") == "s3://bucket/ck/team.counts"
    with pytest.raises(AttributeError):
        spec.replicas = 5  # type: ignore[misc]


def test_a_field_of_the_wrong_type_is_named() -> None:
    with pytest.raises(SpecError, match=r"spec\.upgradeMode: 'sideways'"):
        PipelineSpec.parse({**REQUIRED, "upgradeMode": "sideways"})
    with pytest.raises(SpecError, match=r"spec\.failover\.maxRestarts: 'many'"):
        PipelineSpec.parse({**REQUIRED, "failover": {"maxRestarts": "many"}})


def test_read_skips_the_checks_parse_makes() -> None:
    """A spec recorded in status runs as it was accepted: today's checks are for the next."""
    refused = {**REQUIRED, "config": {"parallelism": "3"}}
    with pytest.raises(SpecError, match=r"spec\.config\.parallelism is set by the operator"):
        PipelineSpec.parse(refused)
    assert PipelineSpec.read(refused).config == {"parallelism": "3"}
