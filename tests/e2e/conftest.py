"""End-to-end fixtures: the real control plane, the node agent (pods as processes), MinIO,
and the operator running with exactly the RBAC its Helm chart grants.

The suite needs only a kubeconfig and an S3 endpoint. With ``STATOR_E2E_KUBECONFIG`` set it
uses that cluster instead of the test bed: the operator is the one installed there by Helm,
pods are run by real kubelets, and S3 is ``STATOR_E2E_S3_ENDPOINT`` (as the tests reach it)
and ``STATOR_E2E_S3_POD_ENDPOINT`` (as pods reach it), with ``STATOR_E2E_S3_ACCESS_KEY`` and
``STATOR_E2E_S3_SECRET_KEY``. ``make kind-e2e`` (tests/e2e/kind/run.sh) sets these up, and
``make e2e-real`` (tests/e2e/real_nodes.py: the test bed's real kubelets) too."""

from __future__ import annotations

import itertools
import os
import signal
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from tests.e2e.cluster import (
    EXTERNAL,
    LOCAL_STORAGE_CLASS,
    ROOT,
    WATCHED,
    AgentNodes,
    ExternalCluster,
    InClusterOperator,
    Kubectl,
    NodeControl,
    OperatorControl,
    Space,
    create_credentials,
    launch_operator,
    node_control,
    render_and_apply,
    restrict,
    wait_for_crd,
)
from tests.testbed.kube import KubeCluster
from tests.testbed.minio import S3Endpoint
from tests.testbed.nodeagent import NodeAgent

_taken = itertools.count()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Each phase's report on its test (``item.stator_failed``), for fixtures that keep
    evidence of a failure before they tear it down."""
    report = yield
    if report.failed:
        item.stator_failed = True  # type: ignore[attr-defined]
    return report


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Kubectl:
    if EXTERNAL:
        return ExternalCluster(Path(EXTERNAL))
    local: KubeCluster = request.getfixturevalue("kube")
    return local


@pytest.fixture(scope="session")
def e2e_s3(request: pytest.FixtureRequest) -> tuple[S3Endpoint, str]:
    """The S3 endpoint as the tests reach it, and its URL as pods reach it."""
    if EXTERNAL:
        endpoint = S3Endpoint(
            os.environ["STATOR_E2E_S3_ENDPOINT"],
            os.environ["STATOR_E2E_S3_ACCESS_KEY"],
            os.environ["STATOR_E2E_S3_SECRET_KEY"],
        )
        return endpoint, os.environ.get("STATOR_E2E_S3_POD_ENDPOINT", endpoint.endpoint_url)
    local: S3Endpoint = request.getfixturevalue("s3")
    return local, local.endpoint_url


@pytest.fixture(scope="session")
def agent(kube: KubeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeAgent]:
    node_agent = NodeAgent(
        kube.kubeconfig,
        tmp_path_factory.mktemp("agent"),
        nodes=["node-0", "node-1", "node-2"],
        extra_env={
            "PYTHONPATH": str(ROOT),
            "PYSPARK_PYTHON": sys.executable,
            "STATOR_HOME": str(tmp_path_factory.mktemp("home")),
        },
    )
    node_agent.start()
    # Local PersistentVolumes on every node, for executors' state (localRecovery.volume).
    node_agent.provide_local_volumes(LOCAL_STORAGE_CLASS, per_node=6)
    yield node_agent
    node_agent.stop()


@pytest.fixture(scope="session")
def installed(request: pytest.FixtureRequest, cluster: Kubectl) -> None:
    """CRD and operator RBAC from the Helm chart, applied to the API server (on an external
    cluster, ``helm install`` did this)."""
    if not EXTERNAL:
        render_and_apply(request.getfixturevalue("kube"), WATCHED)
    wait_for_crd(cluster)


@pytest.fixture(scope="session")
def operator(
    request: pytest.FixtureRequest,
    cluster: Kubectl,
    installed: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorControl]:
    if EXTERNAL:
        in_cluster = InClusterOperator(cluster)
        in_cluster.start()
        yield in_cluster
        return
    kube: KubeCluster = request.getfixturevalue("kube")
    request.getfixturevalue("agent")  # pods need a node agent to run
    op = launch_operator(kube, tmp_path_factory.mktemp("operator"))
    op.start()
    yield op
    op.stop()


@pytest.fixture(scope="session")
def nodes(request: pytest.FixtureRequest) -> NodeControl:
    """Lose a node and bring it back: the node agent's, a real node's (frozen), or a kind
    node's container."""
    if EXTERNAL:
        return node_control()
    agent: NodeAgent = request.getfixturevalue("agent")
    return cast(NodeControl, AgentNodes(agent))


@pytest.fixture(scope="session")
def kill_driver(request: pytest.FixtureRequest, cluster: Kubectl) -> Any:
    """SIGKILL a driver pod's process: the pod fails as it would when the JVM or Python dies."""
    if EXTERNAL:

        def kill_in_pod(namespace: str, pod: str) -> None:
            # tini is PID 1 and survives; it exits with the killed driver's status.
            cluster.kubectl("exec", "-n", namespace, pod, "--", "kill", "-9", "-1", check=False)

        return kill_in_pod
    agent: NodeAgent = request.getfixturevalue("agent")

    def kill_process(namespace: str, pod: str) -> None:
        os.killpg(agent.pods[f"{namespace}/{pod}"].proc.pid, signal.SIGKILL)

    return kill_process


@pytest.fixture
def space(
    request: pytest.FixtureRequest,
    cluster: Kubectl,
    e2e_s3: tuple[S3Endpoint, str],
    operator: OperatorControl,
) -> Iterator[Space]:
    """A watched namespace with its bucket and credentials. With ``STATOR_E2E_FAILED_LOGS``
    set, a failed test's pods' logs are saved there before its pipelines are deleted (their
    pods, and with them their logs, go with the pipelines)."""
    s3, pod_s3 = e2e_s3
    taken = next(_taken)
    assert taken < len(WATCHED), "more tests than watched namespaces: extend WATCHED"
    name = WATCHED[taken]
    bucket = f"{name}-{uuid.uuid4().hex[:6]}"
    s3.client().create_bucket(Bucket=bucket)
    if EXTERNAL:  # run.sh created the namespaces; the bed's fixture did too
        restrict(cluster, name)
    create_credentials(cluster, name, s3)
    space = Space(name, bucket, s3, cluster, pod_s3)
    yield space
    failed_logs = os.environ.get("STATOR_E2E_FAILED_LOGS")
    if failed_logs and getattr(request.node, "stator_failed", False):
        print(f"pod logs of {name}: {space.save_pod_logs(Path(failed_logs) / name)}")
    cluster.kubectl("delete", "statefulpipelines", "--all", "-n", name, "--wait=false", check=False)
