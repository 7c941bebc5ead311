"""What a pipeline driver's service-account token can write (issue 38): user code runs in the
driver, so its author holds that token. On the real API server, with the chart's RBAC for the
driver (``resources.role``) and the chart's admission policies
(``charts/stator-operator/templates/driver-policy.yaml``): pipeline ``p``'s token does what
Spark needs for p's executors, and nothing to another pipeline's objects or beyond the shape
Spark gives them. No driver runs here: the objects the operator would make are made directly,
so each write is tried in isolation."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from stator_operator.naming import labels
from stator_operator.pipeline_spec import PipelineSpec
from stator_operator.resources import config_annotations, role, role_binding, service_account
from tests.e2e.cluster import Space

pytestmark = pytest.mark.testbed

RESTRICTED = {
    "securityContext": {
        "runAsNonRoot": True,
        "runAsUser": 185,
        "seccompProfile": {"type": "RuntimeDefault"},
    },
}
# What Spark's executor pods carry besides the operator's labels.
SPARK_LABELS = {"executor": {"spark-app-selector": "x", "spark-role": "executor"}}
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def _body(space: Space, name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": space.name, "uid": "0"}}


def _unowned(obj: dict[str, Any]) -> dict[str, Any]:
    """The operator's object without its owner (no StatefulPipeline exists here)."""
    obj = copy.deepcopy(obj)
    obj["metadata"].pop("ownerReferences", None)
    return obj


def _pod(space: Space, name: str, pipeline: str, component: str) -> dict[str, Any]:
    """A pod that stays Pending (no node has the label it selects)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": space.name,
            "labels": {**labels(pipeline, component), **SPARK_LABELS.get(component, {})},
        },
        "spec": {
            **RESTRICTED,
            "nodeSelector": {"stator.dev/test": "no-such-node"},
            "automountServiceAccountToken": False,
            "containers": [
                {"name": "c", "image": "stator-runtime:test", "securityContext": CONTAINER_SECURITY}
            ],
        },
    }


def executor_set(pipeline: str, name: str = "spark-s-x-0") -> dict[str, Any]:
    """A StatefulSet as Spark's statefulset allocator writes it for ``pipeline``'s executors
    (the operator's executor template merged with Spark's features), with no replicas."""
    selector = {"spark-app-selector": "x", "spark-role": "executor"}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": 0,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": {**selector, **labels(pipeline, "executor")}},
                "spec": {
                    **RESTRICTED,
                    "automountServiceAccountToken": False,
                    "containers": [
                        {
                            "name": "executor",
                            "image": "stator-runtime:test",
                            "securityContext": CONTAINER_SECURITY,
                            "env": [
                                {
                                    "name": key,
                                    "valueFrom": {
                                        "secretKeyRef": {"name": "s3-credentials", "key": key}
                                    },
                                }
                                for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
                            ],
                            "volumeMounts": [
                                {"name": "conf", "mountPath": "/opt/spark/conf"},
                                {"name": "local", "mountPath": "/var/data"},
                                {"name": "stator-state", "mountPath": "/var/lib/stator"},
                            ],
                        }
                    ],
                    "volumes": [
                        {"name": "conf", "configMap": {"name": "spark-exec-x-conf-map"}},
                        {"name": "local", "emptyDir": {}},
                    ],
                },
            },
            "volumeClaimTemplates": [
                {
                    "metadata": {"name": "stator-state"},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "1Gi"}},
                    },
                }
            ],
        },
    }


def _container(sts: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = sts["spec"]["template"]["spec"]["containers"][0]
    return container


def _pod_spec(sts: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = sts["spec"]["template"]["spec"]
    return spec


def _with(change: Any) -> dict[str, Any]:
    sts = executor_set("p")
    change(sts)
    return sts


# Each StatefulSet p's driver must not create: how it is changed from Spark's, and the refusal.
HOSTILE_SETS: dict[str, tuple[dict[str, Any], str]] = {
    "another pipeline's executors": (executor_set("q"), "stator.dev/pipeline=p"),
    "a Secret volume": (
        _with(
            lambda s: _pod_spec(s)["volumes"].append(
                {"name": "loot", "secret": {"secretName": "s3-credentials"}}
            )
        ),
        "executor pods mount only emptyDir volumes",
    ),
    "another pipeline's ConfigMap": (
        _with(
            lambda s: _pod_spec(s)["volumes"].append(
                {"name": "cfg", "configMap": {"name": "q-config"}}
            )
        ),
        "executor pods mount only emptyDir volumes",
    ),
    "a service-account token": (
        _with(lambda s: _pod_spec(s).pop("automountServiceAccountToken")),
        "mount no service-account token",
    ),
    "an init container": (
        _with(lambda s: _pod_spec(s).update(initContainers=[dict(_container(s), name="i")])),
        "no init containers",
    ),
    "another key of a Secret": (
        _with(
            lambda s: _container(s)["env"].append(
                {
                    "name": "X",
                    "valueFrom": {"secretKeyRef": {"name": "s3-credentials", "key": "password"}},
                }
            )
        ),
        "two keys from a Secret",
    ),
    "envFrom a Secret": (
        _with(lambda s: _container(s).update(envFrom=[{"secretRef": {"name": "other"}}])),
        "no envFrom",
    ),
    "a Secret its spec does not name": (
        _with(lambda s: _container(s)["env"][0]["valueFrom"]["secretKeyRef"].update(name="other")),
        "read only the Secret its spec names in checkpointing.credentialsSecret (s3-credentials)",
    ),
    "a claim cloned from another": (
        _with(
            lambda s: s["spec"]["volumeClaimTemplates"][0]["spec"].update(
                dataSource={"kind": "PersistentVolumeClaim", "name": "q-state"}
            )
        ),
        "never another claim's data",
    ),
    "a claim bound to a chosen volume": (
        _with(lambda s: s["spec"]["volumeClaimTemplates"][0]["spec"].update(volumeName="pv-of-q")),
        "never another claim's data",
    ),
}


class Driver:
    """kubectl as pipeline ``pipeline``'s driver: its service-account token alone (the
    cluster entry of the admin's kubeconfig, none of its client credentials)."""

    def __init__(self, space: Space, pipeline: str, work: Path) -> None:
        self.space = space
        token = space.kube.kubectl(
            "create", "token", f"{pipeline}-stator", "-n", space.name, "--duration", "1h"
        ).stdout.strip()
        config = space.kube.kubectl_json("config", "view", "--raw", "--minify")
        config["users"] = [{"name": "driver", "user": {"token": token}}]
        config["contexts"][0]["context"]["user"] = "driver"
        self.kubeconfig = work / f"{pipeline}-driver.kubeconfig"
        self.kubeconfig.write_text(json.dumps(config))
        who = self.run("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}")
        assert who.stdout == f"system:serviceaccount:{space.name}:{pipeline}-stator", who

    def run(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return self.space.kube.kubectl(
            f"--kubeconfig={self.kubeconfig}",
            "-n",
            self.space.name,
            *args,
            input=input,
            check=False,
        )

    def create(self, obj: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        return self.run("create", "-f", "-", input=json.dumps(obj))


def refused(proc: subprocess.CompletedProcess[str], message: str) -> None:
    assert proc.returncode != 0, f"allowed: {proc.stdout}"
    assert message in proc.stderr, proc.stderr


def allowed(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, proc.stderr


def set_up(space: Space) -> dict[str, str]:
    """Pipelines p and q as the operator sets them up (service accounts, Roles with
    executors, bindings, NAME-config with its annotation), and three pods: q's driver, p's
    driver and p's executor. Returns the driver pods' uids."""
    spec = {"checkpointing": {"credentialsSecret": "s3-credentials"}}
    objects: list[dict[str, Any]] = []
    for name in ("p", "q"):
        body = _body(space, name)
        objects += [_unowned(service_account(body)), _unowned(role(body, executors=True))]
        objects.append(_unowned(role_binding(body)))
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": f"{name}-config",
                    "labels": labels(name, "config"),
                    "annotations": config_annotations(PipelineSpec.read(spec)),
                },
                "data": {},
            }
        )
    objects += [
        _pod(space, "q-driver-0123abcd", "q", "driver"),
        _pod(space, "p-driver-0123abcd", "p", "driver"),
        _pod(space, "p-exec-0", "p", "executor"),
    ]
    items = {"apiVersion": "v1", "kind": "List", "items": objects}
    space.kube.kubectl("apply", "-n", space.name, "-f", "-", input=json.dumps(items))
    return {
        pod: space.kube.kubectl_json("get", "pod", pod, "-n", space.name)["metadata"]["uid"]
        for pod in ("q-driver-0123abcd", "p-driver-0123abcd")
    }


def _conf_map(name: str, owner: str, uid: str) -> dict[str, Any]:
    """An executor ConfigMap as Spark writes it: owned by the driver pod ``owner``."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "labels": {"spark-app-selector": "x", "spark-role": "executor"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": owner, "uid": uid}],
        },
        "data": {"spark.properties": ""},
    }


def test_a_drivers_token_writes_only_its_own_executors_in_sparks_shape(
    space: Space, tmp_path: Path
) -> None:
    uids = set_up(space)
    p = Driver(space, "p", tmp_path)

    # What Spark does for p's executors is allowed: without these, every refusal below
    # could be a policy that refuses everything.
    allowed(p.create(executor_set("p", "spark-s-p-0")))
    allowed(p.run("delete", "statefulset", "spark-s-p-0"))
    allowed(
        p.create(_conf_map("spark-exec-p-conf-map", "p-driver-0123abcd", uids["p-driver-0123abcd"]))
    )
    allowed(p.run("label", "pod", "p-exec-0", "spark-exec-id=1"))
    # Its own executor pod: relabelled, never changed (a new image would run other code
    # with the pod's volumes).
    image = '{"spec":{"containers":[{"name":"c","image":"evil:latest"}]}}'
    refused(p.run("patch", "pod", "p-exec-0", "-p", image), "relabel its executor pods, not")
    keeps = "keeps its pipeline, component and executor set labels"
    refused(p.run("label", "pod", "p-exec-0", "stator.dev/pipeline=q", "--overwrite"), keeps)
    refused(p.run("label", "pod", "p-exec-0", "spark-app-selector=other", "--overwrite"), keeps)
    allowed(p.run("delete", "pod", "p-exec-0", "--wait=false"))

    # Each StatefulSet that differs from Spark's in one hostile way.
    for case, (sts, message) in sorted(HOSTILE_SETS.items()):
        proc = p.create(sts)
        assert proc.returncode != 0 and message in proc.stderr, (case, proc.stderr)

    # Another pipeline's pods and configuration.
    not_p = "is not an executor of pipeline p"
    refused(p.run("patch", "pod", "q-driver-0123abcd", "-p", image), not_p)
    refused(p.run("label", "pod", "q-driver-0123abcd", "x=y"), not_p)
    refused(p.run("delete", "pod", "q-driver-0123abcd"), not_p)
    refused(p.run("delete", "configmap", "q-config"), "forbidden")  # RBAC: create only
    not_conf = "is not an executor ConfigMap of pipeline p"
    refused(
        p.create(_conf_map("spark-exec-q", "q-driver-0123abcd", uids["q-driver-0123abcd"])),
        not_conf,
    )
    refused(
        p.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}), not_conf
    )
    # Its own driver pod: not an executor; changing it would change the running driver.
    refused(p.run("patch", "pod", "p-driver-0123abcd", "-p", image), not_p)
    # Whole collections, pods of its own making, scaling: not in the driver's Role at all.
    refused(p.run("delete", "pods", "--all"), "forbidden")
    refused(p.run("delete", "configmaps", "--all"), "forbidden")
    refused(p.create(_pod(space, "p-rogue", "p", "executor")), "forbidden")
    refused(p.run("scale", "statefulset", "spark-s-q-0", "--replicas=5"), "forbidden")

    # What the refusals protected is unchanged.
    pod = space.kube.kubectl_json("get", "pod", "q-driver-0123abcd", "-n", space.name)
    assert pod["spec"]["containers"][0]["image"] == "stator-runtime:test"
    assert "x" not in pod["metadata"]["labels"]
    space.kube.kubectl("get", "configmap", "q-config", "-n", space.name)
    sets = space.kube.kubectl_json("get", "statefulsets", "-n", space.name)["items"]
    assert sets == [], [s["metadata"]["name"] for s in sets]
