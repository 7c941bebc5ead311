"""``python -m tests.e2e.real_nodes [pytest args]`` (``make e2e-real``): the end-to-end suite
on real kubelets, unchanged, with the images built from ``images/``.

It builds the images (``tests/testbed/images.py``, layers cached), starts the test bed's
control plane and MinIO on the address pods reach the host at, three real nodes
(``tests/testbed/realnodes.py``: kubelet + containerd + runc + CNI each) with the images
imported, local volumes on each node, the watched namespaces under the restricted Pod
Security profile, and the operator installed by its Helm chart with its own image. Then it
runs pytest on ``tests/e2e`` as against any external cluster (``STATOR_E2E_KUBECONFIG`` and
the S3 variables, see tests/e2e/conftest.py), with ``STATOR_E2E_NODES`` naming the file
through which the suite loses and restores nodes (``RealNodeControl``)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from tests.e2e.cluster import (
    CHART,
    LEASE_SECONDS,
    LOCAL_STORAGE_CLASS,
    OPERATOR_NS,
    ROOT,
    WATCHED,
    restrict,
)
from tests.testbed import images
from tests.testbed.build import ensure
from tests.testbed.cache import cache_root
from tests.testbed.kube import KubeCluster
from tests.testbed.minio import MinioServer, S3Endpoint
from tests.testbed.realnodes import HOST_IP, Node, RealNodes


@dataclass
class RealCluster:
    """The bed of real nodes, its operator installed by the chart."""

    kube: KubeCluster
    s3: S3Endpoint
    nodes: RealNodes
    root: Path  # the bed's directory (gone after it)


@contextlib.contextmanager
def real_cluster(watched: list[str], say: Callable[[str], None]) -> Iterator[RealCluster]:
    """Images built, control plane and MinIO on the host address, three real nodes with the
    images imported and local volumes, ``watched`` namespaces under the restricted Pod
    Security profile, the operator installed by its Helm chart with its own image. The
    bed's logs are kept (``_keep_logs``) when it goes, also after a failure. A SIGTERM (CI's
    timeout, a person's kill) unwinds it like Ctrl-C: nothing is left running, mounted or
    frozen (after a SIGKILL the next bed reclaims it: ``realnodes.reclaim``)."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield from _real_cluster(watched, say)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _real_cluster(watched: list[str], say: Callable[[str], None]) -> Iterator[RealCluster]:
    archives = images.build_all(
        specs=(images.RUNTIME, images.RUNTIME_TEST, images.OPERATOR),
        export=(images.RUNTIME_TEST, images.OPERATOR),
    )
    say("images built")
    RealNodes.prepare_host()
    with tempfile.TemporaryDirectory(prefix="stator-real-nodes-") as tmp:
        root = Path(tmp)
        with (
            MinioServer(root / "minio", host=HOST_IP) as minio,
            KubeCluster(root / "kube", host=HOST_IP) as kube,
            RealNodes(kube, root / "nodes") as nodes,
        ):
            try:
                say("control plane and nodes ready")

                def import_all(node: Node) -> None:
                    for tag in (images.RUNTIME_TEST.tag, images.OPERATOR.tag):
                        nodes.import_image(archives[tag], [node])

                with ThreadPoolExecutor(len(nodes.nodes)) as pool:
                    list(pool.map(import_all, nodes.nodes.values()))
                say("images imported into every node")
                nodes.provide_local_volumes(LOCAL_STORAGE_CLASS, per_node=6)
                for ns in watched:
                    kube.kubectl("create", "namespace", ns)
                    restrict(kube, ns)
                repository, tag = images.OPERATOR.tag.split(":")
                kube.helm(
                    "install",
                    "stator",
                    str(CHART),
                    "--namespace",
                    OPERATOR_NS,
                    "--create-namespace",
                    "--set",
                    f"image.repository={repository}",
                    "--set",
                    f"image.tag={tag}",
                    "--set",
                    f"watchNamespaces={{{','.join(watched)}}}",
                    # The leader Lease the suite expects (the process bed's), not the
                    # chart's 15 s.
                    "--set",
                    f"leaderElection.leaseDurationSeconds={LEASE_SECONDS}",
                    "--wait",
                    "--timeout",
                    "180s",
                    timeout=200,
                )
                say("operator installed by its chart")
                assert minio.endpoint is not None
                yield RealCluster(kube, minio.endpoint, nodes, root)
            finally:
                say(f"logs of pods, kubelets, containerds, control plane: {_keep_logs(root)}")


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    started = time.monotonic()

    def say(what: str) -> None:
        print(f"real nodes: {what} ({time.monotonic() - started:.0f}s)", flush=True)

    with real_cluster(WATCHED, say) as bed:
        handles = bed.root / "nodes.json"
        handles.write_text(json.dumps({name: asdict(h) for name, h in bed.nodes.handles().items()}))
        tools = [ensure("kubernetes").path("bin"), ensure("helm").path("bin")]
        env = {
            **os.environ,
            "PATH": os.pathsep.join([*map(str, tools), os.environ.get("PATH", "")]),
            "STATOR_E2E_KUBECONFIG": str(bed.kube.kubeconfig),
            "STATOR_E2E_S3_ENDPOINT": bed.s3.endpoint_url,
            "STATOR_E2E_S3_POD_ENDPOINT": bed.s3.endpoint_url,
            "STATOR_E2E_S3_ACCESS_KEY": bed.s3.access_key,
            "STATOR_E2E_S3_SECRET_KEY": bed.s3.secret_key,
            "STATOR_E2E_LOCAL_STORAGE_CLASS": LOCAL_STORAGE_CLASS,
            "STATOR_E2E_NODES": f"real:{handles}",
            # A failed test's pod logs, kept with the bed's (``_keep_logs``).
            "STATOR_E2E_FAILED_LOGS": str(bed.root / "failed-tests"),
            "STATOR_E2E_EXECUTOR_REQUEST_CORES": EXECUTOR_REQUEST_CORES,
            # The suite's own Kafka broker listens where pods reach the host.
            "STATOR_TESTBED_HOST": HOST_IP,
        }
        chosen = [] if any(a.startswith("tests/") for a in argv) else ["tests/e2e"]
        code = subprocess.call([sys.executable, "-m", "pytest", *chosen, *argv], cwd=ROOT, env=env)
        say(f"suite finished (exit {code})")
        return code


# Each node has this machine's 2 CPUs: executors of 2 cores ask for less.
EXECUTOR_REQUEST_CORES = "250m"


def _keep_logs(root: Path) -> Path:
    """The bed's logs outlive it (its directory goes with it): every pod's container logs
    by node, each kubelet's and containerd's, CoreDNS's and the control plane's, and the pods'
    logs of every failed test."""
    dest = cache_root() / "logs" / f"e2e-real-{time.strftime('%Y%m%dT%H%M%S')}"
    nodes = root / "nodes"
    found = [*root.glob("kube/*.log"), *root.glob("minio/*.log"), *nodes.glob("coredns/*.log")]
    found += [p for p in root.glob("failed-tests/**/*") if p.is_file()]
    for node in nodes.glob("node-*"):
        found += [*node.glob("*.log"), *node.glob("pod-logs/**/*.log")]
    for log in found:
        target = dest / log.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            shutil.copyfile(log, target)
    return dest


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
