"""Rescaling keyed state 2 -> 5 -> 1 -> 3 through savepoints and a checkpoint: the committed
output equals a run at constant parallelism, record for record (bytewax-style: deterministic
input, exact expected output)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stator import Job, Pipeline
from stator.config import JobConfig
from stator.errors import ConfigError
from stator.savepoint.metadata import METADATA_NAME, SavepointMetadata
from stator.sinks import FileSink
from stator.sources import GeneratorSource, KeyedEvents
from stator.storage import open_store
from tests.helpers import with_overrides
from tests.integration.rescale_job import EPOCH, EVENTS, KEYS, output, pipeline, run_phase


def test_rescale_2_5_1_3_equals_constant_parallelism(
    spark: Any, job_config: JobConfig, tmp_path: Path
) -> None:
    base = with_overrides(
        job_config, epoch={"max_records": EPOCH}, savepoint={"dir": f"file://{tmp_path}/savepoints"}
    )
    reference = f"file://{tmp_path}/reference"
    ref_cfg = with_overrides(
        base, name="reference", checkpoint={"storage": f"file://{tmp_path}/ref-checkpoints"}
    )
    status = pipeline(reference).run(with_overrides(ref_cfg, parallelism=2), spark)
    assert status.finished

    out = f"file://{tmp_path}/rescaled"
    s1 = run_phase(spark, base, out, 2, "latest", stop_after_epoch=3)
    assert s1.state == "STOPPED" and s1.stopped_with_savepoint
    s2 = run_phase(spark, base, out, 5, s1.stopped_with_savepoint, stop_after_epoch=7)
    assert s2.state == "STOPPED"
    # 5 -> 1 from the latest checkpoint (taken with the savepoint), not from the savepoint.
    s3 = run_phase(spark, base, out, 1, "latest", stop_after_epoch=10)
    assert s3.state == "STOPPED"
    s4 = run_phase(spark, base, out, 3, s3.stopped_with_savepoint, stop_after_epoch=None)
    assert s4.finished

    got, want = output(out), output(reference)
    assert sum(got["counts"].values()) > 0 and sum(got["windows"].values()) > 0
    assert got["count_order"] == want["count_order"], "running counts differ per key"
    assert got["counts"] == want["counts"]
    assert got["windows"] == want["windows"], "window results differ"
    total = sum(v for (_, _, v), n in got["windows"].items() for _ in range(n))
    assert total == EVENTS


def test_max_parallelism_change_is_refused(
    spark: Any, job_config: JobConfig, tmp_path: Path
) -> None:
    out = f"file://{tmp_path}/out"
    cfg = with_overrides(
        job_config, epoch={"max_records": EPOCH}, savepoint={"dir": f"file://{tmp_path}/sp"}
    )
    s1 = run_phase(spark, cfg, out, 2, "latest", stop_after_epoch=2)
    other = Pipeline("rescale", max_parallelism=32)
    other.source(GeneratorSource(KeyedEvents(KEYS), count=EVENTS), uid="events").key_by(
        lambda e: e[0]
    ).count(uid="count").sink(FileSink(out + "2"), uid="counts")
    with pytest.raises(ConfigError, match=r"maxParallelism=64.*declares 32.*fixed for the life"):
        other.run(with_overrides(cfg, restore={"source": s1.stopped_with_savepoint}), spark)


def test_native_savepoints_restore_at_same_and_another_parallelism(
    spark: Any, job_config: JobConfig, tmp_path: Path
) -> None:
    """Native savepoints (each subtask's RocksDB files) restored 2 -> 2 (an upgrade: the
    files as they are) and 2 -> 3 (a rescale: key-groups copied out of overlapping
    databases), with exact output; and the savepoint's bytes are what the restore read."""
    base = with_overrides(
        job_config,
        epoch={"max_records": EPOCH},
        savepoint={"dir": f"file://{tmp_path}/savepoints", "format_type": "native"},
    )
    reference = f"file://{tmp_path}/reference"
    ref_cfg = with_overrides(
        base, name="reference", checkpoint={"storage": f"file://{tmp_path}/ref-checkpoints"}
    )
    reference_job = Job(pipeline(reference), with_overrides(ref_cfg, parallelism=2), spark)
    assert reference_job.run().finished

    out = f"file://{tmp_path}/native"
    s1 = run_phase(spark, base, out, 2, "latest", stop_after_epoch=3)
    assert s1.state == "STOPPED" and s1.stopped_with_savepoint
    first = SavepointMetadata.from_json(open_store(s1.stopped_with_savepoint).get(METADATA_NAME))
    assert first.native and {op.parallelism for op in first.operators.values()} == {2}
    # Each phase on fresh local disks, as a new driver pod's: the state comes from the savepoint.
    fresh = with_overrides(base, state={"local_dir": str(tmp_path / "pod-2")})
    s2 = run_phase(spark, fresh, out, 2, s1.stopped_with_savepoint, stop_after_epoch=7)
    assert s2.state == "STOPPED"
    assert (s2.restores.remote, s2.restores.remote_bytes) == (4, first.state_bytes)
    fresh = with_overrides(base, state={"local_dir": str(tmp_path / "pod-3")})
    s3 = run_phase(spark, fresh, out, 3, s2.stopped_with_savepoint, stop_after_epoch=None)
    assert s3.finished and s3.restores.remote == 6

    got, want = output(out), output(reference)
    assert sum(got["counts"].values()) > 0 and sum(got["windows"].values()) > 0
    assert got["count_order"] == want["count_order"], "running counts differ per key"
    assert got["counts"] == want["counts"]
    assert got["windows"] == want["windows"], "window results differ"
