"""``make demo``: the main job, the way users run it.

Starts the local test bed (a real kube-apiserver with controller-manager and scheduler, the
node agent that runs pods as processes on three nodes with local volumes, MinIO), installs the
operator's CRD and RBAC from the Helm chart and runs the operator with exactly that RBAC, then:

1. ``kubectl apply``s a StatefulPipeline (rate-limited generator -> keyed count -> exactly-once
   file sink on MinIO, checkpoints on MinIO) with executors as pods, each on a claim of a local
   volume of its node, and shows the pods and which node holds which key-group ranges;
2. kills an executor (SIGKILL): it restarts in its pod on its node and the job goes on with
   the state on that node's disk (no byte read from MinIO);
3. kills the driver (SIGKILL): the operator starts a new one whose executors come back on the
   same nodes and restore from their local copies;
4. ``kubectl scale``s it from 4 to 6: stop with savepoint, restore at the new parallelism on
   three executors;
5. waits until the job has read all its input and checks the committed output is exact.

It prints the status along the way and these numbers: apply -> driver pod created, the
operator's own share of the rescale (everything but the savepoint, the restore and Spark's
start-up, which the driver reports and which are subtracted), the rescale's downtime split
into the operator's steps and the new driver's start-up (``status.lastOperation``), and the
bytes each recovery read from MinIO.

``make demo NODES=real`` (``--nodes real``) runs the same on three real kubelets (containerd,
runc, CNI) with the images built from ``images/`` and the operator installed by its Helm chart
with its own image (``tests/e2e/real_nodes.py``); the kills are ``kill -9`` inside the pods.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Input for about four minutes: the rescale's new driver starts its executors (an executor set
# of its own) while the old driver still processes, which takes minutes on a 2-core machine.
COUNT, RATE = 200_000, 800
NAMESPACE = "demo"


Kill = Callable[[str, str], None]  # (namespace, pod): SIGKILL of the pod's process


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="make demo: the main job on the test bed")
    parser.add_argument(
        "--nodes",
        choices=("process", "real"),
        default="process",
        help="process: pods as local processes (the node agent); real: real kubelets with "
        "the images from images/ (needs root, containerd, runc; make e2e-real's bed)",
    )
    args = parser.parse_args(argv)
    t0 = time.monotonic()

    def say(text: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {text}", flush=True)

    return _on_real_nodes(say) if args.nodes == "real" else _on_process_nodes(say)


def _on_process_nodes(say: Callable[[str], None]) -> int:
    from tests.e2e.cluster import (
        LOCAL_STORAGE_CLASS,
        launch_operator,
        render_and_apply,
        wait_for_crd,
    )
    from tests.testbed.bed import running
    from tests.testbed.nodeagent import NodeAgent

    with running(kafka=False) as bed:
        kube = bed.kube
        assert kube is not None
        say(
            f"control plane up ({kube.kubectl('version', '-o', 'json').stdout.count('v1.')} "
            f"components report v1.x), MinIO at {bed.s3.endpoint_url}"
        )
        work = Path(tempfile.mkdtemp(prefix="stator-demo-"))
        agent = NodeAgent(
            kube.kubeconfig,
            work / "agent",
            nodes=["node-0", "node-1", "node-2"],
            extra_env={
                "PYTHONPATH": str(ROOT),
                "PYSPARK_PYTHON": sys.executable,
                "STATOR_HOME": str(work / "home"),
            },
        ).start()
        agent.provide_local_volumes(LOCAL_STORAGE_CLASS, per_node=4)
        try:
            # CRD and RBAC from the Helm chart, as the tests do: namespaced mode, a Role in
            # the one namespace the operator watches.
            render_and_apply(kube, [NAMESPACE])
            wait_for_crd(kube)
            (work / "operator").mkdir(parents=True, exist_ok=True)
            op = launch_operator(kube, work / "operator", [NAMESPACE])
            op.start()
            say(
                f"operator installed from the Helm chart (CRD + least-privilege RBAC, watching "
                f"namespace {NAMESPACE} only) and running"
            )

            def kill(ns: str, pod: str) -> None:
                os.killpg(agent.pods[f"{ns}/{pod}"].proc.pid, signal.SIGKILL)

            try:
                return _run(say, kube, bed.s3, kill)
            finally:
                op.stop()
        finally:
            agent.stop()


def _on_real_nodes(say: Callable[[str], None]) -> int:
    from tests.e2e import real_nodes

    with real_nodes.real_cluster([NAMESPACE], say) as bed:
        say(
            "three real nodes (kubelet, containerd, runc, CNI), the operator installed by "
            f"its Helm chart with its own image, watching namespace {NAMESPACE}; MinIO at "
            f"{bed.s3.endpoint_url}"
        )
        say(bed.kube.kubectl("get", "nodes", "-o", "wide").stdout.strip())

        def kill(ns: str, pod: str) -> None:
            # tini (PID 1) survives and exits with the killed process's status.
            bed.kube.kubectl("exec", "-n", ns, pod, "--", "kill", "-9", "-1", check=False)

        # Executors of 2 task slots ask for less CPU on nodes of this machine's 2 CPUs.
        return _run(say, bed.kube, bed.s3, kill, real_nodes.EXECUTOR_REQUEST_CORES)


def _run(
    say: Callable[[str], None], kube: Any, s3: Any, kill: Kill, request_cores: str = ""
) -> int:
    """The demo's steps on a cluster whose operator watches ``NAMESPACE``."""
    from stator.sinks import read_committed
    from stator.storage import S3Options
    from tests.e2e.cluster import LOCAL_STORAGE_CLASS, Space, create_credentials
    from tests.e2e.counts_output import expected_counts

    ns, name = NAMESPACE, "clicks"
    s3.client().create_bucket(Bucket=ns)
    create_credentials(kube, ns, s3)
    space = Space(ns, ns, s3, kube)
    manifest = space.manifest(name, replicas=4, env={"COUNT": COUNT, "RATE": RATE})
    manifest["spec"]["executor"] = {
        "cores": 2,
        "memory": "512m",
        "env": [{"name": "AWS_ENDPOINT_URL_S3", "value": s3.endpoint_url}],
    }
    if request_cores:
        manifest["spec"]["sparkConf"] = {"spark.kubernetes.executor.request.cores": request_cores}
    manifest["spec"]["localRecovery"] = {
        "volume": {"storageClassName": LOCAL_STORAGE_CLASS, "size": "1Gi"}
    }
    print(json.dumps(manifest["spec"], indent=1)[:1600])
    t_apply = time.monotonic()
    space.apply(manifest)
    while not space.driver_pods(name):
        time.sleep(0.02)
    apply_to_pod = time.monotonic() - t_apply
    say(f"kubectl apply -> driver pod created in {apply_to_pod:.2f}s")
    status = space.wait(
        name,
        "running",
        lambda s: (
            s.get("phase") == "Running"
            and s.get("latestCheckpoint", {}).get("id", 0) >= 2
            and bool(s.get("placement"))
        ),
        timeout=300,
    )
    say(kube.kubectl("get", "spl", "-n", ns).stdout.strip())
    say("pods:\n" + kube.kubectl("get", "pods", "-n", ns, "-o", "wide").stdout.strip())
    _show_placement(say, status)

    executor = _executor_pods(kube, ns)[0]
    before = space.status(name)
    kill(ns, executor)
    say(f"killed executor {executor} with SIGKILL")
    status = space.wait(
        name,
        "six epochs after the kill",
        lambda s: s.get("epoch", 0) >= before.get("epoch", 0) + 6,
        timeout=300,
    )
    restarts = kube.kubectl_json("get", "pod", executor, "-n", ns)["status"]
    say(
        f"executor {executor} restarted in its pod "
        f"({restarts['containerStatuses'][0]['restartCount']} restart(s)) on the same "
        f"node; restores since: {json.dumps(_restores(status))}"
    )
    _show_placement(say, status)

    first = status["deployment"]["id"]
    driver = space.driver_pods(name)[-1]["metadata"]["name"]
    kill(ns, driver)
    say(f"killed driver {driver} with SIGKILL")
    status = space.wait(
        name,
        "restarted",
        lambda s: (
            s.get("deployment", {}).get("id") not in (None, first)
            and (s.get("placement") or {}).get("keyedTasks", 0) >= 8
        ),
        timeout=300,
    )
    say(
        "operator restarted the driver from the latest checkpoint; its executors came "
        f"back on the same nodes; restores: {json.dumps(_restores(status))}"
    )
    _show_placement(say, status)

    t_scale = time.monotonic()
    kube.kubectl("scale", "statefulpipeline", name, "-n", ns, "--replicas=6")
    while True:
        s = space.status(name)
        if s.get("replicas") == 6 and not s.get("operation"):
            break
        time.sleep(0.05)
    t_done = time.monotonic()
    savepoint = s["deployment"]["restoredFrom"]
    driver_time = _driver_share(s["lastOperation"]["stepSeconds"])
    total = t_done - t_scale
    say(f"rescaled 4 -> 6 in {total:.1f}s through savepoint {savepoint}")
    steps = s.get("lastOperation", {}).get("stepSeconds", {})
    say(
        "its steps, from status.lastOperation: "
        + ", ".join(f"{k} {v:.1f}s" for k, v in steps.items() if v is not None)
    )
    say(
        f"operator's own share of the rescale: {total - driver_time:.1f}s (the "
        f"drivers: pre-start, savepoint, Spark start-up and restore: {driver_time:.1f}s)"
    )
    status = space.wait(
        name,
        "processing again",
        lambda s: (s.get("lastOperation") or {}).get("downtimeSeconds") is not None,
        timeout=300,
    )
    rescale = status["lastOperation"]
    say(
        f"downtime of the rescale, from the old driver's last epoch of records (the "
        f"new driver was pre-started before it) to the end of the new driver's first "
        f"epoch: "
        f"{rescale['downtimeSeconds']:.1f}s; the new driver's start-up after that: "
        + ", ".join(f"{k} {v:.1f}s" for k, v in rescale["driverStartupSeconds"].items())
    )
    status = space.wait(
        name,
        "placed, with a checkpoint of the new driver",
        lambda s: (
            bool((s.get("placement") or {}).get("subtasks"))
            and all("checkpointId" in x for x in s["placement"]["subtasks"])
        ),
        timeout=120,
    )
    say("pods:\n" + kube.kubectl("get", "pods", "-n", ns, "-o", "wide").stdout.strip())
    _show_placement(say, status)
    space.wait(name, "finished", lambda s: s.get("phase") == "Finished", timeout=600)
    say(kube.kubectl("get", "spl", "-n", ns).stdout.strip())
    final = space.status(name)
    say(
        "status: "
        + json.dumps(
            {
                k: final.get(k)
                for k in ("phase", "replicas", "restarts", "latestCheckpoint", "savepoints")
            }
        )
    )
    opts = S3Options(
        endpoint_url=s3.endpoint_url,
        access_key_id=s3.access_key,
        secret_access_key=s3.secret_key,
    )
    records = read_committed(f"s3://{ns}/{name}/out", opts)
    last: dict[str, int] = {}
    for key, value in records:
        last[key] = int(value)
    exact = last == expected_counts(COUNT)
    say(
        f"committed output: {len(records)} running counts; final counts "
        f"{'exact' if exact else 'WRONG'} over {COUNT:,} events after an executor kill, "
        f"a driver kill and a rescale"
    )
    return 0 if exact else 1


def _executor_pods(kube: Any, ns: str) -> list[str]:
    pods = kube.kubectl_json("get", "pods", "-n", ns, "-l", "spark-role=executor")["items"]
    return sorted(p["metadata"]["name"] for p in pods)


def _restores(status: dict[str, Any]) -> dict[str, Any]:
    r = status.get("restores") or {}
    return {k: r.get(k, 0) for k in ("local", "remote", "localBytes", "remoteBytes")}


def _show_placement(say: Any, status: dict[str, Any]) -> None:
    placement = status.get("placement") or {}
    rows = [
        f"  subtask {s['subtask']}: key-groups {s['keyGroups']} on {s['node']} "
        + (
            f"(executor {s['executor']}), local copy of checkpoint {s['checkpointId']}"
            if s.get("checkpointId") is not None  # absent until this driver's first checkpoint
            else f"(executor {s['executor']}), no checkpoint of this driver yet"
        )
        for s in placement.get("subtasks", [])
    ]
    say(
        f"placement ({placement.get('keyedTasksLocal')} of {placement.get('keyedTasks')} keyed "
        f"tasks ran where their state is):\n" + "\n".join(rows)
    )


def _driver_share(steps: dict[str, float | None]) -> float:
    """Time the drivers spent, from the operator's step timings: the pre-started driver's
    start (prestart), taking the savepoint (await-savepoint) and the new driver's start-up
    until ready (await-ready). The rest of a rescale is the operator's."""
    return sum(steps.get(k) or 0.0 for k in ("prestart", "await-savepoint", "await-ready"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
