"""A bounded job ends only with its output committed: a failed last checkpoint is taken
again (the job fails over and replays), under the restart strategy. The driver's loop with
a fake Spark job (``epoch_fakes``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stator import JobState
from stator.driver import epoch_loop
from stator.errors import JobFailed
from tests.unit.epoch_fakes import build, fake_job


def test_a_failed_last_checkpoint_is_taken_again_before_the_job_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job, sink = build(tmp_path, 6, "checkpoint.async_upload=false")  # epochs 1-3
    failed: list[int] = []

    def behaviour(spec: object) -> dict[str, object]:
        if getattr(spec, "epoch", 0) == 3 and not failed:
            failed.append(3)
            return {"checkpoint_error": "StorageError: MinIO unreachable"}
        return {}

    monkeypatch.setattr(epoch_loop, "run_epoch_job", fake_job(job, behaviour))
    job.recovery.start(None)
    job._loop()
    assert job.status.state is JobState.FINISHED
    assert sorted(set(sink.commits)) == [1, 2, 3], "epoch 3's output is committed"
    assert not any(job.output.pending.values())
    assert job.status.restarts == 1


def test_a_last_checkpoint_that_keeps_failing_fails_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job, sink = build(tmp_path, 6, "checkpoint.async_upload=false", "restart.attempts=2")

    def behaviour(spec: object) -> dict[str, object]:
        if getattr(spec, "epoch", 0) == 3:
            return {"checkpoint_error": "StorageError: MinIO unreachable"}
        return {}

    monkeypatch.setattr(epoch_loop, "run_epoch_job", fake_job(job, behaviour))
    job.recovery.start(None)
    with pytest.raises(JobFailed, match="the output of epochs 3-3 is not committed"):
        job._loop()
    assert 3 not in sink.commits
