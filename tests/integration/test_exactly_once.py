"""Exactly-once, proven: a Kafka -> keyed running sum -> file sink job on MinIO is killed at
awkward moments (a Python worker, the whole driver, MinIO itself) and restarted from its
checkpoints; the committed output must equal a failure-free run record for record.

The job runs as a real ``stator run`` process. Kill points are drawn from a seeded random
generator (the seed is printed), so a failing case can be replayed.
"""

from __future__ import annotations

import os
import random
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.running_sum_runs import (
    EVENTS,
    Run,
    expected_output,
    fill_topic,
    kill_all,
    per_user,
    run_env,
)
from tests.testbed.kafka import KafkaBroker
from tests.testbed.minio import MinioServer, S3Endpoint

SEED = int(os.environ.get("STATOR_EO_SEED", str(random.SystemRandom().randrange(10**6))))


@pytest.fixture(scope="module")
def topic(kafka: KafkaBroker) -> str:
    return fill_topic(kafka)


@pytest.fixture
def new_run(s3: S3Endpoint, kafka: KafkaBroker, topic: str, tmp_path: Path) -> Iterator[Any]:
    runs: list[Run] = []

    def make(*settings: str) -> Run:
        bucket = f"eo-{uuid.uuid4().hex[:10]}"
        s3.client().create_bucket(Bucket=bucket)
        env = run_env(s3, kafka, topic, EO_OUT=f"s3://{bucket}/out")
        run = Run(s3, bucket, tmp_path / bucket, env, settings=settings)
        run.workdir.mkdir()
        runs.append(run)
        return run

    yield make
    kill_all(runs)


@pytest.fixture(scope="module")
def baseline(
    s3: S3Endpoint, kafka: KafkaBroker, topic: str, tmp_path_factory: pytest.TempPathFactory
) -> list[dict[str, Any]]:
    """The failure-free run: its output is checked against the expected values once, and is
    then what every failure run must reproduce exactly."""
    bucket = f"eo-base-{uuid.uuid4().hex[:6]}"
    s3.client().create_bucket(Bucket=bucket)
    env = run_env(s3, kafka, topic, EO_OUT=f"s3://{bucket}/out")
    run = Run(s3, bucket, tmp_path_factory.mktemp("baseline"), env)
    run.start()
    assert run.wait() == 0, run.log_tail()
    records = run.output()
    assert len(records) == EVENTS
    assert per_user(records) == expected_output()
    return records


def _assert_same(run: Run, baseline: list[dict[str, Any]]) -> None:
    got = run.output()
    assert len(got) == len(baseline), f"{len(got)} records committed, expected {len(baseline)}"
    assert got == baseline, "committed output differs from the failure-free run"


# The epochs' tasks: per-epoch Spark jobs (the default), or long-running tasks, whose
# failures must give the failure-free per-epoch run's output too.
TASKS = pytest.mark.parametrize(
    "tasks", ["per-epoch", "long-running"], ids=["per-epoch", "long-running"]
)


@TASKS
def test_killed_python_workers(new_run: Any, baseline: list[dict[str, Any]], tasks: str) -> None:
    rng = random.Random(SEED)
    print(f"seed {SEED}")
    run = new_run(f"epoch.tasks={tasks}")
    run.start()
    killed = 0
    for target in sorted(rng.sample(range(1, 9), 3)):
        if not run.wait_for_checkpoints(target):
            break
        time.sleep(rng.uniform(0, 0.6))
        workers = run.workers()
        if workers:
            rng.choice(workers).kill()
            killed += 1
    assert killed >= 1, "no Python worker was found to kill: the test would prove nothing"
    assert run.wait() == 0, run.log_tail()
    _assert_same(run, baseline)


@TASKS
def test_killed_driver(new_run: Any, baseline: list[dict[str, Any]], tasks: str) -> None:
    rng = random.Random(SEED + 1)
    run = new_run(f"epoch.tasks={tasks}")
    run.start()
    for target in sorted(rng.sample(range(2, 9), 2)):
        assert run.wait_for_checkpoints(target), "the job finished before it could be killed"
        time.sleep(rng.uniform(0, 1.0))
        run.kill_driver()
        run.start()
    assert run.wait() == 0, run.log_tail()
    assert run.starts == 3
    _assert_same(run, baseline)


def test_minio_stopped_during_uploads(
    new_run: Any, baseline: list[dict[str, Any]], minio: MinioServer
) -> None:
    rng = random.Random(SEED + 2)
    run = new_run()
    run.start()
    assert run.wait_for_checkpoints(rng.randrange(2, 5))
    time.sleep(rng.uniform(0, 0.5))
    minio.kill()
    time.sleep(rng.uniform(3, 10))  # long enough, sometimes, to exhaust Spark's task retries
    assert run.proc is not None and run.proc.poll() is None, "the job must survive the outage"
    minio.start()
    assert run.wait() == 0, run.log_tail()
    log = "".join(p.read_text(errors="replace") for p in run.workdir.glob("driver-*.log"))
    assert "is unreachable" in log, "the job should have noticed MinIO's outage"
    _assert_same(run, baseline)
