"""Exactly-once, proven: a Kafka -> keyed running sum -> file sink job on MinIO is killed at
awkward moments (a Python worker, the whole driver, MinIO itself) and restarted from its
checkpoints; the committed output must equal a failure-free run record for record.

The job runs as a real ``stator run`` process. Kill points are drawn from a seeded random
generator (the seed is printed), so a failing case can be replayed.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from stator.sinks import read_committed
from stator.storage import S3Options
from tests.helpers import python_workers
from tests.testbed.kafka import KafkaBroker
from tests.testbed.minio import MinioServer, S3Endpoint

ROOT = Path(__file__).resolve().parents[2]
EVENTS, USERS, PARTITIONS = 24_000, 300, 4
SEED = int(os.environ.get("STATOR_EO_SEED", str(random.SystemRandom().randrange(10**6))))


@pytest.fixture(scope="module")
def topic(kafka: KafkaBroker) -> str:
    name = f"eo-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    admin.create_topics([NewTopic(name, PARTITIONS, 1)])[name].result(30)
    # Idempotence keeps per-partition order equal to production order (without it a retried
    # first batch, e.g. before the new topic has a leader, lands after later ones).
    producer = Producer(
        {"bootstrap.servers": kafka.bootstrap_servers, "linger.ms": 20, "enable.idempotence": True}
    )
    for i in range(EVENTS):
        user = f"u{i % USERS}"
        producer.produce(
            name,
            key=user.encode(),
            value=json.dumps({"user": user, "amount": (i * 7) % 13}).encode(),
        )
        if i % 5000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    return name


@dataclass
class Run:
    """One ``stator run`` of the test job, with its own bucket (checkpoints + output)."""

    s3: S3Endpoint
    bucket: str
    workdir: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def out(self) -> str:
        return f"s3://{self.bucket}/out"

    def start(self) -> None:
        self.starts += 1
        argv = [
            sys.executable,
            "-m",
            "stator",
            "run",
            "tests.pipelines.kafka_running_sum:build",
            "--set",
            f"checkpoint.storage=s3://{self.bucket}/checkpoints",
            "--set",
            f"state.local_dir={self.workdir}/state",
            "--set",
            "epoch.max_records=2000",
            "--set",
            "spark.master=local[2]",
            "--set",
            "restart.strategy=exponential-backoff",
            "--set",
            "restart.delay_ms=500",
            "--set",
            "restart.max_delay_ms=3000",
            "--set",  # 0.5+1+2+3x3 s of backoff: more than the longest MinIO outage below (10 s)
            "restart.attempts=6",
            "--set",
            "s3.max_attempts=2",
            "--set",
            "s3.connect_timeout_s=2",
        ]
        log = (self.workdir / f"driver-{self.starts}.log").open("ab")
        self.proc = subprocess.Popen(
            argv, cwd=ROOT, env=self.env, stdout=log, stderr=log, start_new_session=True
        )

    def wait(self, timeout: float = 240) -> int:
        assert self.proc is not None
        code = self.proc.wait(timeout)
        return code

    def kill_driver(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def checkpoints(self) -> int:
        """The id of the newest completed checkpoint (retention keeps only a few)."""
        try:
            client = self.s3.client()
            pages = client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix="checkpoints/"
            )
            ids = [
                int(o["Key"].split("/chk-")[1].split("/")[0])
                for page in pages
                for o in page.get("Contents", [])
                if o["Key"].endswith("/_metadata")
            ]
            return max(ids, default=0)
        except Exception:
            return -1

    def wait_for_checkpoints(self, n: int, timeout: float = 180) -> bool:
        """True once checkpoint ``n`` completed; False if the job finished first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                assert self.proc.returncode == 0, self.log_tail()
                return False
            if self.checkpoints() >= n:
                return True
            time.sleep(0.1)
        raise TimeoutError(f"fewer than {n} checkpoints after {timeout}s\n{self.log_tail()}")

    def workers(self) -> list[psutil.Process]:
        assert self.proc is not None
        return python_workers(self.proc.pid)

    def log_tail(self) -> str:
        logs = sorted(self.workdir.glob("driver-*.log"))
        return "\n".join(f"--- {p.name}:\n" + p.read_text(errors="replace")[-3000:] for p in logs)

    def output(self) -> list[dict[str, Any]]:
        return read_committed(
            self.out,
            S3Options(
                endpoint_url=self.s3.endpoint_url,
                access_key_id=self.s3.access_key,
                secret_access_key=self.s3.secret_key,
            ),
        )


def run_env(s3: S3Endpoint, kafka: KafkaBroker, topic: str, **extra: str) -> dict[str, str]:
    """The environment of a ``stator run`` of ``tests/pipelines/kafka_running_sum.py``."""
    return {
        **os.environ,
        **s3.env(),
        "EO_BOOTSTRAP": kafka.bootstrap_servers,
        "EO_TOPIC": topic,
        "PYTHONPATH": str(ROOT),
        "PYSPARK_PYTHON": sys.executable,
        **extra,
    }


@pytest.fixture
def new_run(s3: S3Endpoint, kafka: KafkaBroker, topic: str, tmp_path: Path) -> Iterator[Any]:
    runs: list[Run] = []

    def make() -> Run:
        bucket = f"eo-{uuid.uuid4().hex[:10]}"
        s3.client().create_bucket(Bucket=bucket)
        env = run_env(s3, kafka, topic, EO_OUT=f"s3://{bucket}/out")
        run = Run(s3, bucket, tmp_path / bucket, env)
        run.workdir.mkdir()
        runs.append(run)
        return run

    yield make
    for run in runs:
        if run.proc is not None and run.proc.poll() is None:
            os.killpg(run.proc.pid, signal.SIGKILL)


def expected_output() -> dict[str, list[tuple[int, int]]]:
    """Per user: (count, sum) after each of its events, in offset order (one partition each)."""
    out: dict[str, list[tuple[int, int]]] = {}
    totals: dict[str, tuple[int, int]] = {}
    for i in range(EVENTS):
        user = f"u{i % USERS}"
        count, total = totals.get(user, (0, 0))
        totals[user] = (count + 1, total + (i * 7) % 13)
        out.setdefault(user, []).append(totals[user])
    return out


def per_user(records: list[dict[str, Any]]) -> dict[str, list[tuple[int, int]]]:
    out: dict[str, list[tuple[int, int]]] = {}
    for r in records:
        out.setdefault(r["user"], []).append((r["count"], r["sum"]))
    return out


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


def test_killed_python_workers(new_run: Any, baseline: list[dict[str, Any]]) -> None:
    rng = random.Random(SEED)
    print(f"seed {SEED}")
    run = new_run()
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


def test_killed_driver(new_run: Any, baseline: list[dict[str, Any]]) -> None:
    rng = random.Random(SEED + 1)
    run = new_run()
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
