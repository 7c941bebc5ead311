"""Asynchronous checkpoint uploads on real executor JVMs (``local-cluster[3,1,1024]``) and a
real MinIO: an executor killed while it uploads its part of checkpoint K fails K at once (not
at ``checkpoint.timeout_ms``), no other checkpoint, processing never stops, nothing K wrote
stays in the bucket, and the output equals a failure-free run with synchronous uploads,
epoch for epoch, record for record.

The executors reach MinIO through a forwarder whose upload bandwidth the test caps from the
end of epoch K-1 until the kill (incompressible 64 KiB values, every key rewritten each
epoch), so the victim's upload is still running when it dies; the test checks that it was
unconfirmed instead of assuming it."""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from stator import BYTES, EpochResult, Job, KeyedProcessFunction, Pipeline, ValueStateDescriptor
from stator.checkpoint.uploads import CONFIRMED, confirmation_key
from stator.cluster.jvm import live_executors
from stator.config import JobConfig, SparkConfig, load_config
from stator.sinks import CollectSink
from stator.sources import GeneratorSource, SweepEvents
from tests.helpers import SparkSessions, executor_process
from tests.testbed.minio import S3Endpoint
from tests.testbed.throttle import ThrottledPort

KEYS, VALUE_BYTES, EPOCHS, KILL_AFTER = 800, 64 * 1024, 4, 2
SLOW_LINK = 2 * 1024 * 1024  # bytes per second while epoch KILL_AFTER uploads
REPO = str(Path(__file__).parents[2])


class Rewrite(KeyedProcessFunction):
    """Each event replaces its key's large value; emits (key, how many times it was seen)."""

    def open(self, ctx: Any) -> None:
        self.value = ctx.get_state(ValueStateDescriptor("value", BYTES))

    def process_element(self, event: Any, ctx: Any) -> Any:
        old = self.value.value(b"")
        seen = int.from_bytes(old[:4], "big") + 1 if old else 1
        rest = random.Random(f"{ctx.current_key}/{seen}").randbytes(VALUE_BYTES - 4)
        self.value.update(seen.to_bytes(4, "big") + rest)
        yield (ctx.current_key, seen)


def pipeline(sink: CollectSink) -> Pipeline:
    p = Pipeline("uploads", max_parallelism=16)
    (
        p.source(GeneratorSource(SweepEvents(KEYS), count=KEYS * EPOCHS, splits=2), uid="events")
        .key_by(lambda e: e[0])
        .process(Rewrite(), uid="rewrite")
        .sink(sink, uid="out")
    )
    return p


def config(root: Path, storage: str, endpoint_url: str, s3: S3Endpoint, *extra: str) -> JobConfig:
    return load_config(
        None,
        [
            f"checkpoint.storage={storage}",
            f"state.local_dir={root}/state",
            f"epoch.max_records={KEYS}",
            "parallelism=2",
            "checkpoint.retained=1",
            f"s3.endpoint_url={endpoint_url}",
            f"s3.access_key_id={s3.access_key}",
            f"s3.secret_access_key={s3.secret_key}",
            *extra,
        ],
    )


@pytest.fixture(scope="module")
def cluster(spark_sessions: SparkSessions) -> Iterator[Any]:
    yield spark_sessions.get(SparkConfig(master="local-cluster[3,1,1024]"), "placement")
    spark_sessions.stop()


def kill_executor(app_id: str, executor: str) -> None:
    """SIGKILL one executor JVM and its Python workers (and their uploaders), as a lost pod
    would go."""
    jvm = executor_process(app_id, executor)
    for v in [jvm, *jvm.children(recursive=True)]:
        os.kill(v.pid, signal.SIGKILL)


def by_epoch(sink: CollectSink) -> Any:
    return json.loads(json.dumps({str(k): sorted(v) for k, v in sorted(sink.by_epoch.items())}))


def test_an_executor_killed_mid_upload_fails_only_that_checkpoint(
    cluster: Any, s3: S3Endpoint, bucket: str, tmp_path: Path
) -> None:
    # The failure-free reference: synchronous uploads to a file store.
    expected = CollectSink()
    Job(
        pipeline(expected),
        config(
            tmp_path / "ref",
            f"file://{tmp_path}/ref/ck",
            s3.endpoint_url,
            s3,
            "checkpoint.async_upload=false",
        ),
        cluster,
        python_path=[REPO],
    ).run()

    target = urlparse(s3.endpoint_url)
    link = ThrottledPort(target.hostname or "127.0.0.1", target.port or 80)
    sink = CollectSink()
    job = Job(
        pipeline(sink),
        config(
            tmp_path / "run",
            f"s3://{bucket}/ck",
            link.endpoint_url,
            s3,
            "checkpoint.timeout_ms=120000",
        ),
        cluster,
        python_path=[REPO],
    )
    sc = cluster.sparkContext
    killed: dict[str, Any] = {}

    def after(result: EpochResult) -> None:
        if result.epoch == KILL_AFTER - 1:
            # Let this checkpoint's uploads finish first: only the next one crawls.
            prefix, deadline = f"chk-{result.checkpoint_id:010d}/", time.monotonic() + 60
            while time.monotonic() < deadline:
                listing = [k for k, _ in job.store.listing(prefix)]
                if sum(k.endswith(f"/{CONFIRMED}") for k in listing) == 2:
                    break
                time.sleep(0.1)
            link.limit(SLOW_LINK)
        if result.epoch != KILL_AFTER:
            return
        report = next(s for s in result.states if s.subtask == 0)
        assert report.upload and report.executor, "an asynchronous upload on an executor"
        key = confirmation_key(result.checkpoint_id, "rewrite", 0, report.upload, CONFIRMED)
        unconfirmed = not job.store.exists(key)
        kill_executor(sc.applicationId, report.executor)
        link.limit(None)
        killed.update(checkpoint=result.checkpoint_id, unconfirmed=unconfirmed, at=time.monotonic())
        deadline = time.monotonic() + 60
        while report.executor in live_executors(sc) and time.monotonic() < deadline:
            time.sleep(0.2)
        killed["executor"] = report.executor

    job.on_epoch(after)
    with link:
        status = job.run()
    elapsed_after_kill = time.monotonic() - killed["at"]

    assert killed["unconfirmed"], "the upload had finished before the kill: lower SLOW_LINK"
    outcomes = {c.id: c for c in job.history.items()}
    victim = outcomes[killed["checkpoint"]]
    assert victim.status == "FAILED"
    assert f"executor {killed['executor']} was lost" in (victim.error or "")
    assert [c.status for i, c in sorted(outcomes.items()) if i != victim.id] == ["COMPLETED"] * (
        EPOCHS - 1
    )
    assert elapsed_after_kill < 60, "the lost upload was noticed at once, not at the timeout"
    assert status.restarts == 0
    assert by_epoch(sink) == by_epoch(expected)

    # Nothing of the failed checkpoint is left, and every shared file is referenced.
    listing = [k for k, _ in job.store.listing()]
    assert not [k for k in listing if k.startswith(f"chk-{killed['checkpoint']:010d}/")]
    (retained,) = job.retained_checkpoints()
    assert {k for k in listing if k.startswith("shared/")} == retained.shared_keys()
