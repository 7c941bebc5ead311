"""The operator end to end, on the real API server with pods run by the node agent."""

from __future__ import annotations

import json
import time
from typing import Any

from stator.sinks import read_committed
from stator.storage import S3Options
from tests.e2e.cluster import Space, restrict
from tests.e2e.counts_output import assert_exact, committed
from tests.hostile_specs import HOSTILE

COUNT = 24_000


# Input for 100 s: the rescale starts after two checkpoints and pre-starts the new driver first,
# which took 36-63 s on a busy 2-core machine; the job must still be running when it stops it.
SCALED_COUNT, SCALED_RATE = 40_000, 400


def test_apply_run_checkpoint_scale(space: Space) -> None:
    name = "counts"
    manifest = space.manifest(name, env={"COUNT": SCALED_COUNT, "RATE": SCALED_RATE})
    t0 = time.monotonic()
    space.apply(manifest)
    while not space.driver_pods(name):
        assert time.monotonic() - t0 < 30, "no driver pod"
        time.sleep(0.05)
    print(f"apply -> driver pod created: {time.monotonic() - t0:.2f}s")

    status = space.wait(
        name,
        "running with a checkpoint",
        lambda s: s.get("phase") == "Running" and s.get("latestCheckpoint", {}).get("id", 0) >= 2,
    )
    assert status["replicas"] == 2 and status["latestCheckpoint"]["stateBytes"] > 0
    table = space.kube.kubectl("get", "spl", name, "-n", space.name).stdout
    assert "Running" in table and "PHASE" in table.upper()

    space.kube.kubectl("scale", "statefulpipeline", name, "-n", space.name, "--replicas=4")
    status = space.wait(
        name,
        "rescaled to 4",
        lambda s: (
            s.get("replicas") == 4
            and s.get("phase") in ("Running", "Finished")
            and not s.get("operation")
        ),
    )
    restored = status["deployment"]["restoredFrom"]
    assert restored.startswith(f"s3://{space.bucket}/{name}/savepoints/"), restored
    assert status["savepoints"][-1]["path"] == restored
    space.finish(name)
    reasons = space.events()
    for reason in ("SpecChanged", "SavepointCompleted", "DriverCreated", "RescaleCompleted"):
        assert reason in reasons, reasons
    assert_exact(committed(space, name), SCALED_COUNT)


def test_bad_manifests_are_rejected(space: Space) -> None:
    good = space.manifest("bad")
    cases = {
        "image": (
            {**good, "spec": {k: v for k, v in good["spec"].items() if k != "image"}},
            "spec.image: Required value",
        ),
        "replicas": (
            {**good, "spec": {**good["spec"], "replicas": -1}},
            "spec.replicas: Invalid value: -1",
        ),
        "upgradeMode": (
            {**good, "spec": {**good["spec"], "upgradeMode": "yolo"}},
            'spec.upgradeMode: Unsupported value: "yolo"',
        ),
        "entrypoint": (
            {**good, "spec": {**good["spec"], "entrypoint": "rm -rf /"}},
            "spec.entrypoint: Invalid value",
        ),
        "replicas > maxParallelism": (
            {**good, "spec": {**good["spec"], "replicas": 65, "maxParallelism": 64}},
            "replicas may not exceed maxParallelism",
        ),
    }
    for field, (manifest, message) in cases.items():
        result = space.apply(manifest, check=False)
        assert result.returncode != 0, field
        assert message in result.stderr, (field, result.stderr)
    # Neither is required: the runtime's defaults apply (the rules hold without them).
    for absent in (("replicas",), ("maxParallelism",), ("replicas", "maxParallelism")):
        spec = {k: v for k, v in good["spec"].items() if k not in absent}
        result = space.kube.kubectl(
            "apply", "--dry-run=server", "-f", "-", input=json.dumps({**good, "spec": spec})
        )
        assert result.returncode == 0, (absent, result.stderr)
    assert space.kube.kubectl("get", "spl", "-n", space.name, "-o", "name").stdout == ""


def test_max_parallelism_is_immutable_and_unreadable_savepoint_is_reported(space: Space) -> None:
    name = "immutable"
    missing = f"s3://{space.bucket}/nothing-here"
    space.apply(space.manifest(name, restore={"initialSavepoint": missing}))
    status = space.wait(name, "spec reported invalid", lambda s: s.get("phase") == "Failed")
    assert "spec.restore.initialSavepoint" in status["lastError"] and missing in status["lastError"]
    assert not space.driver_pods(name), "nothing is deployed from an unreadable savepoint"

    def patched(pipeline: str, spec: dict[str, Any]) -> Any:
        patch = json.dumps({"spec": spec})
        return space.kube.kubectl(
            "patch", "spl", pipeline, "-n", space.name, "--type=merge", "-p", patch, check=False
        )

    fixed = "maxParallelism is fixed for the life of the state"
    for change in ({"maxParallelism": 128}, {"maxParallelism": None}):  # changed, removed
        result = patched(name, change)
        assert result.returncode != 0 and fixed in result.stderr, (change, result.stderr)
    # Unset at creation stays unset (the state's key-groups came from the pipeline or 128).
    unset = space.manifest("unset", restore={"initialSavepoint": missing})
    del unset["spec"]["maxParallelism"]
    space.apply(unset)
    result = patched("unset", {"maxParallelism": 128})
    assert result.returncode != 0 and fixed in result.stderr, result.stderr
    assert patched("unset", {"replicas": 3}).returncode == 0, "other changes pass the rule"


def test_misspelled_config_key_is_reported_before_anything_runs(space: Space) -> None:
    name = "typo"
    space.apply(space.manifest(name, config={"epoch.max_recods": "3000"}))
    status = space.wait(name, "spec reported invalid", lambda s: s.get("phase") == "Failed")
    assert "spec.config: unknown config key 'epoch.max_recods'" in status["lastError"]
    assert "did you mean 'epoch.max_records'" in status["lastError"]
    condition = {c["type"]: c for c in status["conditions"]}["SpecValid"]
    assert (condition["status"], condition["reason"]) == ("False", "InvalidSpec")
    assert not space.driver_pods(name), "nothing is deployed from an invalid spec"
    # Fixing the key deploys it.
    space.kube.kubectl(
        "patch",
        "spl",
        name,
        "-n",
        space.name,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"config": {"epoch.max_recods": None, "epoch.max_records": "3000"}}}),
    )
    space.wait(name, "deployed after the fix", lambda s: s.get("phase") == "Running")


def test_hostile_pod_templates_and_plain_text_secrets_are_refused(space: Space) -> None:
    """Each hostile spec (tests/hostile_specs.py) is refused with SpecValid=False and a
    message naming the field and the rule; nothing is created for it."""
    names = {}
    for i, (case, (change, _)) in enumerate(sorted(HOSTILE.items())):
        name = f"hostile-{i}"
        names[case] = name
        manifest = space.manifest(name)
        manifest["spec"].update(change)
        space.apply(manifest)
    for case, name in names.items():
        message = HOSTILE[case][1]
        status = space.wait(
            name,
            f"{case} refused",
            lambda s: any(
                c["type"] == "SpecValid" and c["status"] == "False" for c in s.get("conditions", [])
            ),
            timeout=60,
        )
        assert message in status["lastError"], (case, status["lastError"])
        assert status["phase"] == "Failed", case
    created = space.kube.kubectl(
        "get",
        "pods,configmaps,services",
        "-n",
        space.name,
        "-l",
        "app.kubernetes.io/name=stator",
        "-o",
        "name",
    ).stdout
    assert created == "", created
    # The RoleBinding template (issue 38) made the operator create nothing of its own kind.
    bindings = space.kube.kubectl_json("get", "rolebindings", "-n", space.name)["items"]
    subjects = [s.get("name") for b in bindings for s in b.get("subjects") or []]
    assert "mallory" not in subjects, subjects


def test_an_object_of_the_pipelines_name_it_does_not_own_is_neither_replaced_nor_adopted(
    space: Space,
) -> None:
    """Issue 38: a ConfigMap named like the pipeline's config but someone else's stays as it
    is; the pipeline waits with SpecValid=False (NameTaken) and runs no driver."""
    name = "taken"
    foreign = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{name}-config", "namespace": space.name},
        "data": {"job.yaml": "s3: {endpoint_url: 'http://elsewhere'}"},
    }
    space.kube.kubectl("apply", "-f", "-", input=json.dumps(foreign))
    space.apply(space.manifest(name))
    status = space.wait(
        name,
        "refused: the name is taken",
        lambda s: any(
            c["type"] == "SpecValid" and c["status"] == "False" and c["reason"] == "NameTaken"
            for c in s.get("conditions", [])
        ),
        timeout=60,
    )
    assert (
        f"ConfigMap {space.name}/{name}-config already exists and is not owned"
        in (status["lastError"])
    )
    kept = space.kube.kubectl_json("get", "configmap", f"{name}-config", "-n", space.name)
    assert kept["data"] == foreign["data"] and not kept["metadata"].get("ownerReferences")
    assert not space.driver_pods(name)
    space.kube.kubectl("delete", "statefulpipeline", name, "-n", space.name, "--wait=false")


def test_namespace_admission_enforces_the_restricted_profile(space: Space) -> None:
    """Defence in depth: a pod that bypasses the operator is refused by the API server."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "rooted", "namespace": space.name},
        "spec": {
            "containers": [
                {"name": "c", "image": "busybox", "securityContext": {"privileged": True}}
            ]
        },
    }
    result = space.kube.kubectl("create", "-f", "-", input=json.dumps(pod), check=False)
    assert result.returncode != 0
    assert 'violates PodSecurity "restricted:latest"' in result.stderr, result.stderr


def test_a_namespace_that_does_not_enforce_restricted_runs_no_pipeline(space: Space) -> None:
    """The operator relies on that admission for the executors Spark starts (issue 38): in a
    namespace without it a pipeline waits with SpecValid=False and the fix in its message,
    and runs once the namespace is labelled, without a change to its spec."""
    label = "pod-security.kubernetes.io/enforce"
    space.kube.kubectl("label", "namespace", space.name, f"{label}=baseline", "--overwrite")
    name = "unrestricted"
    space.apply(space.manifest(name, env={"COUNT": 3000, "RATE": 1000}))
    status = space.wait(
        name,
        "refused",
        # The condition and lastError are two status writes: wait for both.
        lambda s: (
            "lastError" in s
            and any(
                c["type"] == "SpecValid" and c["status"] == "False" for c in s.get("conditions", [])
            )
        ),
        timeout=60,
    )
    assert f"{label}=restricted" in status["lastError"], status["lastError"]
    assert "enforces 'baseline'" in status["lastError"], status["lastError"]
    pods = space.kube.kubectl("get", "pods", "-n", space.name, "-o", "name").stdout
    assert pods == "", pods
    restrict(space.kube, space.name)
    space.wait(name, "deployed", lambda s: bool(s.get("deployment")), timeout=120)


def test_a_user_function_that_raises_fails_the_pipeline_with_its_cause(space: Space) -> None:
    """The job ends at once (no restarts) and the user's exception is the pipeline's
    lastError and a JobFailed event, not 'driver pod Failed (exit 2)'."""
    name = "raises"
    space.apply(space.manifest(name, env={"COUNT": 3000, "RATE": 3000, "FAIL_KEY": "k11"}))
    status = space.wait(name, "failed", lambda s: s.get("phase") == "Failed", timeout=240)
    assert "KeyError: 'price'" in status["lastError"], status["lastError"]
    assert "restarts" not in status, status
    assert "JobFailed" in space.events()


def test_rbac_grants_what_each_needs_and_nothing_more(space: Space) -> None:
    """``kubectl auth can-i`` as the operator's service account (namespaced mode: a Role in
    each watched namespace) and as a pipeline's driver: this one runs Spark in its pod, so
    its own Lease and nothing else (the user code it runs could otherwise start pods; what a
    driver with executor pods gets is the unit test's, test_operator_spec.py)."""
    name = "rbac"
    space.apply(space.manifest(name, env={"COUNT": 3000, "RATE": 1000}))
    space.wait(name, "deployed", lambda s: bool(s.get("deployment")), timeout=120)
    operator = "system:serviceaccount:stator-system:stator-stator-operator"
    driver = f"system:serviceaccount:{space.name}:{name}-stator"

    def can(who: str, verb: str, resource: str, namespace: str | None = None) -> bool:
        where = ["-n", namespace] if namespace else ["--all-namespaces"]
        if resource.split("/", maxsplit=1)[0] in (
            "nodes",
            "persistentvolumes",
            "clusterrolebindings",
            "namespaces",
        ):
            where = []
        out = space.kube.kubectl("auth", "can-i", verb, resource, "--as", who, *where, check=False)
        return out.stdout.strip() == "yes"

    ns = space.name
    allowed = [
        (operator, "create", "pods", ns),
        (operator, "get", "secrets", ns),  # the Secrets specs name, by name
        (operator, "patch", "statefulpipelines.stator.dev/status", ns),
        (operator, "delete", "persistentvolumeclaims", ns),
        (operator, "create", "statefulsets.apps", ns),
        (operator, "update", "leases.coordination.k8s.io", "stator-system"),
        (operator, "list", "nodes", None),
        (operator, "get", f"namespaces/{ns}", None),  # its Pod Security label
        (driver, "update", f"leases.coordination.k8s.io/{name}-driver", ns),  # its own Lease
        (operator, "create", "leases.coordination.k8s.io", ns),
    ]
    denied = [
        (operator, "list", "secrets", ns),  # never every Secret
        (operator, "get", "secrets", "kube-system"),
        (operator, "create", "pods", "default"),  # not a watched namespace
        (operator, "create", "pods", None),  # not cluster-wide
        (operator, "create", "clusterrolebindings", None),
        (operator, "delete", "nodes", None),
        (operator, "delete", "persistentvolumes", None),
        (operator, "get", "namespaces/kube-system", None),  # watched namespaces only
        (operator, "list", "namespaces", None),
        (driver, "deletecollection", "pods", ns),
        (driver, "delete", "configmaps", ns),
        (driver, "get", "secrets", ns),
        (driver, "create", "pods", ns),  # no executor pods: nothing on pods at all
        (driver, "patch", "pods", ns),
        (driver, "create", "configmaps", ns),
        (driver, "create", "statefulsets.apps", ns),
        (driver, "patch", "statefulsets.apps/scale", ns),
        (driver, "delete", "persistentvolumeclaims", ns),  # the claims outlive drivers
        (driver, "create", "roles.rbac.authorization.k8s.io", ns),
        (driver, "create", "services", ns),
        (driver, "get", "statefulpipelines.stator.dev", ns),
        (driver, "create", "pods", "default"),
        (driver, "list", "nodes", None),
        (driver, "update", "leases.coordination.k8s.io/another-driver", ns),
        (driver, "create", "leases.coordination.k8s.io", ns),
    ]
    wrong = [c for c in allowed if not can(*c)] + [c for c in denied if can(*c)]
    assert not wrong, wrong


def test_a_two_region_pipeline_shows_its_regions_and_rescales(space: Space) -> None:
    """Two disconnected pipelines in one StatefulPipeline (failover.strategy: region, the
    default): the status lists both regions with their checkpoints, and `kubectl scale` takes
    one savepoint of both, hands it to the pre-started driver and each sink stays exact."""
    from stator.sources import KeyedEvents

    name = "regions"
    out = {n: f"s3://{space.bucket}/{name}/out-{n}" for n in ("a", "b")}
    env = {"OUT_A": out["a"], "OUT_B": out["b"], "COUNT": SCALED_COUNT, "RATE": SCALED_RATE}
    space.apply(space.manifest(name, entrypoint="tests.pipelines.two_regions:build", env=env))
    status = space.wait(
        name,
        "both regions running with checkpoints",
        lambda s: (
            s.get("phase") == "Running"
            and len(s.get("regions", [])) == 2
            and all(r.get("latestCheckpoint") for r in s["regions"])
        ),
    )
    assert {r["id"]: r["state"] for r in status["regions"]} == {
        "in-a": "RUNNING",
        "in-b": "RUNNING",
    }
    space.kube.kubectl("scale", "statefulpipeline", name, "-n", space.name, "--replicas=3")
    status = space.wait(
        name,
        "rescaled to 3",
        lambda s: s.get("replicas") == 3 and s.get("phase") == "Running" and not s.get("operation"),
    )
    assert status["deployment"]["restoredFrom"].startswith(
        f"s3://{space.bucket}/{name}/savepoints/"
    )
    space.wait(  # mirrored from the new driver's status
        name, "both at 3", lambda s: s.get("parallelism") == {"count-a": 3, "count-b": 3}
    )
    space.finish(name)
    opts = S3Options(
        endpoint_url=space.s3.endpoint_url,
        access_key_id=space.s3.access_key,
        secret_access_key=space.s3.secret_key,
    )
    for n, keys in (("a", 40), ("b", 25)):
        expected: dict[str, int] = {}
        for e in KeyedEvents(keys, seed=1 + keys).make(0, SCALED_COUNT, 1):
            expected[e[0]] = expected.get(e[0], 0) + 1
        seen: dict[str, list[int]] = {}
        records: list[Any] = read_committed(out[n], opts)
        for key, total in records:
            seen.setdefault(key, []).append(total)
        assert all(t == sorted(set(t)) for t in seen.values()), f"{n}: committed twice"
        assert {k: t[-1] for k, t in seen.items()} == expected, n
