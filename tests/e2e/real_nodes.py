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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

from tests.e2e.cluster import CHART, LOCAL_STORAGE_CLASS, OPERATOR_NS, ROOT, WATCHED, restrict
from tests.testbed import images
from tests.testbed.build import ensure
from tests.testbed.cache import cache_root
from tests.testbed.kube import KubeCluster
from tests.testbed.minio import MinioServer
from tests.testbed.realnodes import HOST_IP, RealNodes


def _step(what: str, started: float) -> None:
    print(f"real nodes: {what} ({time.monotonic() - started:.0f}s)", flush=True)


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    # A SIGTERM (CI's timeout, a person's kill) unwinds the bed like Ctrl-C: nothing is left
    # running, mounted or frozen.
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    signal.signal(signal.SIGTERM, _interrupt)
    started = time.monotonic()
    archives = images.build_all(
        specs=(images.RUNTIME, images.RUNTIME_TEST, images.OPERATOR),
        export=(images.RUNTIME_TEST, images.OPERATOR),
    )
    _step("images built", started)
    RealNodes.prepare_host()
    with tempfile.TemporaryDirectory(prefix="stator-real-nodes-") as tmp:
        root = Path(tmp)
        with (
            MinioServer(root / "minio", host=HOST_IP) as minio,
            KubeCluster(root / "kube", host=HOST_IP) as kube,
            RealNodes(kube, root / "nodes") as nodes,
        ):
            _step("control plane and nodes ready", started)
            wanted = (images.RUNTIME_TEST.tag, images.OPERATOR.tag)
            with ThreadPoolExecutor(len(nodes.nodes)) as pool:
                done = pool.map(
                    lambda node: [nodes.import_image(archives[t], [node]) for t in wanted],
                    nodes.nodes.values(),
                )
                list(done)
            _step("images imported into every node", started)
            nodes.provide_local_volumes(LOCAL_STORAGE_CLASS, per_node=6)
            for ns in WATCHED:
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
                f"watchNamespaces={{{','.join(WATCHED)}}}",
                "--wait",
                "--timeout",
                "180s",
                timeout=200,
            )
            _step("operator installed by its chart", started)
            handles = root / "nodes.json"
            handles.write_text(json.dumps({name: asdict(h) for name, h in nodes.handles().items()}))
            assert minio.endpoint is not None
            tools = [ensure("kubernetes").path("bin"), ensure("helm").path("bin")]
            env = {
                **os.environ,
                "PATH": os.pathsep.join([*map(str, tools), os.environ.get("PATH", "")]),
                "STATOR_E2E_KUBECONFIG": str(kube.kubeconfig),
                "STATOR_E2E_S3_ENDPOINT": minio.endpoint.endpoint_url,
                "STATOR_E2E_S3_POD_ENDPOINT": minio.endpoint.endpoint_url,
                "STATOR_E2E_S3_ACCESS_KEY": minio.endpoint.access_key,
                "STATOR_E2E_S3_SECRET_KEY": minio.endpoint.secret_key,
                "STATOR_E2E_LOCAL_STORAGE_CLASS": LOCAL_STORAGE_CLASS,
                "STATOR_E2E_NODES": f"real:{handles}",
                # Each node has this machine's 2 CPUs: executors of 2 cores ask for less.
                "STATOR_E2E_EXECUTOR_REQUEST_CORES": "250m",
            }
            chosen = [] if any(a.startswith("tests/") for a in argv) else ["tests/e2e"]
            try:
                code = subprocess.call(
                    [sys.executable, "-m", "pytest", *chosen, *argv], cwd=ROOT, env=env
                )
                _step(f"suite finished (exit {code})", started)
            finally:
                kept = _keep_logs(root)
                print(f"real nodes: logs of pods, kubelets, containerds, control plane: {kept}")
            return code


def _keep_logs(root: Path) -> Path:
    """The bed's logs outlive it (its directory goes with it): every pod's container logs
    by node, each kubelet's and containerd's, CoreDNS's and the control plane's."""
    dest = cache_root() / "logs" / f"e2e-real-{time.strftime('%Y%m%dT%H%M%S')}"
    nodes = root / "nodes"
    found = [*root.glob("kube/*.log"), *root.glob("minio/*.log"), *nodes.glob("coredns/*.log")]
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
