"""Checks that the built images work, run as containers (podman on runc) the way the chart
and the operator run them: non-root, read-only root filesystem, no capabilities, no new
privileges, writable only where a volume is mounted.

- The runtime image starts a driver: ``stator run`` of the e2e counting pipeline on
  ``local[2]`` to completion, its committed output equal to the exact counts.
- The runtime image starts an executor: ``images/runtime/entrypoint.sh executor`` (what
  Spark's Kubernetes backend runs in an executor pod), registered with a driver in another
  container (a Spark standalone master from the same image schedules nothing: the
  executor joins by its driver URL, as in a pod) and running that driver's Python tasks.
- The operator image starts the operator: against the test bed's API server it answers its
  liveness endpoint and takes its leader Lease.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .images import ImageError, Store
from .procs import free_port

_NOFILE = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
RUNTIME_UID = 185  # images/runtime/Dockerfile's SPARK_UID
# As resources.py's and the chart's securityContext, in podman's words.
HARDENED = (
    "--read-only",
    "--tmpfs",
    "/tmp:rw,size=512m",
    "--cap-drop",
    "ALL",
    "--security-opt",
    "no-new-privileges",
    "--network",
    "host",
    # podman raises the open-files and process limits to its own defaults (2^20, 2^22), which
    # fails where root lacks CAP_SYS_RESOURCE (this machine): limits a container may set here.
    "--ulimit",
    f"nofile={_NOFILE}:{_NOFILE}",
    "--ulimit",
    "nproc=32768:32768",
)


def _podman(store: Store, *args: str) -> list[str]:
    return ["podman", *store.flags(), *args]


@contextlib.contextmanager
def _container(store: Store, name: str, *args: str) -> Iterator[str]:
    """A detached container, removed (with its output shown on failure) when done."""
    subprocess.run(_podman(store, "rm", "-f", name), capture_output=True, check=False)
    store.run("podman", "run", "-d", "--name", name, *HARDENED, *args, what=f"start {name}")
    try:
        yield name
    finally:
        subprocess.run(
            _podman(store, "rm", "-f", "-t", "2", name), capture_output=True, check=False
        )


def _logs(store: Store, name: str) -> str:
    proc = subprocess.run(_podman(store, "logs", name), capture_output=True, text=True, check=False)
    return proc.stdout + proc.stderr


def _wait_log(store: Store, name: str, needle: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = _logs(store, name)
        if needle in out:
            return out
        time.sleep(0.5)
    raise ImageError(
        f"{name}: no {needle!r} in {timeout:.0f}s; its log:\n{_logs(store, name)[-4000:]}"
    )


def check_driver(store: Store, image: str, count: int = 3000) -> None:
    """A whole job in the runtime image: output compared with the exact counts."""
    from stator.sinks import read_committed
    from tests.e2e.counts_output import expected_counts

    with tempfile.TemporaryDirectory(prefix="stator-image-check-") as tmp:
        work = Path(tmp)
        os.chown(work, RUNTIME_UID, 0)
        argv = ["stator", "run", "tests.pipelines.e2e_counts:build"]
        for setting in (
            "spark.master=local[2]",
            "checkpoint.storage=file:///work/ck",
            "state.local_dir=/work/state",
            "epoch.max_records=1000",
        ):
            argv += ["--set", setting]
        started = time.monotonic()
        store.run(
            "podman",
            "run",
            "--rm",
            *HARDENED,
            "-v",
            f"{work}:/work",
            "-e",
            "COUNTS_OUT=file:///work/out",
            "-e",
            f"COUNT={count}",
            "-e",
            "RATE=100000",
            image,
            *argv,
            what="runtime image: a driver runs the e2e job",
            timeout=600,
        )
        got: dict[str, int] = {}
        for key, value in read_committed(f"file://{work}/out"):
            got[key] = max(got.get(key, 0), int(value))
        if got != expected_counts(count):
            raise ImageError(
                f"runtime image: the driver's output differs from the exact counts: {got}"
            )
        print(f"images: driver check: exact output in {time.monotonic() - started:.1f}s")


_DRIVER_APP = """
import sys
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master(sys.argv[1]).appName("image-check")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.port", sys.argv[2])
         .config("spark.cores.max", "1").getOrCreate())
print("APP", spark.sparkContext.applicationId, flush=True)
total = spark.sparkContext.parallelize(range(1000), 2).map(lambda x: x * x).sum()
print("RESULT", total, flush=True)
spark.stop()
"""


def check_executor(store: Store, image: str) -> None:
    """The entrypoint's executor mode joins a driver by URL and runs its Python tasks."""
    master_port, driver_port = free_port(), free_port()
    started = time.monotonic()
    master = [
        "bash",
        "-c",
        f'exec "$JAVA_HOME/bin/java" -cp "$SPARK_HOME/jars/*" '
        f"org.apache.spark.deploy.master.Master --host 127.0.0.1 --port {master_port} "
        "--webui-port 0",
    ]
    with (
        _container(store, "stator-check-master", image, *master) as m,
    ):
        _wait_log(store, m, "I have been elected leader", 120)
        driver_argv = [
            "python",
            "-c",
            _DRIVER_APP,
            f"spark://127.0.0.1:{master_port}",
            str(driver_port),
        ]
        with _container(store, "stator-check-driver", image, *driver_argv) as d:
            out = _wait_log(store, d, "APP ", 120)
            app = next(line.split()[1] for line in out.splitlines() if line.startswith("APP "))
            env = {
                "SPARK_DRIVER_URL": f"spark://CoarseGrainedScheduler@127.0.0.1:{driver_port}",
                "SPARK_EXECUTOR_ID": "1",
                "SPARK_APPLICATION_ID": app,
                "SPARK_EXECUTOR_POD_IP": "127.0.0.1",
                "SPARK_EXECUTOR_POD_NAME": "image-check-exec-1",
                "SPARK_EXECUTOR_MEMORY": "512m",
            }
            env_args = [a for k, v in env.items() for a in ("-e", f"{k}={v}")]
            with _container(store, "stator-check-executor", *env_args, image, "executor") as e:
                try:
                    result = _wait_log(store, d, "RESULT ", 180)
                except ImageError as exc:
                    raise ImageError(f"{exc}\nexecutor log:\n{_logs(store, e)[-4000:]}") from None
    want = sum(x * x for x in range(1000))
    if f"RESULT {want}" not in result:
        raise ImageError(
            f"runtime image: the executor's tasks returned the wrong sum:\n{result[-2000:]}"
        )
    took = time.monotonic() - started
    print(f"images: executor check: tasks ran on the entrypoint's executor in {took:.1f}s")


def check_operator(store: Store, image: str) -> None:
    """The operator image against the test bed's API server: healthy and leading."""
    from .kube import KubeCluster

    crd = Path(__file__).resolve().parents[2] / "crds" / "statefulpipelines.stator.dev.yaml"
    health = free_port()
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="stator-image-check-") as tmp,
        KubeCluster(Path(tmp) / "kube") as kube,
    ):
        kube.kubectl("apply", "-f", str(crd))
        kube.kubectl("create", "namespace", "stator-system")
        kubeconfig = Path(tmp) / "kubeconfig"
        kubeconfig.write_text(kube.kubeconfig.read_text())
        kubeconfig.chmod(0o644)  # the operator's uid reads it; certificates are embedded
        env = {
            "KUBECONFIG": "/etc/stator/kubeconfig",
            "STATOR_OPERATOR_HEALTH": f"http://127.0.0.1:{health}/healthz",
            "STATOR_OPERATOR_NAMESPACE": "stator-system",
        }
        env_args = [a for k, v in env.items() for a in ("-e", f"{k}={v}")]
        mounts = ["-v", f"{kubeconfig}:/etc/stator/kubeconfig:ro"]
        with _container(store, "stator-check-operator", *env_args, *mounts, image) as op:
            deadline = time.monotonic() + 120
            leases: Any = {}
            while time.monotonic() < deadline:
                leases = kube.kubectl_json("get", "leases", "-n", "stator-system")
                if leases["items"] and _healthy(health):
                    break
                time.sleep(0.5)
            else:
                raise ImageError(
                    f"operator image: not healthy and leading in 120s; leases "
                    f"{json.dumps(leases)[:500]}\n{_logs(store, op)[-4000:]}"
                )
    print(f"images: operator check: healthy and leading in {time.monotonic() - started:.1f}s")


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False
