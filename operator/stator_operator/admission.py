"""A spec's checks before any driver runs with it: what the spec may not set (operator-owned
pod template fields, volume names, environment variables, Spark settings, plain-text
credentials), the driver pod against the restricted Pod Security Standard, and the runtime's
own check of the job config; every problem named with its field, not found later in a
crash-looping pod."""

from __future__ import annotations

import re
from typing import Any

import yaml

from stator.config import JobConfig, build
from stator.errors import ConfigError

from .job_config import job_config
from .naming import job_name
from .owned import RESERVED_ENV, reserved_env, spark_conf_owner
from .pipeline_spec import PipelineSpec, SpecError
from .podsecurity import pod_violations, template_violations
from .resources import driver_pod, driver_volumes
from .storage import is_under

# The longest suffix the operator appends to a pipeline's name for an object that must be a
# DNS-1035 label (the driver's Service, "<name>-driver"): 63 - len("-driver").
MAX_NAME = 63 - len("-driver")
_DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def check_name(name: str) -> None:
    """The pipeline's name must make valid names of everything derived from it: the driver's
    Service ``<name>-driver`` is a DNS-1035 label (63 characters, lower-case letters, digits
    and '-', starting with a letter), and the ``stator.dev/pipeline`` label value is the name."""
    if len(name) > MAX_NAME or not _DNS_1035.fullmatch(name):
        raise SpecError(
            f"metadata.name {name!r:.80}: the operator names the driver's Service "
            f"'<name>-driver', which must be a DNS-1035 label; give the pipeline a name of at "
            f"most {MAX_NAME} lower-case letters, digits and '-', starting with a letter and "
            f"not ending with '-'"
        )


ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"


def check_namespace(namespace: str, labels: dict[str, str]) -> None:
    """The namespace's Pod Security admission must enforce the restricted level: the
    operator checks the pods it creates, but the executors Spark starts from the driver are
    checked by the API server alone (and the chart's admission policy relies on it for
    privilege, host access and capabilities)."""
    level = labels.get(ENFORCE_LABEL)
    if level != "restricted":
        found = f"it enforces {level!r}" if level else "it enforces no level"
        raise SpecError(
            f"namespace {namespace}: Pod Security admission must enforce the restricted level "
            f"for pipelines ({found}); label it with `kubectl label namespace {namespace} "
            f"{ENFORCE_LABEL}=restricted`, or install the chart with "
            f"podSecurity.requireRestricted=false to run pipelines in any namespace"
        )


def check_storage_roots(spec: PipelineSpec, name: str, namespace: str) -> None:
    """Savepoints may not lie inside the job's checkpoint root, nor checkpoints inside its
    savepoints: a driver's recovery deletes what in its checkpoint root no retained
    checkpoint needs, and savepoint disposal deletes a savepoint's directory."""
    job = job_name(namespace, name)
    checkpoints = f"{spec.checkpoint_root(name, namespace)}/"
    savepoints = f"{spec.savepoint_dir.rstrip('/')}/{job}/"
    probe = f"{checkpoints}x"  # the same directory: a file of one is inside the other
    if (
        is_under(checkpoints, savepoints)
        or is_under(savepoints, checkpoints)
        or is_under(probe, savepoints)
    ):
        raise SpecError(
            f"spec.savepoints.directory ({spec.savepoint_dir}) and "
            f"spec.checkpointing.storage ({spec.checkpointing.storage}) overlap for job {job}: "
            f"its savepoints would go to {savepoints} and its checkpoints to {checkpoints}, "
            f"where recovery deletes what no checkpoint needs; give savepoints a directory "
            f"outside the checkpoint storage (e.g. <storage>/savepoints, the default)"
        )


def env_violations(spec: PipelineSpec) -> list[str]:
    """``spec.driver.env`` and ``spec.executor.env`` entries set by the operator or by Spark:
    theirs would override or be overridden, silently; and executor variables that look like
    credentials (their value would be stored in the pipeline's ConfigMap)."""
    executor_env = spec.executor.env if spec.executor else ()
    env = {"driver": spec.driver.env, "executor": executor_env}
    out = [
        f"spec.{kind}.env[{e['name']}]: set by {why}; remove it"
        for kind in RESERVED_ENV
        for e in env[kind]
        if (why := reserved_env(kind, str(e.get("name")))) is not None
    ]
    out += [
        f"spec.executor.env[{e['name']}]: looks like a credential, and executor variables are "
        f"stored in the pipeline's ConfigMap; put it in a Secret and give it with "
        f"spec.sparkConf spark.kubernetes.executor.secretKeyRef.{e['name']}=<secret>:<key>"
        for e in executor_env
        if _plain_credential(str(e.get("name")).replace("_", "."))
    ]
    return out


def volume_violations(template: dict[str, Any], where: str) -> list[str]:
    """Volumes of a pod template named like one of the driver's own: they are added to the
    driver's volumes, and a name may be used once."""
    owned = [v["name"] for v in driver_volumes("-")]
    pod = template.get("spec")
    volumes = (pod.get("volumes") if isinstance(pod, dict) else None) or []
    return [
        f"{where}.spec.volumes[{v.get('name')}]: the name is one of the operator's volumes "
        f"({', '.join(owned)}); rename it"
        for v in volumes
        if v.get("name") in owned
    ]


def check_pods(spec: PipelineSpec, name: str, namespace: str) -> None:
    """The pods this spec gives: what the spec may not set (operator-owned template fields,
    volume names, driver and executor environment variables), then the driver pod, user
    template merged, against the restricted Pod Security Standard (podsecurity.py); every
    problem named with its field."""
    where = "spec.driver.podTemplate"
    template = spec.driver.pod_template or {}
    try:
        problems = template_violations(template, where) + volume_violations(template, where)
        problems += env_violations(spec)
        body = {"metadata": {"name": name, "namespace": namespace, "uid": "-"}}
        problems += pod_violations(driver_pod(body, spec, "check", "none", False), where)
    except (TypeError, AttributeError, KeyError, IndexError) as exc:  # not shaped as a pod's
        raise SpecError(
            f"{where} or spec.driver.env is malformed ({type(exc).__name__}: {exc!s:.200}): "
            f"give a pod template as in a Pod (metadata, and spec with lists of objects where a "
            f"Pod has them) and env as a list of {{name, value}}"
        ) from exc
    _refuse(problems)


def _refuse(problems: list[str]) -> None:
    """One error naming the first three problems (and how many more)."""
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise SpecError("; ".join(problems[:3]) + more)


# Words of a Spark setting that holds a secret in plain text (it would be stored in the
# pipeline's ConfigMap); references to Secrets (secretKeyRef, secrets) are not secrets.
_CREDENTIAL_WORDS = ("secret", "password", "token", "access.key", "accesskey", "credential")


def _plain_credential(key: str) -> bool:
    lowered = key.lower()
    if "secretkeyref" in lowered or ".secrets." in lowered:
        return False
    return any(word in lowered for word in _CREDENTIAL_WORDS)


def spark_conf_violations(spec: PipelineSpec) -> list[str]:
    """``spec.sparkConf`` keys the operator, the driver or the runtime sets, and secrets in
    plain text."""
    out = [
        f"spec.sparkConf.{key}: set by {why}; remove it"
        for key in spec.spark_conf
        if (why := spark_conf_owner(key)) is not None
    ]
    out += [
        f"spec.sparkConf.{key}: credentials are not accepted in plain text (they would be "
        f"stored in a ConfigMap); put them in a Secret and give them to executors with "
        f"spark.kubernetes.executor.secretKeyRef.<ENV_NAME>=<secret>:<key>"
        for key in spec.spark_conf
        if _plain_credential(key) and spark_conf_owner(key) is None
    ]
    return out


def check_job_config(spec: PipelineSpec, name: str, namespace: str) -> None:
    """The job config this spec gives, before a driver runs with it: spec.sparkConf keys that
    are not the spec's, then the runtime's own check (a Spark setting Stator cannot run with,
    an unknown or ill-typed spec.config key), each reported with its field, not found later
    in a crash-looping pod."""
    _refuse(spark_conf_violations(spec))
    try:
        build(JobConfig, {"spark": {"conf": dict(spec.spark_conf)}}, "")
    except ConfigError as exc:
        raise SpecError(f"spec.sparkConf: {exc}") from exc
    try:
        build(JobConfig, job_config(spec, name, namespace), "")
    except (ConfigError, yaml.YAMLError, AttributeError, TypeError) as exc:
        raise SpecError(f"spec.config: {exc}") from exc
