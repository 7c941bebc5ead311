"""Every operator flow end to end: upgrades by mode, suspend/resume, a killed driver, a killed
operator at each flow step, a leader killed mid-rescale with a standby replica taking over, a
failed upgrade that rolls back, and deletion."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from stator.ha.fencing import LEASE_LOST_EXIT, TAKEOVER_ID_GAP
from stator_operator.operation import Step
from tests.e2e.cluster import (
    EXTERNAL,
    LEADER_LEASE,
    LEASE_SECONDS,
    OPERATOR_NS,
    InClusterOperator,
    NodeControl,
    OperatorControl,
    Space,
    launch_operator,
    wait_running_again,
)
from tests.e2e.counts_output import assert_exact, committed

COUNT = 30_000
COUNT_LOST = 60_000  # two minutes at 500 events/s: the loss lands mid-stream
STEPS = tuple(Step)  # of every flow: a rescale goes through all six
COUNT_KILLED = 150_000  # 5 minutes of input at 500 events/s: more than the rescales take


def patch(space: Space, name: str, spec: dict[str, Any]) -> None:
    space.kube.kubectl(
        "patch", "spl", name, "-n", space.name, "--type=merge", "-p", json.dumps({"spec": spec})
    )


def running(s: dict[str, Any]) -> bool:
    return s.get("phase") == "Running" and not s.get("operation")


def start(
    space: Space, name: str, count: int = COUNT, rate: int = 500, prestart: bool = True, **spec: Any
) -> None:
    manifest = space.manifest(name, env={"COUNT": count, "RATE": rate}, **spec)
    if not prestart:  # beside the driver's environment the manifest sets
        manifest["spec"]["driver"]["prestart"] = False
    space.apply(manifest)
    space.wait(
        name,
        "running with a checkpoint",
        lambda s: running(s) and s.get("latestCheckpoint", {}).get("id", 0) >= 1,
    )


def test_upgrade_by_savepoint_then_last_state_then_stateless(space: Space) -> None:
    name = "upgrades"
    start(space, name)
    first = space.status(name)["deployment"]["id"]
    patch(space, name, {"config": {"epoch.max_records": "2500"}})
    s = space.wait(
        name, "savepoint upgrade", lambda s: running(s) and s["deployment"]["id"] != first
    )
    assert s["deployment"]["restoredFrom"].startswith(f"s3://{space.bucket}/{name}/savepoints/")
    assert s["lastReconciledSpec"]["config"]["epoch.max_records"] == "2500"

    second = s["deployment"]["id"]
    patch(
        space,
        name,
        {
            "upgradeMode": "last-state",
            "config": {"epoch.max_records": "2000"},
        },
    )
    s = space.wait(
        name, "last-state upgrade", lambda s: running(s) and s["deployment"]["id"] != second
    )
    assert s["deployment"]["restoredFrom"] == "latest"
    space.finish(name, timeout=300)
    assert_exact(committed(space, name), COUNT)  # both stateful upgrades kept every count

    third = s["deployment"]["id"]
    patch(
        space,
        name,
        {
            "upgradeMode": "stateless",
            "config": {"epoch.max_records": "3000"},
        },
    )
    s = space.wait(
        name,
        "stateless upgrade",
        lambda s: s.get("deployment", {}).get("id") != third and not s.get("operation"),
    )
    assert s["deployment"]["restoredFrom"] == "none"
    pod = space.driver_pods(name)[-1]
    args = pod["spec"]["containers"][0]["args"]
    assert args[args.index("--restore") + 1] == "none" and "restore.force_empty=true" in args


def test_suspend_and_resume(space: Space) -> None:
    name = "pausable"
    start(space, name)
    patch(space, name, {"state": "suspended"})
    s = space.wait(name, "suspended", lambda s: s.get("phase") == "Suspended")
    assert not [
        p for p in space.driver_pods(name) if p["status"].get("phase") in ("Pending", "Running")
    ]
    savepoint = s["suspendedWith"]
    assert savepoint.startswith(f"s3://{space.bucket}/{name}/savepoints/")
    patch(space, name, {"state": "running"})
    s = space.wait(name, "resumed", running)
    assert s["deployment"]["restoredFrom"] == savepoint
    space.finish(name, timeout=300)
    assert_exact(committed(space, name), COUNT)


def test_killed_driver_restarts_from_the_latest_checkpoint(space: Space, kill_driver: Any) -> None:
    name = "crashy"
    start(space, name)
    pod = space.driver_pods(name)[-1]["metadata"]["name"]
    kill_driver(space.name, pod)
    s = space.wait(
        name,
        "restarted",
        lambda s: running(s) and s.get("restarts") == 1 and s["deployment"]["driverPod"] != pod,
    )
    assert s["deployment"]["restoredFrom"] == "latest"
    assert "DriverFailed" in space.events()
    space.finish(name, timeout=300)
    assert_exact(committed(space, name), COUNT)


def test_a_driver_on_a_lost_node_is_replaced_and_fenced(space: Space, nodes: NodeControl) -> None:
    """The driver's node vanishes (its processes freeze, its heartbeats stop). The driver's
    Lease lapses, the operator removes its pod and a new driver on another node restores the
    latest checkpoint: running again within 60 s. Then the old node's processes run on, still
    cut off (a partition): the old driver finds its Lease taken and exits without writing.
    The output is exact."""
    name = "lostdriver"
    start(space, name, count=COUNT_LOST, rate=500)
    old = space.driver_pods(name)[-1]
    pod, node = old["metadata"]["name"], old["spec"]["nodeName"]
    before = space.status(name)["epoch"]
    lost_at = time.monotonic()
    nodes.lose(node)
    try:
        s = wait_running_again(
            space,
            name,
            f"a new driver processing (driver node {node} lost)",
            lambda s: (
                running(s)
                and s["deployment"]["driverPod"] != pod
                and (s.get("epoch") or 0) > before
            ),
            lost_at,
            timeout=180,
        )
        new = space.driver_pods(name)[-1]
        assert new["spec"]["nodeName"] != node
        assert "DriverLost" in space.events()
        assert s["deployment"]["restoredFrom"] == "latest"
        cut_off = nodes.cut_off(node)
        if cut_off is not None:  # the node agent and real nodes can partition a node; kind not
            assert cut_off.exit_code(old, 60) == LEASE_LOST_EXIT
            assert "this driver was replaced" in cut_off.log(old)
        s = space.finish(name, timeout=300)
        assert_exact(committed(space, name), COUNT_LOST)
        # The new driver took over from one that did not release its Lease: it skipped ids.
        assert s["latestCheckpoint"]["id"] > TAKEOVER_ID_GAP
    finally:
        nodes.restore(node)


@pytest.mark.timeout(1200)  # rescales until the operator was killed at every step
def test_operator_killed_at_every_step_of_a_rescale(
    space: Space, operator: OperatorControl
) -> None:
    """The operator is SIGKILLed at each step of a rescale (prestart, savepoint, await the
    savepoint, remove the old driver, deploy, await ready; a kill meant for a step lands at
    the first status that shows it or a later one: saving and deploying pass in a moment) and
    started again: within one rescale at each step in turn, then in a further rescale for the
    steps left if one ended first. No step runs twice (one driver per deployment) and the
    output is exact."""
    name = "resilient"
    start(space, name, count=COUNT_KILLED, rate=500)
    covered: set[int] = set()  # steps k whose kill landed at step k or later
    hit: list[int] = []  # the steps the kills landed at
    rescales = 0
    for replicas in (3, 4, 2, 3, 4, 2):
        if len(covered) == len(STEPS):
            break
        before = space.status(name)["deployment"]["id"]
        space.kube.kubectl("scale", "spl", name, "-n", space.name, f"--replicas={replicas}")
        rescales += 1
        for k in [k for k in range(len(STEPS)) if k not in covered]:
            s = space.wait(
                name,
                f"step {k} of the rescale to {replicas}",
                lambda s, k=k, b=before: (
                    (s.get("operation") and int(s["operation"].get("step", 0)) >= k)
                    or (s.get("deployment", {}).get("id") != b and not s.get("operation"))
                ),
            )
            if not s.get("operation"):
                break  # the rescale ended: the next one gets the steps not yet killed at
            operator.kill()
            covered.add(k)
            hit.append(int(s["operation"]["step"]))
            time.sleep(1)
            operator.start()
        s = space.wait(
            name,
            f"rescale to {replicas}",
            lambda s, r=replicas: running(s) and s.get("replicas") == r,
            timeout=300,
        )
        assert s["deployment"]["id"] != before
    print(f"{rescales} rescales; the kills landed at steps {hit}")
    assert covered == set(range(len(STEPS))), f"kills for steps {sorted(covered)}"
    creates = [
        e
        for e in space.kube.kubectl_json("get", "events", "-n", space.name)["items"]
        if e["reason"] == "DriverCreated"
    ]
    # One driver for the first deployment and one per rescale: no step ran twice.
    messages = [e["message"] for e in creates]
    assert len(set(messages)) == 1 + rescales, messages
    assert "PrestartFailed" not in space.events()
    space.finish(name, timeout=600)  # the rest of the input at full speed
    assert_exact(committed(space, name), COUNT_KILLED)


def test_leader_killed_mid_rescale_the_standby_finishes_it(
    space: Space, operator: OperatorControl, request: pytest.FixtureRequest, tmp_path: Any
) -> None:
    """Two operator replicas: the leader is killed while it waits for a rescale's savepoint
    (SIGKILL of the session's operator process, or a force deletion of the leader's pod on
    a cluster where the chart runs both); the standby takes its Lease once it lapses and
    finishes the rescale: one driver per deployment, exact output."""
    kill: Callable[[], object]
    if EXTERNAL:
        assert isinstance(operator, InClusterOperator)
        standby = None
        kill = operator.kill_leader
    else:
        standby = launch_operator(request.getfixturevalue("kube"), tmp_path)
        standby.start()  # answers its liveness endpoint while it waits for the Lease
        kill = operator.kill
    killed = False
    try:
        name = "ha"
        start(space, name, count=40_000, rate=500)
        before = space.status(name)["deployment"]["id"]
        space.kube.kubectl("scale", "spl", name, "-n", space.name, "--replicas=3")
        space.wait(
            name,
            "the rescale's savepoint requested",
            lambda s: int((s.get("operation") or {}).get("step", 0)) >= 2,
        )
        kill()
        killed, at = True, time.monotonic()
        s = space.wait(
            name,
            "rescaled by the standby",
            lambda s: running(s) and s.get("replicas") == 3,
            timeout=300,
        )
        print(f"the standby finished the rescale {time.monotonic() - at:.1f} s after the kill")
        assert s["deployment"]["id"] != before
        lease = space.kube.kubectl_json("get", "lease", LEADER_LEASE, "-n", OPERATOR_NS)
        assert lease["spec"]["leaseTransitions"] >= 1
        assert int(lease["spec"]["leaseDurationSeconds"]) == LEASE_SECONDS
        creates = [
            e["message"]
            for e in space.kube.kubectl_json("get", "events", "-n", space.name)["items"]
            if e["reason"] == "DriverCreated"
        ]
        assert len(creates) == len(set(creates)) == 2, creates  # the first and the rescaled one
        space.finish(name, timeout=400)
        assert_exact(committed(space, name), 40_000)
    finally:
        if standby is not None:
            standby.stop()  # releases the Lease: the session's operator leads again at once
            if killed:
                operator.start()


def test_failed_upgrade_rolls_back(space: Space) -> None:
    # Without a pre-started driver the new one fails after the old one stopped: rolled back.
    name = "rollback"
    start(space, name, prestart=False)
    first = space.status(name)["deployment"]["id"]
    stable = space.status(name)["lastStableSpec"]
    patch(space, name, {"entrypoint": "tests.pipelines.e2e_counts:missing_function"})
    s = space.wait(
        name,
        "rolled back",
        lambda s: (
            s.get("phase") in ("Running", "Finished")
            and not s.get("operation")
            and s.get("failedSpec")
            and s["deployment"]["id"] != first
        ),
    )
    assert "UpgradeFailed" in space.events()
    assert "driver pod Failed" in s["lastError"], s["lastError"]
    assert s["lastReconciledSpec"]["entrypoint"] == stable["entrypoint"]
    assert s["deployment"]["restoredFrom"].startswith(f"s3://{space.bucket}/{name}/savepoints/")
    upgrade = {c["type"]: c for c in s["conditions"]}["UpgradeSucceeded"]
    assert (upgrade["status"], upgrade["reason"]) == ("False", "RolledBack")
    rolled_back_to = s["deployment"]["id"]
    space.finish(name, timeout=300)
    s = space.status(name)
    assert s["deployment"]["id"] == rolled_back_to, "the failed spec is not retried"
    assert "missing_function" in json.dumps(space.get(name)["spec"]), "the user's spec is kept"
    assert_exact(committed(space, name), COUNT)


def test_an_upgrade_whose_new_driver_refuses_to_start_leaves_the_job_running(
    space: Space,
) -> None:
    # The pre-started driver exits 2 (its pipeline cannot be loaded) before the running job
    # was asked to stop: the upgrade is given up, the running deployment never stops.
    name = "refused"
    start(space, name)
    first = space.status(name)["deployment"]["id"]
    patch(space, name, {"entrypoint": "tests.pipelines.e2e_counts:missing_function"})
    s = space.wait(
        name, "upgrade given up", lambda s: bool(s.get("failedSpec")) and not s.get("operation")
    )
    assert s["deployment"]["id"] == first, "the running job was not redeployed"
    assert "the new driver refused to start" in s["lastError"], s["lastError"]
    upgrade = {c["type"]: c for c in s["conditions"]}["UpgradeSucceeded"]
    assert (upgrade["status"], upgrade["reason"]) == ("False", "NotStarted")
    assert "UpgradeFailed" in space.events()
    space.finish(name, timeout=300)
    assert space.status(name)["deployment"]["id"] == first, "the failed spec is not retried"
    assert_exact(committed(space, name), COUNT)


def _savepoints(space: Space, name: str) -> list[str]:
    listed = space.s3.client().list_objects_v2(Bucket=space.bucket, Prefix=f"{name}/savepoints/")
    return [o["Key"] for o in listed.get("Contents", []) if o["Key"].endswith("_savepoint.json")]


def test_delete_with_and_without_final_savepoint(space: Space) -> None:
    for name, final in (("keep", True), ("drop", False)):
        start(space, name, count=200_000, deletion={"finalSavepoint": final, "timeoutSeconds": 60})
        # The pipeline's uid owns its checkpoint root (issue 38); its deletion releases it.
        uid = space.kube.kubectl(
            "get", "spl", name, "-n", space.name, "-o", "jsonpath={.metadata.uid}"
        ).stdout
        marker = f"{name}/checkpoints/{space.name}.{name}/_owner.json"
        s3 = space.s3.client()
        owner = json.loads(s3.get_object(Bucket=space.bucket, Key=marker)["Body"].read())
        assert owner["owner"] == uid, owner
        space.kube.kubectl("delete", "spl", name, "-n", space.name, "--timeout=120s")
        assert space.kube.kubectl("get", "spl", name, "-n", space.name, check=False).returncode != 0
        deadline = time.monotonic() + 60
        while space.driver_pods(name) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not space.driver_pods(name), "the driver goes with its pipeline"
        assert len(_savepoints(space, name)) == (1 if final else 0)
        left = s3.list_objects_v2(Bucket=space.bucket, Prefix=marker).get("Contents", [])
        assert left == [], "the deleted pipeline released its checkpoint root"


def test_savepoints_on_demand_and_periodic_with_a_bounded_history(space: Space) -> None:
    name = "snapshots"
    directory = f"s3://{space.bucket}/{name}/savepoints"
    start(space, name, count=400_000, savepoints={"directory": directory, "historyMaxCount": 2})
    patch(space, name, {"savepoints": {"triggerNonce": 1}})
    s = space.wait(name, "savepoint on demand", lambda s: s.get("savepointNonce") == 1)
    assert [h["trigger"] for h in s["savepoints"]] == ["savepoint"]
    assert s["deployment"]["id"], "a savepoint on demand does not redeploy"
    deployment = s["deployment"]["id"]

    patch(space, name, {"savepoints": {"periodicSeconds": 2}})
    s = space.wait(
        name,
        "three periodic savepoints",
        lambda s: space.events().count("SavepointCompleted") >= 4 and not s.get("operation"),
        timeout=300,
    )
    history = s["savepoints"]
    assert len(history) == 2 and {h["trigger"] for h in history} == {"periodic"}, history
    assert s["deployment"]["id"] == deployment and s.get("phase") == "Running"
    on_s3 = sorted(
        f"s3://{space.bucket}/{key.rsplit('/', 1)[0]}" for key in _savepoints(space, name)
    )
    assert on_s3 == sorted(h["path"] for h in history), "pruned savepoints are disposed"
