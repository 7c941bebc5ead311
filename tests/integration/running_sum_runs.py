"""What the exactly-once tests of the Kafka -> keyed running sum job share
(``tests/pipelines/kafka_running_sum.py``): its input, its expected output, and a
``stator run`` of it that tests start, kill and restart."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from stator.sinks import read_committed
from stator.storage import S3Options
from tests.helpers import python_workers
from tests.testbed.kafka import KafkaBroker
from tests.testbed.minio import S3Endpoint

ROOT = Path(__file__).resolve().parents[2]
EVENTS, USERS, PARTITIONS = 24_000, 300, 4
OUT_PARTITIONS = 3  # of a Kafka sink's output topic


def fill_topic(kafka: KafkaBroker) -> str:
    """A fresh input topic holding the job's EVENTS payments, in production order."""
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
    settings: tuple[str, ...] = ()  # job config lines over the defaults below

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
            *(arg for line in self.settings for arg in ("--set", line)),
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
        """SIGKILL to the driver's process group: its Spark JVM and workers go too (a
        crashed pod's would), also when the driver itself already died."""
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
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


def read_topic(bootstrap: str, name: str, isolation: str) -> list[dict[str, Any]]:
    """Every record of ``name`` a consumer with ``isolation`` reads, partition by partition."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "enable.partition.eof": True,
        }
    )
    out: list[dict[str, Any]] = []
    try:
        consumer.assign([TopicPartition(name, p, 0) for p in range(OUT_PARTITIONS)])
        at_end: set[int] = set()
        while len(at_end) < OUT_PARTITIONS:
            msg = consumer.poll(10)
            assert msg is not None, f"reading {name}: no end of partition after 10 s"
            if msg.error() is not None:
                if msg.error().code() == -191:  # _PARTITION_EOF
                    at_end.add(msg.partition())
                    continue
                raise AssertionError(msg.error())
            at_end.discard(msg.partition())
            out.append(json.loads(msg.value()))
    finally:
        consumer.close()
    return out


def kill_all(runs: Sequence[Run]) -> None:
    """A test's teardown: no run of it outlives the test."""
    for run in runs:
        if run.proc is not None and run.proc.poll() is None:
            os.killpg(run.proc.pid, signal.SIGKILL)
