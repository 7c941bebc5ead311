"""Checkpoint health on real Spark (``local[2]``): a checkpoint store that refuses the writes
of the checkpoints after epoch 2's (a file stands where each one's directory must go, so
writing its metadata fails as a full or read-only disk would). With
``checkpoint.tolerable_failures=2`` the job fails over after exactly the third failure in a
row (not ready from then until it runs again), to the last completed checkpoint, and ends
with the output of a failure-free run, record for record; with
``checkpoint.progress_window_ms`` and no limit on failures, it fails over once no checkpoint
has covered an epoch's output for the window, and recovers as well."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from stator import EpochResult, Job, Pipeline
from stator.checkpoint.metadata import checkpoint_dir
from stator.config import JobConfig
from stator.control.answers import readiness
from stator.control.schema import Readiness
from stator.driver.status import JobState
from stator.sinks import CollectSink
from stator.sources.generator import list_source
from tests.helpers import with_overrides

KEYS = ("a", "b", "c")
PER_EPOCH = 6
EPOCHS = 16
RECORDS = [KEYS[i % 7 % 3] for i in range(PER_EPOCH * EPOCHS)]


def pipeline(name: str, sink: CollectSink) -> Pipeline:
    p = Pipeline(name, max_parallelism=8)
    (
        p.source(list_source(RECORDS), uid="keys")
        .key_by(lambda k: k)
        .count(uid="count", parallelism=2)
        .sink(sink, uid="out")
    )
    return p


def expected() -> dict[int, list[Any]]:
    """What a failure-free run commits per epoch: each key's running count at the end of
    every epoch that saw it (``Stream.count``)."""
    counts: Counter[str] = Counter()
    out = {}
    for epoch in range(1, EPOCHS + 1):
        chunk = RECORDS[(epoch - 1) * PER_EPOCH : epoch * PER_EPOCH]
        counts.update(chunk)
        out[epoch] = sorted((k, counts[k]) for k in set(chunk))
    return out


def config(job_config: JobConfig, **checkpoint: Any) -> JobConfig:
    return with_overrides(
        job_config,
        epoch={"max_records": PER_EPOCH},
        checkpoint={"async_upload": False, **checkpoint},
        restart={"strategy": "fixed-delay", "attempts": 3, "delay_ms": 0},
    )


def refuse(driver: Job, count: int) -> list[Path]:
    """Make the store refuse the next ``count`` checkpoints: a file where each one's
    directory goes (made once the job runs: its start removes what is not a checkpoint)."""
    (loop,) = driver.loops
    root = Path(loop.store.uri.removeprefix("file://"))
    first = loop.coordinator.next_id
    blocks = [root / checkpoint_dir(i) for i in range(first, first + count)]
    for block in blocks:
        block.write_text("not a directory")
    return blocks


def committed(sink: CollectSink) -> dict[int, list[Any]]:
    return {e: sorted(v) for e, v in sorted(sink.by_epoch.items())}


def test_the_job_fails_over_after_tolerable_plus_one_failures_and_recovers_exactly(
    spark: Any, job_config: JobConfig
) -> None:
    sink = CollectSink()
    cfg = config(job_config, tolerable_failures=2)
    driver = Job(pipeline("health-count", sink), cfg, spark)
    epochs: list[int] = []
    ready: list[Readiness] = []  # /readyz's answer after each epoch of the first run

    def after(result: EpochResult) -> None:
        epochs.append(result.epoch)
        if epochs == [1, 2]:
            refuse(driver, 3)  # the checkpoints of epochs 3-5
        if len(ready) < 5:
            ready.append(readiness(driver.status))

    driver.on_epoch(after)
    st = driver.run()
    assert st.state is JobState.FINISHED
    assert [r.ready for r in ready] == [True, True, True, True, False]
    assert (ready[-1].reason or "").startswith("3 consecutive checkpoints failed")
    assert epochs[:6] == [1, 2, 3, 4, 5, 3], "failed over right after the third failure"
    assert (st.failed_checkpoints, st.restarts) == (3, 1)
    assert st.last_error is not None and st.last_error.startswith(
        "3 consecutive checkpoints failed (checkpoint.tolerable_failures is 2): "
    ), st.last_error
    assert "cannot write" in st.last_error, "the store's own refusal is the cause"
    health = st.checkpoint_health()
    assert (health.failovers, health.healthy) == (1, True)
    assert committed(sink) == expected(), "exactly the output of a failure-free run"


def test_the_job_fails_over_when_no_checkpoint_completes_within_the_window(
    spark: Any, job_config: JobConfig
) -> None:
    """Failures in a row are not limited; the checkpoints after epoch 2's are refused until
    the job failed over (then the store takes writes again): the window alone fails it over."""
    sink = CollectSink()
    cfg = config(job_config, tolerable_failures=-1, progress_window_ms=1000)
    driver = Job(pipeline("health-window", sink), cfg, spark)
    epochs: list[int] = []
    blocks: list[Path] = []

    def after(result: EpochResult) -> None:
        epochs.append(result.epoch)
        if epochs == [1, 2]:
            blocks.extend(refuse(driver, 100))
        if driver.status.restarts:  # the store accepts writes again
            for block in blocks:
                block.unlink()
            blocks.clear()

    driver.on_epoch(after)
    st = driver.run()
    assert st.state is JobState.FINISHED
    assert st.restarts == 1
    assert st.last_error is not None and st.last_error.startswith(
        "no checkpoint completed in 1 s (checkpoint.progress_window_ms): epoch 3 ended "
    ), st.last_error
    failed_over_after = epochs.index(3, epochs.index(3) + 1) - 1
    assert epochs[failed_over_after] > 3, "several epochs ran within the window"
    assert committed(sink) == expected()
