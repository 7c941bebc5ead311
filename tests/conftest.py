"""Session-wide fixtures: each test bed component starts once, on demand, and always stops.

A component that cannot be built or started fails the tests that need it, loudly, with the
build or process log; nothing is skipped silently.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers import SparkSessions
from tests.testbed.build import BuildError
from tests.testbed.kafka import KafkaBroker
from tests.testbed.kube import KubeCluster
from tests.testbed.minio import MinioServer, S3Endpoint
from tests.testbed.procs import LOOPBACK, ProcessFailed


def _start_or_fail(what: str, starter: object) -> None:
    try:
        starter.start()  # type: ignore[attr-defined]
    except (BuildError, ProcessFailed, TimeoutError) as exc:
        pytest.fail(f"test bed: {what} did not start:\n{exc}", pytrace=False)


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeCluster]:
    cluster = KubeCluster(tmp_path_factory.mktemp("kube"))
    _start_or_fail("the Kubernetes control plane", cluster)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def minio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MinioServer]:
    server = MinioServer(tmp_path_factory.mktemp("minio"))
    _start_or_fail("MinIO", server)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3(minio: MinioServer) -> S3Endpoint:
    assert minio.endpoint is not None
    return minio.endpoint


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    # STATOR_TESTBED_HOST: the real-node runner's host address (tests/e2e/real_nodes.py),
    # where the broker listens so that pods reach it; else loopback.
    host = os.environ.get("STATOR_TESTBED_HOST") or LOOPBACK
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka"), host=host)
    _start_or_fail("Kafka", broker)
    yield broker
    broker.stop()


@pytest.fixture
def namespace(kube: KubeCluster) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards without waiting for finalization."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    kube.kubectl("create", "namespace", name)
    yield name
    kube.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def bucket(s3: S3Endpoint) -> str:
    name = f"t-{uuid.uuid4().hex[:10]}"
    s3.client().create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="session")
def spark_sessions() -> Iterator[SparkSessions]:
    sessions = SparkSessions()
    yield sessions
    sessions.stop()


@pytest.fixture
def spark(spark_sessions: SparkSessions) -> Any:
    """The local Spark most in-process tests share (2 cores, task retries on), with the test
    bed's Kafka connector on its classpath."""
    from stator.config import SparkConfig
    from tests.testbed.spark import kafka_connector_jars

    jars = ",".join(str(j) for j in kafka_connector_jars())
    # FAIR: the regions of a job of several (driver/regions.py) share the cores.
    conf = {"spark.jars": jars, "spark.scheduler.mode": "FAIR"}
    config = SparkConfig(master="local[2]", task_attempts=4, conf=conf)
    return spark_sessions.get(config, "stator-tests")


@pytest.fixture
def job_config(tmp_path_factory: pytest.TempPathFactory) -> object:
    """A job config with checkpoints and local state in fresh temporary directories."""
    from stator.config import load_config

    root = tmp_path_factory.mktemp("job")
    return load_config(
        None,
        [
            f"checkpoint.storage=file://{root}/checkpoints",
            f"state.local_dir={root}/state",
            "restart.delay_ms=0",
        ],
    )
