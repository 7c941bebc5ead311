"""The operator's pure logic: how a spec change is classified, what it refuses, and the
pods it writes (no shell, no credentials in values, non-root)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from stator.cluster.kubernetes import REQUIRED_ENV, in_cluster_conf
from stator.config import JobConfig, load_config
from stator.errors import StatorError
from stator_operator.admission import (
    MAX_NAME,
    check_job_config,
    check_name,
    check_pods,
    check_storage_roots,
)
from stator_operator.job_config import (
    EXECUTOR_DEFAULTS,
    MAX_CONFIG_VALUE,
    config_value,
    job_config,
    restart_config,
)
from stator_operator.naming import executor_claim, spark_app_id
from stator_operator.operation import OpKind
from stator_operator.owned import RESERVED_ENV
from stator_operator.pipeline_spec import PipelineSpec, SpecError
from stator_operator.resources import config_map, driver_pod, event, executor_pod_template
from stator_operator.spec import SpecDiff, classify, fingerprint
from stator_operator.storage import SavepointStorage

SPEC: dict[str, Any] = {
    "image": "stator-runtime:1",
    "entrypoint": "pipelines.counts:build",
    "replicas": 2,
    "maxParallelism": 64,
    "checkpointing": {"storage": "s3://bucket/ck", "credentialsSecret": "s3"},
    "savepoints": {"directory": "s3://bucket/sp"},
    "config": {"epoch.max_records": "3000"},
}
BODY = {"metadata": {"name": "counts", "namespace": "team", "uid": "u-1"}}
VOLUME = {"storageClassName": "local-ssd", "size": "10Gi"}


def changed(**fields: Any) -> dict[str, Any]:
    spec = copy.deepcopy(SPEC)
    spec.update(fields)
    return spec


def test_classify_ignores_fields_with_their_own_flows() -> None:
    assert classify(SPEC, changed(state="suspended")).diff is SpecDiff.IGNORE
    nonce = {**SPEC["savepoints"], "triggerNonce": 3}
    assert classify(SPEC, changed(savepoints=nonce)).diff is SpecDiff.IGNORE
    assert classify(SPEC, changed(restore={"initialSavepoint": "s3://b/x"})).diff is SpecDiff.IGNORE
    # How the next change or savepoint is taken, not a change of the job: switching to
    # stateless must not start the running job over empty.
    assert classify(SPEC, changed(upgradeMode="stateless")).diff is SpecDiff.IGNORE
    native = {**SPEC["savepoints"], "formatType": "native"}
    assert classify(SPEC, changed(savepoints=native)).diff is SpecDiff.IGNORE


def test_a_new_savepoint_directory_redeploys_the_other_savepoint_fields_do_not() -> None:
    """The driver writes savepoints to its job config's savepoint.dir: a new directory reaches
    it only by a redeploy. History, period and disposal are the operator's alone."""
    moved = classify(SPEC, changed(savepoints={"directory": "s3://bucket/sp2"}))
    assert (moved.diff, moved.fields) == (SpecDiff.UPGRADE, ("savepoints.directory",))
    unnamed = classify(SPEC, changed(savepoints={}))
    assert unnamed.diff is SpecDiff.UPGRADE, "back to the default, beside the checkpoints"
    default = changed(savepoints={"directory": "s3://bucket/ck/savepoints"})
    assert classify(changed(savepoints={}), default).diff is SpecDiff.IGNORE, "the same place"
    tuned = {
        "directory": "s3://bucket/sp",
        "triggerNonce": 2,
        "periodicSeconds": 600,
        "historyMaxCount": 9,
        "historyMaxAgeSeconds": 3600,
        "disposeOnDelete": True,
    }
    assert classify(SPEC, changed(savepoints=tuned)).diff is SpecDiff.IGNORE


def test_classify_rescale_and_upgrade() -> None:
    assert SpecDiff.IGNORE < SpecDiff.SCALE < SpecDiff.UPGRADE
    assert classify(SPEC, changed(replicas=4)) == classify(SPEC, changed(replicas=4))
    assert classify(SPEC, changed(replicas=4)).diff is SpecDiff.SCALE
    assert classify(SPEC, changed(replicas=4)).fields == ("replicas",)
    both = classify(SPEC, changed(replicas=4, image="stator-runtime:2"))
    assert (both.diff, both.fields) == (SpecDiff.UPGRADE, ("image", "replicas"))
    config = classify(SPEC, changed(config={"epoch.max_records": "10"}))
    assert (config.diff, config.fields) == (SpecDiff.UPGRADE, ("config.epoch.max_records",))
    assert classify(None, SPEC).diff is SpecDiff.UPGRADE
    # Decided here once: the flow reads it from its operation (canonical savepoint, own
    # executor set), also an upgrade that changes replicas with other fields.
    assert classify(SPEC, changed(replicas=4)).rescales and both.rescales
    assert not config.rescales and not classify(None, SPEC).rescales


def test_classify_decides_the_flow() -> None:
    """The one place that decides what a spec change takes (the reconciler starts it)."""
    suspend = changed(state="suspended")
    assert classify(None, SPEC).kind is OpKind.DEPLOY
    assert classify(None, suspend).kind is None, "created suspended: nothing runs"
    assert classify(SPEC, suspend).kind is OpKind.SUSPEND
    assert classify(SPEC, suspend, suspended=True).kind is None
    assert classify(SPEC, changed(replicas=4), suspended=True).kind is OpKind.RESUME
    assert classify(SPEC, changed(replicas=4)).kind is OpKind.RESCALE
    assert classify(SPEC, changed(replicas=4, image="stator-runtime:2")).kind is OpKind.UPGRADE
    assert classify(SPEC, changed(upgradeMode="stateless")).kind is None


def test_an_absent_replicas_is_the_runtime_default_not_a_rescale() -> None:
    default = JobConfig().parallelism
    absent = {k: v for k, v in SPEC.items() if k != "replicas"}
    assert PipelineSpec.read(absent).parallelism == default
    assert classify(changed(replicas=default), absent).diff is SpecDiff.IGNORE
    assert classify(absent, changed(replicas=default)).diff is SpecDiff.IGNORE
    assert classify(absent, changed(replicas=default + 1)).diff is SpecDiff.SCALE
    assert fingerprint(absent) == fingerprint(changed(replicas=default))


def test_job_config_passes_only_what_the_spec_sets() -> None:
    cfg = job_config(PipelineSpec.read(SPEC), "counts", "team")
    assert (cfg["parallelism"], cfg["max_parallelism"]) == (2, 64)
    tuned = changed(
        checkpointing={
            **SPEC["checkpointing"],
            "asyncUpload": False,
            "maxConcurrent": 1,
            "timeoutSeconds": 30,
        }
    )
    ck = job_config(PipelineSpec.read(tuned), "counts", "team")["checkpoint"]
    assert (ck["async_upload"], ck["max_concurrent"], ck["timeout_ms"]) == (False, 1, 30_000)
    assert (
        "max_concurrent" not in job_config(PipelineSpec.read(SPEC), "counts", "team")["checkpoint"]
    )
    check_job_config(PipelineSpec.read(tuned), "counts", "team")
    bare = {k: v for k, v in SPEC.items() if k not in ("replicas", "maxParallelism")}
    cfg = job_config(PipelineSpec.read(bare), "counts", "team")
    assert "parallelism" not in cfg and "max_parallelism" not in cfg
    check_job_config(PipelineSpec.read(bare), "counts", "team")
    unnamed = {k: v for k, v in bare.items() if k != "savepoints"}
    assert (
        job_config(PipelineSpec.read(unnamed), "counts", "team")["savepoint"]["dir"]
        == "s3://bucket/ck/savepoints"
    )


def test_restart_fields_in_seconds_become_the_milliseconds_they_say() -> None:
    """Rounded, not truncated: 1.005 s is 1004.999... ms in floating point."""
    restart = restart_config(
        PipelineSpec.read(changed(failover={"restartDelaySeconds": 1.005})), "counts", "team"
    )
    assert (restart.strategy, restart.attempts, restart.delay_ms) == (
        "exponential-backoff",
        10,
        1005,
    )


def test_spark_settings_come_from_spec_spark_conf_alone(tmp_path: Path) -> None:
    """spec.sparkConf is the job's spark.conf, keys with their dots and values as written;
    spec.config may not set it (spark.conf.<key>, or the whole spark section): one way."""
    spec = changed(sparkConf={"spark.sql.shuffle.partitions": "4", "spark.ui.port": "4050"})
    PipelineSpec.parse(spec)
    check_job_config(PipelineSpec.read(spec), "counts", "team")
    job = tmp_path / "job.yaml"
    job.write_text(config_map(BODY, PipelineSpec.read(spec))["data"]["job.yaml"])
    assert load_config(job).spark.conf == spec["sparkConf"]
    for key, value in (
        ("spark.conf.spark.sql.shuffle.partitions", "8"),
        ("spark.conf", "{spark.sql.shuffle.partitions: '8'}"),
    ):
        with pytest.raises(SpecError) as info:
            PipelineSpec.parse(changed(config={key: value}))
        assert f"spec.config.{key} is set by the operator; use spec.sparkConf" in str(info.value)
    with pytest.raises(SpecError) as info:
        PipelineSpec.parse(changed(config={"spark": "{conf: {spark.sql.shuffle.partitions: '8'}}"}))
    assert "spec.config.spark: a whole section would replace spark.master" in str(info.value)
    PipelineSpec.parse(changed(config={"spark.ui": "true", "spark.task_attempts": "2"}))


def _in_cluster_keys() -> set[str]:
    """The Spark settings a driver derives from its pod (stator.cluster.kubernetes)."""
    env = dict.fromkeys(REQUIRED_ENV, "x") | {"STATOR_EXECUTOR_POD_TEMPLATE": "/t.yaml"}
    return set(in_cluster_conf(env))


def test_spark_conf_may_not_set_what_the_operator_or_the_driver_sets() -> None:
    """Every Spark setting the operator writes for executor pods (but the timings it only
    defaults) and every one the driver derives from its pod is refused in spec.sparkConf,
    naming who sets it: the job's spark.conf is applied last and would silently win."""
    full = changed(
        executor={"env": [{"name": "COUNT", "value": "5"}]},
        localRecovery={"volume": VOLUME},
    )
    written: set[str] = set()
    for spec in (full, changed(executor={})):  # a claim, an emptyDir
        written |= set(job_config(PipelineSpec.read(spec), "counts", "team")["spark"]["conf"])
    for key in sorted((written - set(EXECUTOR_DEFAULTS)) | _in_cluster_keys()):
        with pytest.raises(SpecError) as info:
            check_job_config(PipelineSpec.read(changed(sparkConf={key: "x"})), "counts", "team")
        assert f"spec.sparkConf.{key}: set by the " in str(info.value), key
    for key, by in (
        ("spark.executor.memory", "set by the operator from spec.executor.memory"),
        ("spark.executorEnv.STATOR_STATE_DIR", "set by the operator from spec.executor.env"),
        ("spark.kubernetes.executor.podTemplateFile", "set by the operator (its executor pod"),
        ("spark.driver.host", "set by the driver, from its pod (its IP)"),
        ("spark.master", "set by the operator (executors as pods with spec.executor"),
    ):
        with pytest.raises(SpecError) as info:
            check_job_config(PipelineSpec.read(changed(sparkConf={key: "x"})), "counts", "team")
        assert f"spec.sparkConf.{key}: {by}" in str(info.value)
    for key, by in (
        ("spark.kubernetes.executor.volumes.hostPath.host.mount.path", "executors may not mount"),
        ("spark.kubernetes.executor.pod.featureSteps", "feature steps may shape pods"),
        ("spark.kubernetes.authenticate.executor.serviceAccountName", "service account runs"),
        ("spark.hadoop.fs.s3a.secret.key", "credentials are not accepted in plain text"),
        ("spark.authenticate.secret", "credentials are not accepted in plain text"),
        ("spark.hadoop.fs.s3a.access.key", "credentials are not accepted in plain text"),
    ):
        with pytest.raises(SpecError, match=re.escape(f"spec.sparkConf.{key}: ")) as info:
            check_job_config(
                PipelineSpec.read(changed(executor={}, sparkConf={key: "x"})), "counts", "team"
            )
        assert by in str(info.value), key
    with pytest.raises(SpecError, match=r"spec.executor.env\[AWS_SESSION_TOKEN\]: looks like a"):
        check_pods(
            PipelineSpec.read(
                changed(executor={"env": [{"name": "AWS_SESSION_TOKEN", "value": "t"}]})
            ),
            "c",
            "n",
        )
    refs = {
        "spark.kubernetes.executor.secretKeyRef.KAFKA_PASSWORD": "kafka:password",
        "spark.kubernetes.executor.secrets.kafka": "/etc/kafka",
    }
    check_job_config(
        PipelineSpec.read(changed(executor={}, sparkConf=refs)), "counts", "team"
    )  # references
    tuned = {
        "spark.executor.heartbeatInterval": "5s",
        "spark.kubernetes.executor.node.selector.disk": "ssd",
        "spark.kubernetes.executor.label.team": "a",
    }
    check_job_config(PipelineSpec.read(changed(executor={}, sparkConf=tuned)), "counts", "team")
    conf = job_config(PipelineSpec.read(changed(executor={}, sparkConf=tuned)), "counts", "team")[
        "spark"
    ]["conf"]
    assert {k: conf[k] for k in tuned} == tuned, "the operator's timings are defaults"
    # A spec accepted before the check: the operator's settings win.
    old = changed(executor={"memory": "2g"}, sparkConf={"spark.executor.memory": "8g"})
    assert (
        job_config(PipelineSpec.read(old), "counts", "team")["spark"]["conf"][
            "spark.executor.memory"
        ]
        == "2g"
    )


def test_spark_settings_stator_cannot_run_with_are_refused_at_apply_time() -> None:
    """The runtime's rule (speculation off, Python workers reused), checked by the operator
    and reported against spec.sparkConf before a driver exists."""
    for key, value in (("spark.speculation", "true"), ("spark.python.worker.reuse", "false")):
        with pytest.raises(SpecError) as info:
            check_job_config(PipelineSpec.read(changed(sparkConf={key: value})), "counts", "team")
        assert f"spec.sparkConf: spark.conf.{key}: Stator runs with" in str(info.value)
    check_job_config(
        PipelineSpec.read(changed(sparkConf={"spark.speculation": "false"})), "counts", "team"
    )


def test_fingerprint_recognises_a_spec_but_not_its_flow_fields() -> None:
    assert fingerprint(SPEC) == fingerprint(changed(state="suspended"))
    assert fingerprint(SPEC) != fingerprint(changed(image="stator-runtime:2"))
    assert len(fingerprint(SPEC)) == 16


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            changed(checkpointing={"storage": "s3://b/ck"}),
            "spec.checkpointing.storage is on s3 (s3://b/ck): spec.checkpointing.credentialsSecret "
            "is required",
        ),
        (
            changed(checkpointing={"storage": "file:///ck"}, savepoints={"directory": "s3://b/sp"}),
            "spec.savepoints.directory is on s3 (s3://b/sp): spec.checkpointing.credentialsSecret",
        ),
        (
            changed(
                checkpointing={"storage": "file:///ck"},
                savepoints={"directory": "file:///sp"},
                restore={"initialSavepoint": "s3://b/sp/savepoint-1"},
            ),
            "spec.restore.initialSavepoint is on s3 (s3://b/sp/savepoint-1): spec.checkpointing",
        ),
        (changed(config={"control.port": "1"}), "spec.config.control.port is set by the operator"),
        (
            changed(config={"savepoint.dir": "s3://b/other"}),
            "spec.config.savepoint.dir is set by the operator; use spec.savepoints.directory",
        ),
        (
            changed(config={"s3.endpoint_url": "http://minio:9000"}),
            "spec.config.s3.endpoint_url is set by the operator; use spec.checkpointing.endpoint",
        ),
        (
            changed(config={"s3.endpoint-url": "http://minio:9000"}),
            "spec.config.s3.endpoint-url is set by the operator; use spec.checkpointing.endpoint",
        ),
        (
            changed(config={"checkpoint.storage": "s3://b/other"}),
            "spec.config.checkpoint.storage is set by the operator; use spec.checkpointing.storage",
        ),
        (
            changed(config={"spark.master": "local[2]"}),
            "spec.config.spark.master is set by the operator; use spec.executor",
        ),
        (changed(config={"lease.name": "x"}), "spec.config.lease.name is set by the operator"),
        (
            changed(config={"checkpoint": "{retained: 5}"}),
            "spec.config.checkpoint: a whole section would replace checkpoint.storage",
        ),
        (
            changed(config={"s3": "{secret_access_key: hunter2}"}),
            "spec.config.s3: a whole section would replace s3.endpoint_url",
        ),
        (
            changed(config={"state.local_dir": "/data"}),
            "spec.config.state.local_dir is set by the operator",
        ),
        (
            changed(config={"s3.secret-access-key": "hunter2"}),
            "credentials are not accepted in plain text",
        ),
        (changed(config={"parallelism": "3"}), "spec.config.parallelism is set by the operator"),
        (
            changed(config={"max_parallelism": "3"}),
            "spec.config.max_parallelism is set by the operator",
        ),
        (
            changed(localRecovery={"volume": VOLUME}),
            "no spec.executor (it runs in the driver pod)",
        ),
        (
            changed(executor={}, localRecovery={"pinning": "required"}),
            "spec.localRecovery.pinning: required keeps each executor's state on a local volume",
        ),
        (
            changed(executor={}, localRecovery={"pinning": "off", "volume": VOLUME}),
            "spec.localRecovery.volume: with pinning: off executors keep state in the pod",
        ),
        (
            changed(executor={}, localRecovery={"enabled": False, "volume": VOLUME}),
            "local recovery is disabled (enabled: false), so nothing would use the volume",
        ),
        (
            changed(localRecovery={"standby": True}),
            "spec.localRecovery.standby keeps each keyed subtask's checkpoint on a second "
            "executor pod: give spec.executor at least 2 instances",
        ),
        (
            changed(executor={"instances": 1}, localRecovery={"standby": True}),
            "give spec.executor at least 2 instances, or remove standby",
        ),
        (
            changed(executor={}, replicas=2, localRecovery={"standby": True, "enabled": False}),
            "spec.localRecovery.standby: local recovery is disabled (enabled: false)",
        ),
        (
            changed(config={"local_recovery.standby": "true"}),
            "use spec.localRecovery.standby instead",
        ),
        (
            changed(
                checkpointing={
                    **SPEC["checkpointing"],
                    "intervalSeconds": 120,
                    "progressWindowSeconds": 120,
                }
            ),
            "spec.checkpointing.progressWindowSeconds (120) must exceed "
            "spec.checkpointing.intervalSeconds (120)",
        ),
        (
            changed(config={"checkpoint.tolerable_failures": "1"}),
            "use spec.checkpointing.tolerableFailures instead",
        ),
    ],
)
def test_validate_names_the_field_and_the_fix(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as info:
        PipelineSpec.parse(spec)
    assert message in str(info.value)


def test_executors_run_in_a_statefulset_with_their_state_on_a_local_volume() -> None:
    """The Spark settings of executor pods: one application id for every driver of the
    pipeline (so the executor StatefulSet and its claims keep their names), the state volume
    as a claim on local volumes (pinning) or an emptyDir (off), executors told where their
    state is, and failure detection within seconds."""
    pinned = job_config(
        PipelineSpec.read(
            changed(executor={"cores": 2}, replicas=4, localRecovery={"volume": VOLUME})
        ),
        "counts",
        "team",
    )
    conf = pinned["spark"]["conf"]
    assert pinned["spark"]["master"] == "kubernetes"
    assert conf["spark.app.id"] == spark_app_id("team", "counts")
    assert spark_app_id("team", "counts") != spark_app_id("other", "counts")
    assert conf["spark.kubernetes.allocation.pods.allocator"] == "statefulset"
    assert conf["spark.executor.instances"] == "2"  # ceil(4 / 2)
    pvc = "spark.kubernetes.executor.volumes.persistentVolumeClaim.stator-state"
    assert conf[f"{pvc}.options.claimName"] == "OnDemand"
    assert conf[f"{pvc}.options.storageClass"] == "local-ssd"
    assert conf[f"{pvc}.options.sizeLimit"] == "10Gi"
    assert conf[f"{pvc}.mount.path"] == "/var/lib/stator"
    assert conf["spark.executorEnv.STATOR_STATE_DIR"] == "/var/lib/stator/state"
    assert int(conf["spark.storage.blockManagerHeartbeatTimeoutMs"]) <= 20_000
    assert "local_recovery" not in pinned  # the runtime's default: on

    loose = job_config(
        PipelineSpec.read(changed(executor={}, localRecovery={"enabled": False})), "counts", "team"
    )
    conf = loose["spark"]["conf"]
    assert conf["spark.kubernetes.executor.volumes.emptyDir.stator-state.mount.path"] == (
        "/var/lib/stator"
    )
    assert not any("persistentVolumeClaim" in k for k in conf)
    assert loose["local_recovery"] == {"enabled": False}
    check_job_config(
        PipelineSpec.read(changed(executor={}, localRecovery={"volume": VOLUME})), "counts", "team"
    )
    standby = changed(executor={}, replicas=2, localRecovery={"volume": VOLUME, "standby": True})
    assert job_config(PipelineSpec.read(standby), "counts", "team")["local_recovery"] == {
        "standby": True
    }
    check_job_config(PipelineSpec.read(standby), "counts", "team")
    assert executor_claim(spark_app_id("team", "counts"), 1).endswith("-0-1")


def test_job_config_is_checked_by_the_runtime_rules() -> None:
    check_job_config(PipelineSpec.read(SPEC), "counts", "team")
    with pytest.raises(SpecError) as info:
        check_job_config(
            PipelineSpec.read(changed(config={"epoch.max_recods": "5"})), "counts", "team"
        )
    assert "unknown config key 'epoch.max_recods'" in str(info.value)
    assert "did you mean 'epoch.max_records'" in str(info.value)
    with pytest.raises(SpecError) as info:
        check_job_config(
            PipelineSpec.read(changed(config={"epoch.max_records": "many"})), "counts", "team"
        )
    assert "epoch.max_records" in str(info.value)
    with pytest.raises(SpecError) as info:
        check_job_config(
            PipelineSpec.read(changed(config={"epoch.max_records": "0"})), "counts", "team"
        )
    assert "epoch.max_records must be >= 1" in str(info.value)
    cfg = job_config(PipelineSpec.read(SPEC), "counts", "team")
    assert (cfg["name"], cfg["parallelism"], cfg["epoch"]) == (
        "team.counts",
        2,
        {"max_records": 3000},
    )


def test_driver_pod_is_non_root_with_argument_lists_and_secret_references() -> None:
    """A hostile spec is refused (check_pods); the pod is safe even so, for a spec
    accepted before those checks."""
    hostile = changed(
        entrypoint="pipelines.counts:build; rm -rf /",  # the CRD refuses this; never a shell
        driver={
            "env": [
                {"name": "AWS_ACCESS_KEY_ID", "value": "stolen"},
                {"name": "COUNT", "value": "5"},
            ],
            "podTemplate": {
                "metadata": {"labels": {"team": "a"}},
                "spec": {
                    "serviceAccountName": "cluster-admin",
                    "containers": [{"name": "driver", "command": ["sh"]}],
                    "nodeSelector": {"disk": "ssd"},
                },
            },
        },
    )
    with pytest.raises(SpecError) as info:
        check_pods(PipelineSpec.read(hostile), "counts", "team")
    assert "spec.driver.podTemplate.spec.containers: not allowed" in str(info.value)
    assert "spec.driver.env[AWS_ACCESS_KEY_ID]: set by the operator" in str(info.value)
    # What the operator finds its driver by and learns its end from is its own too.
    for where, template in (
        (
            "metadata.labels.stator.dev/pipeline",
            {"metadata": {"labels": {"stator.dev/pipeline": "x"}}},
        ),
        ("spec.restartPolicy", {"spec": {"restartPolicy": "Always"}}),
        ("spec.automountServiceAccountToken", {"spec": {"automountServiceAccountToken": False}}),
    ):
        with pytest.raises(SpecError, match=re.escape(f"spec.driver.podTemplate.{where}: not")):
            check_pods(
                PipelineSpec.read(changed(driver={"podTemplate": template})), "counts", "team"
            )
    pod = driver_pod(BODY, PipelineSpec.read(hostile), "d1", "latest", allow_non_restored=False)
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert "command" not in container, "the image's entrypoint (tini) stays PID 1"
    assert container["args"][:3] == ["stator", "run", "pipelines.counts:build; rm -rf /"]
    assert spec["serviceAccountName"] == "counts-stator"
    assert spec["nodeSelector"] == {"disk": "ssd"}
    assert pod["metadata"]["labels"]["team"] == "a"
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    env = {e["name"]: e for e in container["env"]}
    assert env["AWS_ACCESS_KEY_ID"] == {
        "name": "AWS_ACCESS_KEY_ID",
        "valueFrom": {"secretKeyRef": {"name": "s3", "key": "AWS_ACCESS_KEY_ID"}},
    }
    assert env["COUNT"]["value"] == "5"
    assert "stolen" not in json.dumps(pod)
    assert pod["metadata"]["ownerReferences"][0]["uid"] == "u-1"


def test_a_starting_driver_is_not_killed_by_its_liveness_probe() -> None:
    """The startup probe covers the lease wait and Spark's start (5 minutes); liveness
    applies after it, with time to answer on a loaded node."""
    spec = PipelineSpec.read(changed())
    (container,) = driver_pod(BODY, spec, "d1", "latest", False)["spec"]["containers"]
    startup, liveness = container["startupProbe"], container["livenessProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300
    assert "initialDelaySeconds" not in liveness
    assert min(p["timeoutSeconds"] for p in (startup, liveness, container["readinessProbe"])) >= 5
    assert startup["httpGet"] == liveness["httpGet"] == {"path": "/healthz", "port": 8081}


def test_a_template_adds_volumes_to_the_drivers_own() -> None:
    scratch = {"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}}
    spec = changed(driver={"podTemplate": {"spec": {"volumes": [scratch]}}})
    check_pods(PipelineSpec.read(spec), "counts", "team")
    volumes = driver_pod(BODY, PipelineSpec.read(spec), "d1", "latest", False)["spec"]["volumes"]
    assert [v["name"] for v in volumes] == ["config", "control", "read", "state", "tmp", "scratch"]
    clash = changed(
        driver={"podTemplate": {"spec": {"volumes": [{"name": "tmp", "emptyDir": {}}]}}}
    )
    with pytest.raises(SpecError) as info:
        check_pods(PipelineSpec.read(clash), "counts", "team")
    assert "spec.driver.podTemplate.spec.volumes[tmp]: the name is one of the operator's" in str(
        info.value
    )


def test_the_operators_driver_env_is_reserved_and_refused_by_name() -> None:
    """Every variable the operator sets on the driver (with executors and a Secret: all of
    them) is reserved, and a spec that sets one is refused with the name and the reason."""
    spec = changed(executor={})
    env = driver_pod(BODY, PipelineSpec.read(spec), "d1", "latest", False)["spec"]["containers"][0][
        "env"
    ]
    assert {e["name"] for e in env} == set(RESERVED_ENV["driver"])
    for name, why in (
        ("HOME", "the runtime's home is on the state volume"),
        ("POD_IP", "the control API listens on the pod's IP"),
        ("AWS_SECRET_ACCESS_KEY", "credentials come from the Secret named in spec.checkpointing"),
    ):
        with pytest.raises(SpecError) as info:
            check_pods(
                PipelineSpec.read(changed(driver={"env": [{"name": name, "value": "x"}]})), "c", "t"
            )
        assert f"spec.driver.env[{name}]: set by the operator ({why}" in str(info.value)
    check_pods(
        PipelineSpec.read(changed(driver={"env": [{"name": "COUNT", "value": "5"}]})),
        "counts",
        "team",
    )


def test_the_executor_env_the_operator_or_spark_sets_is_refused_by_name() -> None:
    """spec.executor.env may not set what executors get from the operator (state directory,
    node name, credentials) or from Spark's backend (driver URL, executor id, ...): it would
    silently override theirs, or be overridden. Reserved the way the driver's env is."""
    full = changed(executor={})
    conf = job_config(PipelineSpec.read(full), "counts", "team")["spark"]["conf"]
    given = {k.split(".")[-1] for k in conf if k.startswith("spark.executorEnv.")}
    given |= {k.split(".")[-1] for k in conf if "executor.secretKeyRef." in k}
    (container,) = executor_pod_template("counts", spark_app_id("team", "counts"))["spec"][
        "containers"
    ]
    given |= {e["name"] for e in container["env"]}
    assert given == {
        "STATOR_STATE_DIR",
        "STATOR_NODE_NAME",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
    }
    assert given <= set(RESERVED_ENV["executor"])
    for name, by in (
        ("STATOR_STATE_DIR", "the operator (executors keep their state on the state volume)"),
        ("AWS_ACCESS_KEY_ID", "the operator (credentials come from the Secret"),
        ("SPARK_EXECUTOR_ID", "Spark's Kubernetes backend, on every executor it starts"),
        ("SPARK_JAVA_OPT_0", "Spark's Kubernetes backend, on every executor it starts (use"),
    ):
        spec = changed(executor={"env": [{"name": name, "value": "x"}]})
        with pytest.raises(SpecError) as info:
            check_pods(PipelineSpec.read(spec), "counts", "team")
        assert f"spec.executor.env[{name}]: set by {by}" in str(info.value)
        # A spec accepted before the check: the operator's value (or Spark's) stays.
        executor_env = job_config(PipelineSpec.read(spec), "counts", "team")["spark"]["conf"]
        assert executor_env.get(f"spark.executorEnv.{name}") != "x"
    fine = changed(executor={"env": [{"name": "COUNT", "value": "5"}]})
    check_pods(PipelineSpec.read(fine), "counts", "team")
    assert (
        job_config(PipelineSpec.read(fine), "counts", "team")["spark"]["conf"][
            "spark.executorEnv.COUNT"
        ]
        == "5"
    )


def test_an_event_names_the_pipeline_it_is_about() -> None:
    body = {"metadata": {"name": "p", "namespace": "ns", "uid": "u-1"}}
    e = event(body, "Normal", "DriverCreated", "x" * 2000)
    assert e["involvedObject"] == {
        "apiVersion": "stator.dev/v1alpha1",
        "kind": "StatefulPipeline",
        "name": "p",
        "namespace": "ns",
        "uid": "u-1",
    }
    assert e["metadata"] == {"generateName": "p.", "namespace": "ns"}
    assert (e["type"], e["reason"], len(e["message"])) == ("Normal", "DriverCreated", 1000)


def test_the_operator_reaches_storage_with_the_drivers_s3_settings() -> None:
    # Finding a stopped driver's savepoint, checking an initial savepoint and disposing ones
    # go where and as the driver writes: spec.config's s3.* too, not the endpoint alone.
    from stator_operator.storage import s3_options

    spec = changed(
        checkpointing={"storage": "s3://b/ck", "credentialsSecret": "s3", "endpoint": "http://m"},
        config={"s3.region": "eu-west-1", "s3.path-style": "false", "s3.read_timeout_s": "30"},
    )
    options = s3_options(PipelineSpec.read(spec), access_key_id="AK", secret_access_key="SK")
    assert (options.endpoint_url, options.region, options.path_style) == (
        "http://m",
        "eu-west-1",
        False,
    )
    assert options.read_timeout_s == 30 and options.access_key_id == "AK"


def test_the_drivers_role_has_executor_rules_only_with_executor_pods() -> None:
    from stator_operator.resources import role

    def rules(executors: bool) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for rule in role(BODY, executors)["rules"]:
            for resource in rule["resources"]:
                out.setdefault(resource, set()).update(rule["verbs"])
        return out

    assert rules(False) == {"leases": {"get", "update", "patch"}}
    with_pods = rules(True)
    assert "create" not in with_pods["pods"], "the StatefulSet controller creates them"
    assert with_pods == {
        "pods": {"get", "list", "watch", "patch", "delete"},
        "configmaps": {"create"},
        "statefulsets": {"create", "delete"},
        "leases": {"get", "update", "patch"},
    }, "nothing more: no deletecollection, update or scale (issue 38)"
    assert role(BODY, True)["rules"][-1]["resourceNames"] == ["counts-driver"]


def test_a_run_id_of_digits_reaches_the_driver_as_text() -> None:
    # --set values are YAML: 12345678 unquoted would be a number, and the driver would refuse
    # restore.lineage (about 2% of flow ids are digits alone).
    args = driver_pod(
        BODY, PipelineSpec.read(SPEC), "12345678", "latest", False, lineage="01234567"
    )["spec"]["containers"][0]["args"]
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    cfg = load_config(None, [s for s in sets if s.startswith("restore.")])
    assert cfg.restore.lineage == "01234567"


def test_config_values_are_bounded_before_they_are_loaded() -> None:
    """Issue 38: the shared operator loads spec.config values; each is capped in size (the
    CRD says so too) and may not use YAML anchors or aliases."""
    assert config_value("epoch.max_records", "3000") == 3000
    assert config_value("spark.ui", "{enabled: true}") == {"enabled": True}
    with pytest.raises(SpecError, match=r"spec.config.k: 5000 characters, at most 4096"):
        config_value("k", "x" * 5000)
    with pytest.raises(SpecError, match=r"spec.config.k: YAML anchors and aliases"):
        config_value("k", "[&a 1, *a]")
    with pytest.raises(SpecError, match=r"spec.config.k: must be a string"):
        config_value("k", 12)
    crd_file = Path(__file__).resolve().parents[2] / "crds" / "statefulpipelines.stator.dev.yaml"
    crd = yaml.safe_load(crd_file.read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for field in ("config", "sparkConf"):
        schema = spec["properties"][field]
        assert schema["additionalProperties"]["maxLength"] == MAX_CONFIG_VALUE
        assert schema["maxProperties"] == 200


@pytest.mark.parametrize(
    "name", ["p" * (MAX_NAME + 1), "1st-pipeline", "counts.v2", "Counts", "counts-", "c_d"]
)
def test_a_name_that_makes_an_invalid_derived_name_is_refused(name: str) -> None:
    """Issue 38: refused at admission with the fix, instead of stuck on a failing create."""
    with pytest.raises(SpecError, match=r"metadata.name .*: the operator names the driver's"):
        check_name(name)


def test_the_longest_allowed_name_makes_valid_names() -> None:
    name = "p" * MAX_NAME
    check_name(name)
    assert len(f"{name}-driver") == 63


@pytest.mark.parametrize(
    ("storage", "savepoints"),
    [
        ("s3://b/ck", "s3://b/ck"),  # savepoints at <storage>/<job>/savepoint-...
        ("s3://b/ck", "S3://b/ck/"),  # the same, spelled otherwise
        ("s3://b/ck/team.counts/sp", "s3://b/ck/team.counts/sp"),
        ("s3://b", "s3://b/team.counts"),  # checkpoints inside the job's savepoints
    ],
)
def test_overlapping_checkpoint_and_savepoint_roots_are_refused(
    storage: str, savepoints: str
) -> None:
    """Issue 38: recovery deletes what no checkpoint needs under the checkpoint root."""
    spec = {"checkpointing": {"storage": storage}, "savepoints": {"directory": savepoints}}
    with pytest.raises(SpecError, match=r"overlap for job team\.counts"):
        check_storage_roots(PipelineSpec.read(spec), "counts", "team")


def test_separate_roots_and_the_default_are_accepted() -> None:
    check_storage_roots(
        PipelineSpec.read({"checkpointing": {"storage": "s3://b/ck"}}), "counts", "team"
    )
    spec = {"checkpointing": {"storage": "s3://b/ck"}, "savepoints": {"directory": "s3://b/sp"}}
    check_storage_roots(PipelineSpec.read(spec), "counts", "team")


class Secrets:
    def __init__(self, data: dict[str, str]) -> None:
        self.data = data

    def read_secret(self, namespace: str, name: str) -> dict[str, str]:
        return self.data


def test_the_operator_reads_storage_only_as_the_pipeline_and_within_its_limits() -> None:
    """Issue 38: no file:// (the operator's own disk), no ambient credentials, and the
    spec's S3 retries and timeouts clamped for the operator (not for the driver)."""
    spec = {
        "checkpointing": {"storage": "s3://b/ck", "credentialsSecret": "creds"},
        "config": {"s3.read_timeout_s": "3600", "s3.max_attempts": "50", "s3.region": "eu"},
    }
    full = Secrets({"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"})
    options = SavepointStorage(full).options("team", PipelineSpec.read(spec), "s3://b/sp")
    assert (options.read_timeout_s, options.max_attempts, options.region) == (30.0, 3, "eu")
    assert options.access_key_id == "a"
    with pytest.raises(StatorError, match="lacks AWS_SECRET_ACCESS_KEY"):
        SavepointStorage(Secrets({"AWS_ACCESS_KEY_ID": "a"})).options(
            "team", PipelineSpec.read(spec), "s3://b/x"
        )
    no_secret = {"checkpointing": {"storage": "s3://b/ck"}}
    with pytest.raises(StatorError, match="credentialsSecret is required"):
        SavepointStorage(full).options("team", PipelineSpec.read(no_secret), "s3://b/x")
    with pytest.raises(StatorError, match="does not read file:// locations"):
        SavepointStorage(full).options("team", PipelineSpec.read(spec), "file:///etc")
    assert SavepointStorage(full).restore_problem(
        "team", PipelineSpec.read(spec), "FILE:///etc/passwd"
    )


def test_a_savepoint_is_disposed_of_only_inside_its_directory(tmp_path: Path) -> None:
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "_savepoint.json").write_text("{}")
    spec = {"checkpointing": {"storage": f"file://{tmp_path}/ck"}}
    storage = SavepointStorage(Secrets({}), allow_file=True)
    storage.dispose("team", PipelineSpec.read(spec), f"file://{outside}")
    storage.dispose(
        "team", PipelineSpec.read(spec), f"file://{tmp_path}/ck/savepoints/../../precious"
    )
    assert (outside / "_savepoint.json").exists()


def test_every_number_in_the_crd_is_bounded() -> None:
    """Issue 38: an unbounded number reaches the operator's arithmetic (a delay of 1e300 s
    overflows a timedelta on every tick); the schema refuses it at kubectl apply."""
    crd_file = Path(__file__).resolve().parents[2] / "crds" / "statefulpipelines.stator.dev.yaml"
    schema = yaml.safe_load(crd_file.read_text())["spec"]["versions"][0]["schema"]
    unbounded: list[str] = []

    def walk(node: Any, path: str) -> None:
        if not isinstance(node, dict):
            return
        if node.get("type") in ("integer", "number") and "maximum" not in node:
            unbounded.append(path)
        for key, child in (node.get("properties") or {}).items():
            walk(child, f"{path}.{key}")
        for key in ("items", "additionalProperties"):
            walk(node.get(key), f"{path}[]")

    walk(schema["openAPIV3Schema"], "")
    assert unbounded == []


def test_the_config_map_names_the_one_secret_executors_may_read() -> None:
    """The chart's admission policy reads it (a driver cannot write NAME-config); executor
    pods mount no service-account token, which the policy requires too."""
    import yaml

    from stator_operator.naming import CREDENTIALS_ANNOTATION, EXECUTOR_TEMPLATE
    from stator_operator.resources import config_map

    with_secret = {**SPEC, "checkpointing": {**SPEC["checkpointing"], "credentialsSecret": "s3"}}
    with_secret["executor"] = {"instances": 2}
    cm = config_map(BODY, PipelineSpec.read(with_secret))
    assert cm["metadata"]["annotations"] == {CREDENTIALS_ANNOTATION: "s3"}
    assert cm["metadata"]["labels"]["stator.dev/component"] == "config"
    template = yaml.safe_load(cm["data"][EXECUTOR_TEMPLATE])
    assert template["spec"]["automountServiceAccountToken"] is False
    without = {**SPEC, "checkpointing": {"storage": "s3://b/ck"}}
    assert config_map(BODY, PipelineSpec.read(without))["metadata"]["annotations"] == {}


def test_the_pipeline_uid_owns_its_checkpoint_root_and_adopt_is_a_spec_field() -> None:
    """checkpoint.owner is the pipeline's uid (the operator's to set, never spec.config's);
    spec.checkpointing.adopt takes over another owner's root (checkpoint/ownership.py)."""
    from stator_operator.job_config import job_config
    from stator_operator.pipeline_spec import PipelineSpec, SpecError

    assert (
        job_config(PipelineSpec.read(SPEC), "counts", "team", owner="u-1")["checkpoint"]["owner"]
        == "u-1"
    )
    assert "adopt" not in job_config(PipelineSpec.read(SPEC), "counts", "team")["checkpoint"]
    adopting = {**SPEC, "checkpointing": {**SPEC["checkpointing"], "adopt": True}}
    assert job_config(PipelineSpec.read(adopting), "counts", "team")["checkpoint"]["adopt"] is True
    for key, fix in (("checkpoint.owner", "uid"), ("checkpoint.adopt", "spec.checkpointing.adopt")):
        with pytest.raises(SpecError, match=fix):
            PipelineSpec.parse({**SPEC, "config": {key: "x"}})
