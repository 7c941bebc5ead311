"""``make demo``: the main job, the way users run it.

Starts the local test bed (a real kube-apiserver with controller-manager and scheduler, the
node agent that runs pods as processes, MinIO), installs the operator's CRD and RBAC from the
Helm chart and runs the operator with exactly that RBAC, then:

1. ``kubectl apply``s a StatefulPipeline (rate-limited generator -> keyed count -> exactly-once
   file sink on MinIO, checkpoints on MinIO);
2. kills the driver process (SIGKILL): the operator restarts it from the latest checkpoint;
3. ``kubectl scale``s it from 2 to 4: stop with savepoint, restore at the new parallelism;
4. waits until the job has read all its input and checks the committed output is exact.

It prints the status along the way and two numbers: apply -> driver pod created, and the
operator's own share of the rescale (everything but the savepoint, the restore and Spark's
start-up, which the driver reports and which are subtracted).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COUNT, RATE = 40_000, 800


def main() -> int:
    from stator.sinks import read_committed
    from stator.storage import S3Options
    from tests.e2e.conftest import (
        Operator,
        Space,
        _render_and_apply,
        _token_kubeconfig,
        wait_for_crd,
    )
    from tests.e2e.test_operator import expected_counts
    from tests.testbed.bed import running
    from tests.testbed.nodeagent import NodeAgent
    from tests.testbed.procs import LOOPBACK, ManagedProcess, free_port

    t0 = time.monotonic()

    def say(text: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {text}", flush=True)

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
            extra_env={
                "PYTHONPATH": str(ROOT),
                "PYSPARK_PYTHON": sys.executable,
                "STATOR_HOME": str(work / "home"),
            },
        ).start()
        try:
            _render_and_apply(kube)  # CRD and RBAC from the Helm chart, as the tests do
            wait_for_crd(kube)
            health = f"http://{LOOPBACK}:{free_port()}/healthz"
            op = Operator(
                ManagedProcess(
                    "operator",
                    [sys.executable, "-m", "stator_operator"],
                    work / "operator",
                    env={
                        "KUBECONFIG": str(_token_kubeconfig(kube, work / "op-kubeconfig")),
                        "STATOR_OPERATOR_HEALTH": health,
                        "PYTHONPATH": str(ROOT),
                    },
                ),
                health,
            )
            (work / "operator").mkdir(parents=True, exist_ok=True)
            op.start()
            say("operator installed from the Helm chart (CRD + least-privilege RBAC) and running")

            ns, name = "demo", "clicks"
            bed.s3.client().create_bucket(Bucket=ns)
            kube.kubectl("create", "namespace", ns)
            kube.kubectl(
                "create",
                "secret",
                "generic",
                "s3-credentials",
                "-n",
                ns,
                f"--from-literal=AWS_ACCESS_KEY_ID={bed.s3.access_key}",
                f"--from-literal=AWS_SECRET_ACCESS_KEY={bed.s3.secret_key}",
            )
            space = Space(ns, ns, bed.s3, kube)
            manifest = space.manifest(name, env={"COUNT": COUNT, "RATE": RATE})
            print(json.dumps(manifest["spec"], indent=1)[:1200])
            t_apply = time.monotonic()
            space.apply(manifest)
            while not space.driver_pods(name):
                time.sleep(0.02)
            apply_to_pod = time.monotonic() - t_apply
            say(f"kubectl apply -> driver pod created in {apply_to_pod:.2f}s")
            space.wait(
                name,
                "running",
                lambda s: (
                    s.get("phase") == "Running" and s.get("latestCheckpoint", {}).get("id", 0) >= 2
                ),
            )
            say(kube.kubectl("get", "spl", "-n", ns).stdout.strip())

            pod = space.driver_pods(name)[-1]["metadata"]["name"]
            os.killpg(agent.pods[f"{ns}/{pod}"].proc.pid, signal.SIGKILL)
            say(f"killed driver {pod} with SIGKILL")
            space.wait(
                name,
                "restarted",
                lambda s: (
                    s.get("restarts") == 1
                    and s.get("phase") == "Running"
                    and not s.get("operation")
                ),
            )
            say("operator restarted the driver from the latest checkpoint")

            t_scale = time.monotonic()
            kube.kubectl("scale", "statefulpipeline", name, "-n", ns, "--replicas=4")
            marks: dict[str, float] = {}
            while True:
                s = space.status(name)
                op_step = (s.get("operation") or {}).get("stepName")
                if op_step and op_step not in marks:
                    marks[op_step] = time.monotonic()
                if s.get("replicas") == 4 and not s.get("operation"):
                    break
                time.sleep(0.05)
            t_done = time.monotonic()
            savepoint = s["deployment"]["restoredFrom"]
            driver_time = _driver_share(marks, t_done)
            total = t_done - t_scale
            say(f"rescaled 2 -> 4 in {total:.1f}s through savepoint {savepoint}")
            say(
                f"operator's own share of the rescale: {total - driver_time:.1f}s "
                f"(savepoint, restore and Spark start-up: {driver_time:.1f}s)"
            )
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
                endpoint_url=bed.s3.endpoint_url,
                access_key_id=bed.s3.access_key,
                secret_access_key=bed.s3.secret_key,
            )
            records = read_committed(f"s3://{ns}/{name}/out", opts)
            last: dict[str, int] = {}
            for key, value in records:
                last[key] = int(value)
            exact = last == expected_counts(COUNT)
            say(
                f"committed output: {len(records)} running counts; final counts "
                f"{'exact' if exact else 'WRONG'} over {COUNT:,} events after a crash and a "
                f"rescale"
            )
            op.stop()
            return 0 if exact else 1
        finally:
            agent.stop()


def _driver_share(marks: dict[str, float], done: float) -> float:
    """Time the drivers spent: taking the savepoint (await-savepoint -> remove-driver) and the
    new driver's Spark start-up and restore (await-ready -> running)."""
    savepoint_s = marks.get("remove-driver", 0.0) - marks.get("await-savepoint", 0.0)
    startup_s = done - marks["await-ready"] if "await-ready" in marks else 0.0
    return max(0.0, savepoint_s) + max(0.0, startup_s)


if __name__ == "__main__":
    sys.exit(main())
