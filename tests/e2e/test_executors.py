"""Executors as pods: a StatefulPipeline with ``spec.executor`` runs Spark's Kubernetes
backend in client mode from its driver pod; executors run in a StatefulSet (owned by the
driver pod) on claims of local volumes, so each comes back to its node. Keyed tasks run where
their state is, a killed executor or driver restores from the local copies, a lost node's
key-group ranges (and only those) are read from the object store, and the output is exact,
record for record."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from stator.checkpoint.coordinator import load_checkpoint
from stator.checkpoint.metadata import checkpoint_dir
from stator.storage import S3Options, open_store
from tests.e2e.cluster import (
    EXTERNAL,
    LOCAL_STORAGE_CLASS,
    NodeControl,
    Space,
    wait_running_again,
)
from tests.e2e.counts_output import assert_exact, committed

STORAGE_CLASS = os.environ.get("STATOR_E2E_LOCAL_STORAGE_CLASS", LOCAL_STORAGE_CLASS)
# What a keyed task's retry away from the executor holding its state says (locality/restore.py).
REFUSAL = "does not read the state from the object store"


def executor_manifest(
    space: Space,
    name: str,
    replicas: int,
    count: int,
    rate: int,
    per_epoch: int,
    hold_file: str = "",
    **local: Any,
) -> dict[str, Any]:
    env: dict[str, Any] = {"COUNT": count, "RATE": rate}
    if hold_file:
        env["HOLD_FILE"] = hold_file
    manifest = space.manifest(name, replicas=replicas, env=env)
    env = {e["name"]: e["value"] for e in manifest["spec"]["driver"]["env"]}
    manifest["spec"]["config"]["epoch.max_records"] = str(per_epoch)
    manifest["spec"]["executor"] = {
        "cores": 2,
        "memory": "512m",
        # The executors write sink output and checkpoints to the same S3 endpoint.
        "env": [{"name": "AWS_ENDPOINT_URL_S3", "value": env["AWS_ENDPOINT_URL_S3"]}],
    }
    manifest["spec"]["localRecovery"] = {
        "volume": {"storageClassName": STORAGE_CLASS, "size": "1Gi"},
        **local,
    }
    return manifest


def executors(space: Space, name: str) -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = space.kube.kubectl_json(
        "get", "pods", "-n", space.name, "-l", f"stator.dev/pipeline={name},spark-role=executor"
    )["items"]
    return sorted(pods, key=lambda p: p["metadata"]["name"])


def running_executors(space: Space, name: str, n: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pods = [
            p
            for p in executors(space, name)
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        ]
        if len(pods) == n:
            return pods
        time.sleep(0.5)
    raise TimeoutError(f"{n} running executors of {name}: {executors(space, name)}")


def nodes_of(pods: list[dict[str, Any]]) -> dict[str, str]:
    return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods}


def claim_nodes(space: Space, pods: list[dict[str, Any]]) -> dict[str, str]:
    """Executor pod -> the node of the local volume its state claim is bound to."""
    out = {}
    for pod in pods:
        claim = next(
            v["persistentVolumeClaim"]["claimName"]
            for v in pod["spec"]["volumes"]
            if v.get("persistentVolumeClaim")
        )
        pvc = space.kube.kubectl_json("get", "pvc", claim, "-n", space.name)
        pv = space.kube.kubectl_json("get", "pv", pvc["spec"]["volumeName"])
        terms = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
        out[pod["metadata"]["name"]] = terms[0]["matchExpressions"][0]["values"][0]
    return out


def three_checkpoints(space: Space, name: str) -> dict[str, Any]:
    """The status once the job runs and has completed three checkpoints."""
    status: dict[str, Any] = space.wait(
        name,
        "three checkpoints",
        lambda s: s.get("phase") == "Running" and s.get("latestCheckpoint", {}).get("id", 0) >= 3,
        timeout=300,
    )
    return status


@dataclass(frozen=True)
class Running:
    """A pipeline with executor pods at its third checkpoint: what a failure test compares
    the job after the failure with."""

    status: dict[str, Any]
    pods: list[dict[str, Any]]
    nodes: dict[str, str]  # executor pod -> node
    held: dict[int, str]  # keyed subtask -> node
    driver: str  # the driver pod


def running_pipeline(space: Space, name: str, executors: int) -> Running:
    status = three_checkpoints(space, name)
    pods = running_executors(space, name, executors)
    driver = str(space.driver_pods(name)[0]["metadata"]["name"])
    return Running(status, pods, nodes_of(pods), subtask_nodes(status), driver)


def epochs_after(space: Space, name: str, before: Running, n: int, what: str) -> dict[str, Any]:
    """The status once the job has run ``n`` epochs past ``before``."""
    epoch = before.status["epoch"]
    status: dict[str, Any] = space.wait(
        name, f"{n} epochs after {what}", lambda s: s.get("epoch", 0) >= epoch + n, timeout=180
    )
    return status


def restored(status: dict[str, Any]) -> dict[str, Any]:
    return dict(status.get("restores") or {})


def test_executor_pods_on_local_volumes_run_every_task_where_its_state_is(space: Space) -> None:
    """replicas 4 at two cores per executor: two executor pods in a StatefulSet owned by the
    driver pod, on two nodes, each on a claim of a local volume of its node. Over 20 epochs
    every keyed task runs where its state is and nothing is restored; exact output."""
    name = "pods"
    count = 15_000  # 25 epochs of 600: the status still shows 20 if the job ends between polls
    space.apply(executor_manifest(space, name, 4, count, rate=1200, per_epoch=600))
    space.wait(
        name,
        "running with three checkpoints",
        lambda s: (
            s.get("phase") in ("Running", "Finished")
            and s.get("latestCheckpoint", {}).get("id", 0) >= 3
        ),
        timeout=300,
    )
    driver = space.driver_pods(name)[0]
    pods = running_executors(space, name, 2)
    nodes = nodes_of(pods)
    assert len(set(nodes.values())) == 2, f"executors not spread over the nodes: {nodes}"
    assert claim_nodes(space, pods) == nodes  # each on its own node's local volume
    owner = pods[0]["metadata"]["ownerReferences"][0]
    assert owner["kind"] == "StatefulSet"
    sts = space.kube.kubectl_json("get", "statefulset", owner["name"], "-n", space.name)
    assert [(o["kind"], o["name"]) for o in sts["metadata"]["ownerReferences"]] == [
        ("Pod", driver["metadata"]["name"])
    ]
    for pod in pods:
        assert pod["metadata"]["labels"]["stator.dev/component"] == "executor"
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    # Only the pipeline's own pods, and the operator's namespace on the control port, may
    # reach them (enforced where the network plugin implements NetworkPolicy).
    policy = space.kube.kubectl_json("get", "networkpolicy", f"{name}-stator", "-n", space.name)
    operator_ns = policy["spec"]["ingress"][1]["from"][0]["namespaceSelector"]["matchLabels"]
    assert operator_ns == {"kubernetes.io/metadata.name": "stator-system"}

    # Finished counts too: the operator stops polling the driver once the job has ended, so a
    # job that runs its last epochs between two polls can end showing an earlier epoch.
    status = space.wait(
        name,
        "20 epochs",
        lambda s: s.get("epoch", 0) >= 20 or s.get("phase") == "Finished",
        timeout=300,
    )
    placement = status["placement"]
    print("placement:", json.dumps(placement)[:2000])
    assert placement["keyedTasks"] >= 4 * 20
    assert placement["keyedTasksLocal"] == placement["keyedTasks"]
    # Which node holds which key-group ranges at which checkpoint.
    assert sorted(s["subtask"] for s in placement["subtasks"]) == [0, 1, 2, 3]
    assert {s["node"] for s in placement["subtasks"]} == set(nodes.values())
    assert sorted(tuple(s["keyGroups"]) for s in placement["subtasks"]) == [
        (0, 16),
        (16, 32),
        (32, 48),
        (48, 64),
    ]
    assert all(s["checkpointId"] for s in placement["subtasks"])
    assert (restored(status)["local"], restored(status)["remote"]) == (0, 0)
    space.finish(name, timeout=300)
    assert_exact(committed(space, name), count)


@pytest.fixture
def hold_dir() -> Iterator[Path]:
    """A directory the test and the pods' processes share. Not under /tmp: a pod's /tmp is
    an emptyDir of its own (the test bed maps its paths there)."""
    shm = Path("/dev/shm")
    path = Path(tempfile.mkdtemp(prefix="stator-e2e-", dir=shm if shm.is_dir() else None))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_killed_executor_and_a_killed_driver_restore_from_local_copies(
    space: Space, kill_driver: Any, hold_dir: Path, request: pytest.FixtureRequest
) -> None:
    """SIGKILL an executor in the middle of a keyed task, and its container as it restarts:
    Spark's retry of that task on the other executor does not read its state from the
    object store; the job rewinds and waits, the executor restarts in its pod, on its
    node, with its volume, and its subtasks go on there
    (their databases, or a local copy of the checkpoint): no byte of keyed state from the
    object store. Then SIGKILL the driver: the operator starts a new one
    whose executors come back on the same nodes and volumes, and again every subtask finds its
    state locally. Exact output."""
    name = "local"
    count = 30_000
    hold = hold_dir / "hold"
    manifest = executor_manifest(space, name, 4, count, 900, 600, hold_file=str(hold))
    # The crash-looping executor's replacement may register only after its 20 s back-off.
    manifest["spec"]["config"]["local_recovery.executor_wait_ms"] = "60000"
    # Each checkpoint completes with its epoch, so the next epoch's restore source is at its
    # base epoch: a retry could restore it from the object store (and must not).
    manifest["spec"]["checkpointing"]["asyncUpload"] = False
    space.apply(manifest)
    before = running_pipeline(space, name, 2)
    pods, nodes, held, first_driver_pod = before.pods, before.nodes, before.held, before.driver
    victim = kill_in_keyed_task(space, pods, hold, kill_driver)
    status = epochs_after(space, name, before, 6, "the executor kill")
    print("after the executor kill:", json.dumps(restored(status)), json.dumps(status["placement"]))
    assert restored(status)["remote"] == 0 and restored(status)["remoteBytes"] == 0
    # Whether Spark retried the task on the other executor first depends on timing (the
    # retry may wait out the locality delay until the restarted executor registers, as in
    # one CI run of 2026-11-27); one that did refused to read the store (no remote restore
    # above), and says so in the driver's log. The refusal itself is tested
    # deterministically in tests/unit/test_restore_and_snapshot.py.
    log = pod_log(space, first_driver_pod, request)
    refusals = [line for line in log.splitlines() if REFUSAL in line]
    print("the retry's refusal:", refusals[:1])
    # Spark learned of the loss from the driver's pod watch, not 15 s of missed heartbeats
    assert lost_executor_lines(log, victim), log[-3000:]
    placement = status["placement"]
    assert placement["keyedTasksLocal"] == placement["keyedTasks"]
    assert subtask_nodes(status) == held  # every subtask stayed on its node
    again = running_executors(space, name, 2)
    assert nodes_of(again) == nodes  # the same pods, on the same nodes
    # Restarted in place, or (after a crash loop) deleted by Spark and made again by the
    # StatefulSet: the same name, node and claim either way.
    restarted = next(p for p in again if p["metadata"]["name"] == victim)
    was = next(p for p in pods if p["metadata"]["name"] == victim)
    assert (
        restarted["status"]["containerStatuses"][0]["restartCount"] >= 1
        or restarted["metadata"]["uid"] != was["metadata"]["uid"]
    )
    assert claim_nodes(space, [restarted]) == {victim: nodes[victim]}

    first_driver = status["deployment"]["id"]
    kill_driver(space.name, space.driver_pods(name)[0]["metadata"]["name"])
    status = space.wait(
        name,
        "a new driver running two epochs",
        lambda s: (
            s.get("deployment", {}).get("id") not in (None, first_driver)
            and (s.get("placement") or {}).get("keyedTasks", 0) >= 8
        ),
        timeout=300,
    )
    print("after the driver kill:", json.dumps(restored(status)), json.dumps(status["placement"]))
    assert restored(status)["remote"] == 0 and restored(status)["remoteBytes"] == 0
    placement = status["placement"]
    assert placement["keyedTasksLocal"] == placement["keyedTasks"]
    assert subtask_nodes(status) == held
    assert nodes_of(running_executors(space, name, 2)) == nodes
    space.finish(name, timeout=400)
    assert_exact(committed(space, name), count)


def test_a_standby_executor_resumes_a_lost_executors_subtask_from_its_copy(
    space: Space, kill_driver: Any, hold_dir: Path
) -> None:
    """``localRecovery.standby`` with two keyed subtasks on three executor pods of one core
    each: each subtask has a standby copy on another executor, on another node (one of them
    on the executor that runs no keyed task, which gets its orders from the driver's own
    task). SIGKILL an executor in the middle of a keyed task, and its container twice more as
    it restarts (a crash loop: it comes back only after a back-off). Its subtask does not
    wait for it: it moves to its standby executor and restores there from the standby copy,
    reading from the object store at most the files the checkpoints added since the copy was
    made, never its whole state. Exact output."""
    name = "standby"
    count = 30_000
    hold = hold_dir / "hold"
    manifest = executor_manifest(space, name, 2, count, 900, 600, hold_file=str(hold), standby=True)
    manifest["spec"]["executor"].update(cores=1, instances=3)
    space.apply(manifest)
    three_checkpoints(space, name)
    # Copies are made after each checkpoint completes: two more make sure they are there.
    # The idle executor's node is known once its first orders task (sent beside the epochs,
    # its Python worker started first) came back: five checkpoints can take less time.
    status = space.wait(
        name,
        "five checkpoints, every standby executor's node known",
        lambda s: (
            s.get("latestCheckpoint", {}).get("id", 0) >= 5
            and all((t.get("standby") or {}).get("node") for t in s["placement"]["subtasks"])
        ),
        timeout=300,
    )
    pods = running_executors(space, name, 3)
    nodes = nodes_of(pods)
    assert len(set(nodes.values())) == 3  # one executor per node
    held = subtask_nodes(status)
    assert len(set(held.values())) == 2  # one subtask per executor, one executor idle
    standby_node = {}
    for s in status["placement"]["subtasks"]:  # each has its copy on another node
        assert s["standby"]["executor"] != s["executor"], s
        assert s["standby"]["node"] not in ("", s["node"]), s
        standby_node[s["subtask"]] = s["standby"]["node"]
    epoch = status["epoch"]
    victim = kill_in_keyed_task(space, pods, hold, kill_driver)
    moved = next(s for s, n in held.items() if n == nodes[victim])
    survivor = standby_node[moved]
    status = space.wait(
        name,
        "six epochs after the executor kill",
        lambda s: s.get("epoch", 0) >= epoch + 6,
        timeout=180,
    )
    print("after the kill:", json.dumps(restored(status)), json.dumps(status["placement"]))
    assert subtask_nodes(status)[moved] == survivor  # it did not wait for the replacement
    got = restored(status)
    assert got["remote"] == 0 and got["local"] >= 1  # from the standby copy
    latest = status["latestCheckpoint"]["id"]
    share = checkpoint_share(space, name, latest, [moved])
    assert got["remoteBytes"] < share, (got, share)  # never the whole state again
    placement = status["placement"]
    assert placement["keyedTasksLocal"] == placement["keyedTasks"]
    # What the copies cost, reported by a keyed task's executor and by the idle one's
    # hand-over task: at least a first copy of each subtask, read from MinIO.
    copies = status["standbyCopies"]
    assert copies["copies"] >= 2 and copies["bytes"] > 0, copies
    space.finish(name, timeout=400)
    assert_exact(committed(space, name), count)


def test_an_executor_lost_with_its_checkpoint_in_flight_rewinds_before_its_standby_runs(
    space: Space, request: pytest.FixtureRequest
) -> None:
    """Asynchronous uploads (the default) and standby copies: the executor running the keyed
    subtask is deleted while its epoch's checkpoint is in flight (its uploader process is
    stopped, so the upload cannot finish first). The standby copy is of the latest completed
    checkpoint, an epoch behind the job: the driver rewinds to it before it runs an epoch on
    the standby executor (it says why), instead of a keyed task there failing for the same
    reason after its Spark job ran. The subtask then restores from the standby copy (nothing
    from the object store) and the output is exact."""
    name = "standby-rewind"
    count = 24_000
    manifest = executor_manifest(space, name, 1, count, 900, 600, standby=True)
    manifest["spec"]["executor"].update(cores=1, instances=2)
    space.apply(manifest)
    status = space.wait(
        name,
        "five checkpoints",
        lambda s: s.get("phase") == "Running" and s.get("latestCheckpoint", {}).get("id", 0) >= 5,
        timeout=300,
    )
    pods = running_executors(space, name, 2)
    [held] = subtask_nodes(status).values()
    victim = next(str(p["metadata"]["name"]) for p in pods if p["spec"]["nodeName"] == held)
    assert suspend_uploaders(space, victim, request), f"no uploader process in {victim}"
    # The job goes on past its latest completed checkpoint, and no later one completes.
    behind = space.wait(
        name,
        "an epoch past the latest checkpoint",
        lambda s: s.get("epoch", 0) > s.get("latestCheckpoint", {}).get("epoch", 0),
        timeout=120,
    )
    # Every checkpoint slot fills with one the suspended uploader never confirms: the job runs
    # checkpoint.max_concurrent (2) epochs past its latest completed checkpoint, then waits.
    space.wait(
        name,
        "every checkpoint slot holding an unconfirmed checkpoint",
        lambda s: s.get("epoch", 0) >= s.get("latestCheckpoint", {}).get("epoch", 0) + 2,
        timeout=120,
    )
    assert space.status(name)["latestCheckpoint"]["id"] == behind["latestCheckpoint"]["id"]
    space.kube.kubectl("delete", "pod", victim, "-n", space.name, "--grace-period=0", "--force")
    status = space.wait(
        name,
        "the subtask running on the standby executor",
        lambda s: (
            set(subtask_nodes(s).values()) - {held} and s.get("epoch", 0) > behind["epoch"] + 2
        ),
        timeout=180,
    )
    assert "the standby copies are of the latest completed checkpoint" in status["lastError"]
    got = restored(status)
    assert got["remote"] == 0 and got["local"] >= 1, got  # from the standby copy
    space.finish(name, timeout=400)
    assert_exact(committed(space, name), count)


def test_a_force_deleted_executor_pod_is_noticed_at_once(
    space: Space, request: pytest.FixtureRequest
) -> None:
    """``kubectl delete pod --grace-period=0 --force`` of an executor pod: the pod object is
    gone at once, while Spark's own watch takes its last state (Running) for a live pod, so
    Spark alone notices the loss only at its next pod list. The driver's watch removes the
    executor as the deletion arrives: Spark's log of the loss gives the deletion as its
    reason. The StatefulSet makes the pod again on its node, its subtasks wait for it and
    restore locally (nothing from the object store). Exact output."""
    name = "deleted"
    count = 20_000
    manifest = executor_manifest(space, name, 4, count, 900, 600)
    manifest["spec"]["config"]["local_recovery.executor_wait_ms"] = "60000"
    space.apply(manifest)
    before = running_pipeline(space, name, 2)
    victim = str(before.pods[0]["metadata"]["name"])
    space.kube.kubectl("delete", "pod", victim, "-n", space.name, "--grace-period=0", "--force")
    status = epochs_after(space, name, before, 4, "the deletion")
    print("after the deletion:", json.dumps(restored(status)), json.dumps(status["placement"]))
    log = pod_log(space, before.driver, request)
    lines = lost_executor_lines(log, victim)
    print("the loss:", lines[:1])
    assert any("was deleted" in line for line in lines), log[-3000:]
    assert restored(status)["remote"] == 0 and restored(status)["remoteBytes"] == 0
    assert subtask_nodes(status) == before.held
    assert nodes_of(running_executors(space, name, 2)) == before.nodes  # made again on its node
    space.finish(name, timeout=400)
    assert_exact(committed(space, name), count)


def test_long_running_tasks_on_executor_pods_outlive_a_deleted_executor(
    space: Space, request: pytest.FixtureRequest
) -> None:
    """``epoch.tasks: long-running`` with executor pods: one Spark job's tasks take epoch
    after epoch over their own sockets between pods (each executor gets task slots beyond
    its cores). Deleting an executor pod ends the run (its tasks and connections go with
    it, or Spark removes the executor first and the placement changes); a new run places
    the subtasks again, the one that lost its executor on the pod made again on its node.
    Exact output."""
    name = "longrun"
    count = 20_000
    manifest = executor_manifest(space, name, 4, count, 900, 600)
    manifest["spec"]["config"]["epoch.tasks"] = "long-running"
    manifest["spec"]["config"]["local_recovery.executor_wait_ms"] = "60000"
    space.apply(manifest)
    before = running_pipeline(space, name, 2)
    # The first run spread the subtasks; the second names the executors holding their state.
    ends = run_ends(pod_log(space, before.driver, request))
    assert any("relaunched" in line for line in ends), ends
    victim = str(before.pods[0]["metadata"]["name"])
    space.kube.kubectl("delete", "pod", victim, "-n", space.name, "--grace-period=0", "--force")
    deadline, log = time.monotonic() + 120, ""
    after: list[str] = []
    while not after and time.monotonic() < deadline:
        time.sleep(1)
        log = pod_log(space, before.driver, request)
        after = run_ends(log)[len(ends) :]
    print("the run's end:", after[:2])
    assert after, log[-3000:]
    moved_on = space.status(name)
    status = space.wait(
        name,
        "4 epochs after the run ended",
        lambda s: s.get("epoch", 0) >= moved_on.get("epoch", 0) + 4,
        timeout=180,
    )
    print("after the deletion:", json.dumps(restored(status)), json.dumps(status["placement"]))
    assert nodes_of(running_executors(space, name, 2)) == before.nodes  # made again on its node
    space.finish(name, timeout=400)
    assert_exact(committed(space, name), count)


def run_ends(log: str) -> list[str]:
    """The driver's log lines of long-running runs that ended: failed, lost or relaunched."""
    return [
        line
        for line in log.splitlines()
        if "long-running tasks relaunched" in line
        or ("long-running task " in line and ("was lost" in line or "failed in" in line))
    ]


def lost_executor_lines(log: str, pod: str) -> list[str]:
    """Spark's log lines of executors it removed because the driver's pod watch
    (stator.jvm.LostPodWatcher) saw ``pod`` deleted, or its executor container stop."""
    return [
        line
        for line in log.splitlines()
        if "Lost executor" in line and "Stator: executor lost: " in line and pod in line
    ]


def kill_in_keyed_task(
    space: Space, pods: list[dict[str, Any]], hold: Path, kill_driver: Any
) -> str:
    """SIGKILL an executor pod's processes in the middle of one of its keyed tasks (the
    pipeline holds keyed tasks while ``hold`` exists, and says on which node), then twice
    more as its container restarts, before it registers: a crash loop, so that the third
    restart waits out a 20 s back-off (unless Spark deletes the pod first and the
    StatefulSet makes it again). Spark notices the lost executor before its replacement
    registers (15 s of missed heartbeats) and retries its task on the other executor, which
    does not hold the task's state. Returns the killed pod's name. On an external cluster
    the files are not shared: one kill, at once."""
    if EXTERNAL:
        victim = str(pods[0]["metadata"]["name"])
        kill_driver(space.name, victim)
        return victim
    hold.touch()
    try:
        deadline = time.monotonic() + 60
        while not (markers := sorted(hold.parent.glob(f"{hold.name}.*"))):
            assert time.monotonic() < deadline, "no keyed task held"
            time.sleep(0.05)
        node = markers[0].name.removeprefix(f"{hold.name}.")
        victim = next(str(p["metadata"]["name"]) for p in pods if p["spec"]["nodeName"] == node)
        kill_driver(space.name, victim)  # SIGKILL the executor's process group
    finally:
        hold.unlink()
    for restarts in (1, 2):  # the kubelet's back-off: at once, then 10 s, then 20 s
        deadline = time.monotonic() + 60
        while restart_count(space, victim) < restarts:
            assert time.monotonic() < deadline, f"{victim} did not restart"
            time.sleep(0.1)
        kill_driver(space.name, victim)
    return victim


def restart_count(space: Space, pod: str) -> int:
    got = space.kube.kubectl_json("get", "pod", pod, "-n", space.name)
    return int(next(iter(got["status"].get("containerStatuses") or []), {}).get("restartCount", 0))


# Run inside an executor container (an external cluster's): SIGSTOP every uploader process
# (not itself: its own command line names them too).
_SUSPEND_IN_POD = """
import os, signal
n = 0
for pid in filter(str.isdigit, os.listdir("/proc")):
    if int(pid) == os.getpid():
        continue
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"executor_uploader" in f.read():
                os.kill(int(pid), signal.SIGSTOP)
                n += 1
    except OSError:
        pass
print(n)
"""


def pod_log(space: Space, pod: str, request: pytest.FixtureRequest) -> str:
    """A running pod's log: the node agent's file, or ``kubectl logs`` (the kubelet's)."""
    if EXTERNAL:
        return str(space.kube.kubectl("logs", "-n", space.name, pod).stdout)
    return str(request.getfixturevalue("agent").pod_log(space.name, pod))


def suspend_uploaders(space: Space, pod: str, request: pytest.FixtureRequest) -> int:
    """Stops (SIGSTOP) the executor uploader processes in ``pod``: the node agent's process
    tree, or inside the container (``kubectl exec``, as the pod's own user). How many."""
    if EXTERNAL:
        out = space.kube.kubectl(
            "exec", "-n", space.name, pod, "--", "python", "-c", _SUSPEND_IN_POD
        )
        return int(out.stdout.strip())
    agent = request.getfixturevalue("agent")
    uploaders = uploader_processes(agent.pods[f"{space.name}/{pod}"].proc.pid)
    for p in uploaders:
        p.suspend()
    return len(uploaders)


def uploader_processes(pod_pid: int) -> list[psutil.Process]:
    """The executor uploader processes under a pod's process. Python workers come and go
    meanwhile (one exited between the listing and its command line in a CI run)."""
    found = []
    for p in psutil.Process(pod_pid).children(recursive=True):
        try:
            if "executor_uploader" in " ".join(p.cmdline()):
                found.append(p)
        except psutil.Error:
            continue
    return found


def subtask_nodes(status: dict[str, Any]) -> dict[int, str]:
    return {s["subtask"]: s["node"] for s in status["placement"]["subtasks"]}


def test_a_lost_node_reads_only_its_own_ranges_from_the_object_store(
    space: Space, nodes: NodeControl
) -> None:
    """Three executors on three nodes; one node vanishes (its processes freeze, its lease
    lapses). The job runs again within 60 s; the subtasks that node held restore from the
    object store (exactly their checkpoint files' bytes) and every other from its local
    copy; with ``pinning: preferred`` the lost executor starts on another node. Exact."""
    name = "nodeloss"
    count = 36_000
    space.apply(
        executor_manifest(space, name, 6, count, rate=900, per_epoch=900, pinning="preferred")
    )
    three_checkpoints(space, name)
    pods = running_executors(space, name, 3)
    where = nodes_of(pods)
    assert len(set(where.values())) == 3, where
    before = space.status(name)
    # A node with an executor but not the driver (losing the driver's node is a driver
    # failure, not this test's case; with three executors spread over three nodes, one of
    # them shares the driver's node).
    (driver,) = space.driver_pods(name)
    lost = next(n for n in sorted(set(where.values())) if n != driver["spec"]["nodeName"])
    held = sorted(s["subtask"] for s in before["placement"]["subtasks"] if s["node"] == lost)
    assert held, before["placement"]
    lost_at = time.monotonic()
    nodes.lose(lost)
    try:
        status = wait_running_again(
            space,
            name,
            f"running again (node {lost} lost)",
            # Restores are reported when their epoch is done: the job processes again.
            lambda s: restored(s).get("remote", 0) >= len(held),
            lost_at,
            timeout=120,
        )
        latest = restored(status)["latest"]
        remote = sorted(r["subtask"] for r in latest if r["source"] == "remote")
        assert remote == held, latest
        assert all(r["source"] == "local" for r in latest if r["subtask"] not in held)
        checkpoint_id = next(r["checkpointId"] for r in latest if r["source"] == "remote")
        share = checkpoint_share(space, name, checkpoint_id, held)
        read = sum(r["remoteBytes"] for r in latest if r["source"] == "remote")
        print(f"read {read} bytes from the object store; the lost ranges hold {share}")
        assert abs(read - share) <= 0.1 * share
        # pinning: preferred: the executor gives up its volume and starts elsewhere.
        space.wait(
            name,
            "the lost executor moved",
            lambda s: "ExecutorsMoved" in space.events(),
            timeout=120,
        )
        moved = running_executors(space, name, 3)
        assert lost not in nodes_of(moved).values(), nodes_of(moved)
    finally:
        nodes.restore(lost)
    space.finish(name, timeout=400)
    assert_exact(committed(space, name), count)


def checkpoint_share(space: Space, name: str, checkpoint_id: int, subtasks: list[int]) -> int:
    """The bytes of checkpoint ``checkpoint_id``'s files of ``subtasks`` of 'count'."""
    opts = S3Options(
        endpoint_url=space.s3.endpoint_url,
        access_key_id=space.s3.access_key,
        secret_access_key=space.s3.secret_key,
    )
    store = open_store(f"s3://{space.bucket}/{name}/checkpoints/{space.name}.{name}", opts)
    meta = load_checkpoint(store, checkpoint_dir(checkpoint_id))
    op = meta.operators["count"]
    return sum(f.size for s in op.subtasks if s.index in subtasks for f in s.files)


def test_kubectl_scale_4_6_3_with_executor_pods(space: Space) -> None:
    """Rescales move executors too: 2, then 3, then 2 executor pods. Each rescale's new
    driver runs an executor set of its own, started before the old driver stopped (it reads
    its key-groups from the savepoint, so none of the old executors' state is of use): it is
    handed the savepoint as soon as the old driver stopped with it, and the old set's claims
    are deleted once it runs. Then an upgrade at the same parallelism (the rest of the input
    at full speed) takes the running set over. Exact output."""
    name = "scaled"
    count = 240_000  # at 600/s: longer than both rescales, whose new executors start first
    space.apply(executor_manifest(space, name, 4, count, rate=600, per_epoch=900))
    space.wait(
        name,
        "two checkpoints",
        lambda s: s.get("phase") == "Running" and s.get("latestCheckpoint", {}).get("id", 0) >= 2,
        timeout=300,
    )
    sets = [space.status(name)["deployment"]["executorSet"]]
    for replicas, pods in ((6, 3), (3, 2)):
        space.kube.kubectl(
            "scale", "statefulpipeline", name, "-n", space.name, f"--replicas={replicas}"
        )
        status = space.wait(
            name,
            f"rescaled to {replicas} and processing",
            lambda s, r=replicas: (
                s.get("replicas") == r
                and not s.get("operation")
                and (s.get("placement") or {}).get("keyedTasks", 0) > 0
            ),
            timeout=300,
        )
        assert status["phase"] == "Running", status.get("phase")
        sets.append(status["deployment"]["executorSet"])
        last = status["lastOperation"]
        assert last["stepSeconds"]["prestart"] is not None and last.get("handedOverAtMs"), last
        assert len(running_executors(space, name, pods)) == pods
        assert {
            p["metadata"]["labels"]["spark-app-selector"]
            for p in running_executors(space, name, pods)
        } == {sets[-1]}
        assert sorted(s["subtask"] for s in status["placement"]["subtasks"]) == list(
            range(replicas)
        )
    assert len(set(sets)) == 3, sets  # a set of its own per rescale
    claims = space.kube.kubectl_json("get", "pvc", "-n", space.name)["items"]
    kept = [c for c in claims if not c["metadata"].get("deletionTimestamp")]
    assert sorted(c["metadata"]["name"] for c in kept) == [
        f"stator-state-spark-s-{sets[-1]}-0-{i}" for i in (0, 1)
    ]
    # The rest of the input at full speed, in larger epochs: an upgrade by savepoint at the
    # same parallelism, whose new driver takes the running executor set (and its claims) over.
    before = space.status(name)["deployment"]["id"]
    env = space.get(name)["spec"]["driver"]["env"]
    env = [e for e in env if e["name"] != "RATE"] + [{"name": "RATE", "value": "100000"}]
    config = {"epoch.max_records": "20000"}
    patch = json.dumps({"spec": {"driver": {"env": env}, "config": config}})
    space.kube.kubectl("patch", "spl", name, "-n", space.name, "--type=merge", "-p", patch)
    status = space.wait(
        name,
        "upgraded, or finished",
        lambda s: s.get("deployment", {}).get("id") != before and not s.get("operation"),
        timeout=400,
    )
    assert status["deployment"]["executorSet"] == sets[-1]
    space.finish(name, timeout=400)
    assert_exact(committed(space, name), count)
