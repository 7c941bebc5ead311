"""Task-local recovery on real Spark (local[2]): a rewound job restores from the executors'
local copies, a damaged copy falls back to the object store, and a task that finds no local
state between checkpoints rewinds the job without dropping the (good) checkpoint. Output is
compared epoch for epoch with an undisturbed run."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stator import EpochResult, Job, Pipeline
from stator.config import JobConfig, SparkConfig
from stator.control.metrics import render_metrics
from stator.sinks import CollectSink
from stator.sources import GeneratorSource, KeyedEvents
from tests.helpers import SparkSessions, stop_with_savepoint_after, with_overrides

RECORDS, PER_EPOCH = 600, 60  # 10 epochs; checkpoints after epochs 3, 6, 9 and 10


@pytest.fixture(scope="module")
def spark(spark_sessions: SparkSessions) -> Any:
    return spark_sessions.get(SparkConfig(master="local[2]", task_attempts=2), "local-recovery")


def pipeline(sink: CollectSink, seed: int = 0) -> Pipeline:
    p = Pipeline("localrec", max_parallelism=16)
    (
        p.source(GeneratorSource(KeyedEvents(40, seed), count=RECORDS, splits=2), uid="events")
        .key_by(lambda e: e[0])
        .count(uid="count")
        .sink(sink, uid="out")
    )
    return p


def config(job_config: JobConfig) -> JobConfig:
    return with_overrides(
        job_config,
        epoch={"max_records": PER_EPOCH},
        checkpoint={"every_epochs": 3, "retained": 2},
    )


def run(
    spark: Any, cfg: JobConfig, after: Callable[[Job, EpochResult], None] | None = None
) -> tuple[Job, CollectSink]:
    sink = CollectSink()
    job = Job(pipeline(sink), cfg, spark)
    if after is not None:
        job.on_epoch(lambda result: after(job, result))
    job.run()
    return job, sink


@pytest.fixture(scope="module")
def reference(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[Any]]:
    from stator.config import load_config

    root = tmp_path_factory.mktemp("reference")
    cfg = load_config(
        None, [f"checkpoint.storage=file://{root}/ck", f"state.local_dir={root}/state"]
    )
    job, sink = run(spark, config(cfg))
    assert job.status.restarts == 0
    assert job.status.restores.local == job.status.restores.remote == 0
    return sink.by_epoch


def state_dirs(cfg: JobConfig) -> list[Path]:
    return sorted((Path(cfg.state.local_dir) / "localrec" / "count").glob("*-of-2"))


def fail_once_after(epoch: int, damage: Callable[[JobConfig], None] | None = None) -> Any:
    """A listener that (optionally damages local state and) fails the job once after
    ``epoch``, between checkpoints: the job rewinds to the checkpoint of epoch 3."""
    fired: list[bool] = []

    def after(job: Job, result: EpochResult) -> None:
        if result.epoch == epoch and not fired:
            fired.append(True)
            if damage is not None:
                damage(job.config)
            raise RuntimeError("injected failure between checkpoints")

    return after


def test_rewind_restores_from_local_copies(
    spark: Any, job_config: JobConfig, reference: dict[int, list[Any]]
) -> None:
    job, sink = run(spark, config(job_config), fail_once_after(5))
    st = job.status
    assert st.restarts == 1
    assert (st.restores.local, st.restores.remote, st.restores.remote_bytes) == (2, 0, 0)
    assert st.restores.local_bytes > 0
    assert {r["source"] for r in st.last_restores.values()} == {"local"}
    print("local restores:", sorted(st.last_restores.values(), key=lambda r: r["subtask"]))
    assert sink.by_epoch == reference
    body = render_metrics(job)[0].decode()
    assert 'stator_restores_total{job="localrec",source="local"} 2.0' in body
    assert 'stator_restore_remote_bytes_total{job="localrec"} 0.0' in body
    local_bytes = st.restores.local_bytes
    assert f'stator_restore_local_bytes_total{{job="localrec"}} {float(local_bytes)}' in body


def test_damaged_local_copy_falls_back_to_the_object_store(
    spark: Any, job_config: JobConfig, reference: dict[int, list[Any]]
) -> None:
    def truncate_one_copy(cfg: JobConfig) -> None:
        copy = next(state_dirs(cfg)[0].glob("chk-*"))
        victim = max(copy.iterdir(), key=lambda p: p.stat().st_size)
        victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])

    job, sink = run(spark, config(job_config), fail_once_after(5, truncate_one_copy))
    st = job.status
    assert (st.restores.local, st.restores.remote) == (1, 1)
    remote = [r for r in st.last_restores.values() if r["source"] == "remote"]
    assert remote[0]["subtask"] == 0 and "bytes" in remote[0]["fallback"]
    first = job.history.items()[0]
    assert remote[0]["checkpoint_id"] == first.id  # the good checkpoint was restored, not dropped
    assert remote[0]["remote_bytes"] > 0
    print("restores:", sorted(st.last_restores.values(), key=lambda r: r["subtask"]))
    assert sink.by_epoch == reference


def test_lost_local_state_between_checkpoints_keeps_the_checkpoint(
    spark: Any, job_config: JobConfig, reference: dict[int, list[Any]]
) -> None:
    """Issue 9, item 7: after epoch 4 the executors' state is gone (as if the tasks landed
    elsewhere). Epoch 5 cannot run on it; the job rewinds to checkpoint 1 (epoch 3) and
    restores it from the object store. Before the fix the driver dropped that checkpoint."""
    fired: list[bool] = []

    def wipe_after_4(job: Job, result: EpochResult) -> None:
        if result.epoch == 4 and not fired:
            fired.append(True)
            for d in state_dirs(job.config):
                shutil.rmtree(d)

    job, sink = run(spark, config(job_config), wipe_after_4)
    st = job.status
    assert st.restarts == 1
    assert st.last_error is not None and "StateMismatchError" in st.last_error
    assert (st.restores.local, st.restores.remote) == (0, 2)
    first = job.history.items()[0]
    assert {r["checkpoint_id"] for r in st.last_restores.values()} == {first.id}
    assert all(h.status == "COMPLETED" for h in job.history.items())
    assert sink.by_epoch == reference


@pytest.mark.parametrize("format_type", ["canonical", "native"])
def test_local_state_of_another_lineage_is_never_kept(
    spark: Any,
    job_config: JobConfig,
    reference: dict[int, list[Any]],
    tmp_path: Path,
    format_type: str,
) -> None:
    """The same job run on other input, on the same disks, leaves local state at the very
    epoch a savepoint of the first run restores to. The restored job must not keep it: its
    commit is not the savepoint's. (Before the fix a subtask compared epochs only, kept the
    other run's counts and the output after the savepoint was wrong.)"""
    base = with_overrides(
        config(job_config),
        state={"local_dir": str(tmp_path / "disks")},
        savepoint={"dir": f"file://{tmp_path}/savepoints", "format_type": format_type},
    )

    def phase(seed: int, name: str, restore: str, stop_after: int | None) -> Any:
        sink = CollectSink()
        cfg = with_overrides(
            base, checkpoint={"storage": f"file://{tmp_path}/{name}"}, restore={"source": restore}
        )
        driver = Job(pipeline(sink, seed), cfg, spark)
        if stop_after is not None:
            stop_with_savepoint_after(driver, stop_after)
        return driver.run(), sink

    first, _ = phase(0, "first", "latest", 3)
    other, _ = phase(1, "other", "latest", 3)  # other keys' counts, same epochs, same disks
    assert first.stopped_with_savepoint and other.stopped_with_savepoint
    assert first.epoch == other.epoch
    resumed, sink = phase(0, "resumed", first.stopped_with_savepoint, None)
    assert resumed.finished
    # The stop-with-savepoint epoch read no records: the resumed epoch e read the
    # undisturbed run's e - 1, and must have given the same counts.
    assert {e - 1: rows for e, rows in sink.by_epoch.items()} == {
        e: rows for e, rows in reference.items() if e >= first.epoch
    }
    assert (resumed.restores.local, resumed.restores.remote) == (0, 2)
