"""Incremental checkpoints on MinIO: small uploads at low churn, retention that never deletes
a needed file, and a correct restore from every retained checkpoint."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from stator import Job, Pipeline
from stator.checkpoint.coordinator import CheckpointCoordinator
from stator.checkpoint.metadata import CheckpointMetadata
from stator.config import JobConfig
from stator.sinks import CollectSink
from stator.sources import GeneratorSource, SweepEvents
from stator.storage import S3Options, open_store
from tests.helpers import with_overrides
from tests.testbed.minio import S3Endpoint

KEYS, STEP, CHURN_CHECKPOINTS, RETAINED = 20_000, 200, 8, 3  # 1% of the keys per checkpoint


def pipeline(count: int, sink: CollectSink) -> Pipeline:
    p = Pipeline("churn", max_parallelism=32)
    (
        p.source(GeneratorSource(SweepEvents(KEYS), count=count, splits=2), uid="events")
        .key_by(lambda e: e[0])
        .count(uid="count")
        .sink(sink, uid="out")
    )
    return p


def expected_counts(count: int) -> dict[str, int]:
    counts: dict[str, int] = {}
    for i in range(count):
        counts[f"k{i % KEYS}"] = counts.get(f"k{i % KEYS}", 0) + 1
    return counts


def test_incremental_retention_and_restore_from_every_retained(
    spark: Any, job_config: JobConfig, s3: S3Endpoint
) -> None:
    bucket = f"inc-{uuid.uuid4().hex[:8]}"
    s3.client().create_bucket(Bucket=bucket)
    opts = S3Options(
        endpoint_url=s3.endpoint_url, access_key_id=s3.access_key, secret_access_key=s3.secret_key
    )
    base = with_overrides(
        job_config,
        checkpoint={"storage": f"s3://{bucket}/ck", "retained": RETAINED},
        s3={
            "endpoint_url": s3.endpoint_url,
            "access_key_id": s3.access_key,
            "secret_access_key": s3.secret_key,
        },
    )
    # 1. The initial state: every key once, in one epoch and one checkpoint.
    pipeline(KEYS, CollectSink()).run(with_overrides(base, epoch={"max_records": KEYS}), spark)
    # 2. Checkpoints that each follow an epoch changing 1% of the keys.
    end = KEYS + CHURN_CHECKPOINTS * STEP
    job = Job(
        pipeline(end, CollectSink()), with_overrides(base, epoch={"max_records": STEP}), spark
    )
    seen: list[CheckpointMetadata] = []

    job.on_checkpoint(seen.append)
    status = job.run()
    assert status.checkpoints == CHURN_CHECKPOINTS
    for meta in seen:
        assert meta.incremental_bytes < 0.2 * meta.state_bytes, (
            f"checkpoint {meta.checkpoint_id} uploaded {meta.incremental_bytes} "
            f"of {meta.state_bytes} bytes"
        )
    assert sum(m.incremental_bytes for m in seen) / len(seen) < 0.1 * seen[-1].state_bytes

    # 3. Retention: exactly the retained checkpoints exist, with every file they reference,
    #    and nothing else (the registry agrees with storage).
    store = open_store(f"s3://{bucket}/ck/churn", opts)
    listing = dict(store.listing())
    coordinator = CheckpointCoordinator(store, RETAINED)
    coordinator.recover()
    retained = coordinator.completed
    assert [m.checkpoint_id for m in retained] == [m.checkpoint_id for m in seen[-RETAINED:]]
    needed = {f.key for m in retained for f in m.files()}
    assert needed <= set(listing)
    assert {k for k in listing if k.startswith("shared/")} == {
        k for k in needed if k.startswith("shared/")
    }

    # 4. Restore each retained checkpoint into a new job and run it to a common end that
    #    touches every key again: each key's final count must be exact.
    final = end + KEYS
    for meta in retained:
        sink = CollectSink()
        restored = with_overrides(
            base,
            name=f"restore-{meta.checkpoint_id}",
            epoch={"max_records": 2 * KEYS},
            restore={"source": f"s3://{bucket}/ck/churn/chk-{meta.checkpoint_id:010d}"},
        )
        pipeline(final, sink).run(restored, spark)
        assert dict(sink.results) == expected_counts(final), f"restore of {meta.checkpoint_id}"
    # Restoring never touched the original job's checkpoints.
    assert dict(store.listing()) == listing


def test_switching_from_full_to_incremental_keeps_every_checkpoint_whole(
    spark: Any, job_config: JobConfig, tmp_path: Path
) -> None:
    """A job checkpointed in full, restarted with incremental checkpoints and one retained:
    the first incremental checkpoint must upload its own shared SSTs, not reference the full
    one's private files, which go with that checkpoint's directory when it is subsumed. A
    new job on fresh disks then restores the latest checkpoint, with exact counts. (Before
    the fix that checkpoint named deleted files: its restore failed and fell back.)"""
    base = with_overrides(
        job_config,
        checkpoint={"storage": f"file://{tmp_path}/ck", "retained": 1},
        state={"local_dir": str(tmp_path / "state")},
    )
    full = with_overrides(base, checkpoint={"incremental": False}, epoch={"max_records": KEYS})
    pipeline(KEYS, CollectSink()).run(full, spark)
    end = KEYS + 3 * STEP
    incremental = with_overrides(base, epoch={"max_records": STEP})
    assert incremental.checkpoint.incremental
    status = pipeline(end, CollectSink()).run(incremental, spark)
    assert status.checkpoints == 3 and status.restores.remote == 0  # its own local state
    final = end + KEYS
    sink = CollectSink()
    fresh = with_overrides(
        incremental,
        state={"local_dir": str(tmp_path / "fresh")},
        epoch={"max_records": 2 * KEYS},
    )
    restored = pipeline(final, sink).run(fresh, spark)
    assert restored.restarts == 0 and restored.restores.remote == 2
    assert dict(sink.results) == expected_counts(final)
