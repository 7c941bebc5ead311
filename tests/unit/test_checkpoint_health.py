"""Checkpoint health (``driver/checkpoint_health.py``): more failed checkpoints in a row than
``checkpoint.tolerable_failures``, or an epoch's output waiting longer than
``checkpoint.progress_window_ms`` for a checkpoint, fails the job over; readiness says so. The
rules on a fake clock, then through the driver's real loop with a fake Spark job
(``epoch_fakes``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stator import JobState
from stator.config import CheckpointConfig, load_config
from stator.control.answers import checkpoint_health, readiness
from stator.driver import epoch_loop
from stator.driver.checkpoint_health import CheckpointHealth, HealthReport, merge_reports
from stator.driver.failures import Kind, classify
from stator.driver.status import JobStatus
from stator.errors import CheckpointsUnhealthy, ConfigError
from tests.unit.epoch_fakes import build, fake_job


class Clock:
    def __init__(self) -> None:
        self.s = 1000.0

    def __call__(self) -> float:
        return self.s


def health(clock: Clock | None = None, **cfg: Any) -> CheckpointHealth:
    return CheckpointHealth(CheckpointConfig(**cfg), clock or Clock())


# ---------------------------------------------------------------------------- counting


def test_more_failures_in_a_row_than_tolerable_is_a_problem_naming_the_last_cause() -> None:
    h = health(tolerable_failures=2)
    for n in (1, 2):
        h.failed(f"cause {n}")
        assert h.problem() is None, f"{n} failures are tolerable"
        h.check()  # does not raise
    h.failed("StorageError: bucket unreachable")
    assert h.problem() == (
        "3 consecutive checkpoints failed (checkpoint.tolerable_failures is 2): "
        "StorageError: bucket unreachable"
    )
    with pytest.raises(CheckpointsUnhealthy) as raised:
        h.check()
    report = h.report()
    assert str(raised.value) == report.last_failover
    assert (report.failovers, report.consecutive_failures, report.healthy) == (1, 0, True), (
        "the verdict is spent: the failover acts on it"
    )
    assert report.last_failover_ms is not None


def test_a_completed_checkpoint_and_a_restart_start_the_count_over() -> None:
    h = health(tolerable_failures=1)
    h.failed("a")
    h.completed(5)
    h.failed("b")
    assert h.problem() is None, "not in a row: a checkpoint completed between them"
    h.failed("c")
    assert h.problem() is not None
    h.restarted()
    assert h.problem() is None and h.report().consecutive_failures == 0
    h.failed("d")
    assert h.problem() is None, "a fresh allowance after the failover"


def test_checkpoints_aborted_by_a_failover_do_not_count() -> None:
    h = health(tolerable_failures=0)
    h.failed("the job fails over: lost executor", counted=False)
    assert h.problem() is None and h.report().consecutive_failures == 0
    h.failed("upload timed out")
    assert h.problem() is not None, "0 tolerates none"


def test_minus_one_tolerates_any_number() -> None:
    h = health(tolerable_failures=-1)
    for _ in range(1000):
        h.failed("x")
    assert h.problem() is None
    assert h.report().tolerable_failures == -1
    assert checkpoint_health(h.report()).tolerable_failures is None, "on the wire: no limit"


# ---------------------------------------------------------------------------- the window


def test_the_window_runs_from_the_end_of_the_oldest_epoch_no_checkpoint_covers() -> None:
    clock = Clock()
    h = health(clock, progress_window_ms=10_000, tolerable_failures=-1)
    h.epoch_ended(1, took_checkpoint=True)
    clock.s += 4
    h.epoch_ended(2, took_checkpoint=False)  # epoch 1's checkpoint still in flight
    clock.s += 4
    h.completed(1)  # covers epoch 1; epoch 2 (ended 4 s ago) waits on
    assert h.report().waiting_ms == 4000
    clock.s += 6
    assert h.problem() is None, "10 s exactly is within the window"
    h.failed("upload failed")
    clock.s += 0.5
    assert h.problem() == (
        "no checkpoint completed in 10 s (checkpoint.progress_window_ms): epoch 2 ended 10.5 s "
        "ago and no completed checkpoint covers it; the last failed: upload failed"
    )
    h.completed(2)
    assert h.problem() is None and h.report().waiting_ms == 0


def test_an_idle_job_with_nothing_waiting_stays_healthy_however_long() -> None:
    clock = Clock()
    h = health(clock, progress_window_ms=1000)
    h.epoch_ended(1, took_checkpoint=True)
    h.completed(1)
    clock.s += 3600  # no input: no epoch runs, nothing waits for a checkpoint
    assert h.problem() is None and h.report().healthy


def test_epochs_between_checkpoints_wait_from_the_first_of_them() -> None:
    """``every_epochs``: the epochs after a checkpoint wait for the next; the oldest counts."""
    clock = Clock()
    h = health(clock, progress_window_ms=5000, every_epochs=3)
    for epoch in range(1, 7):
        h.epoch_ended(epoch, took_checkpoint=epoch % 3 == 0)
        clock.s += 1
    h.completed(3)  # epochs 4-6 wait, from epoch 4's end (3 s ago)
    assert h.report().waiting_ms == 3000
    clock.s += 2.5
    assert h.problem() is not None and "epoch 4 ended" in (h.problem() or "")


def test_a_restart_forgets_the_epochs_it_will_replay() -> None:
    clock = Clock()
    h = health(clock, progress_window_ms=1000)
    h.epoch_ended(1, took_checkpoint=True)
    clock.s += 5
    assert h.problem() is not None
    h.restarted()
    assert h.problem() is None and h.report().waiting_ms == 0


def test_the_window_is_off_without_checkpoints_or_at_zero() -> None:
    clock = Clock()
    for h in (health(clock), health(clock, enabled=False, progress_window_ms=0)):
        h.epoch_ended(1, took_checkpoint=False)
        clock.s += 10_000
        assert h.problem() is None and h.report().waiting_ms == 0


def test_regions_merge_into_one_verdict_naming_the_region() -> None:
    ok = HealthReport(tolerable_failures=3, consecutive_failures=1, failovers=1)
    bad = HealthReport(
        tolerable_failures=3,
        consecutive_failures=4,
        failovers=2,
        last_failover="4 consecutive checkpoints failed",
        last_failover_ms=5,
        problem="4 consecutive checkpoints failed",
    )
    merged = merge_reports({"a": ok, "b": bad})
    assert merged.problem == "region 'b': 4 consecutive checkpoints failed"
    assert (merged.consecutive_failures, merged.failovers) == (4, 3)
    assert merged.last_failover == "region 'b': 4 consecutive checkpoints failed"
    assert merge_reports({"a": ok}).healthy and merge_reports({}).healthy


# ---------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["checkpoint.tolerable_failures=-2"], "0 or more, or -1 for no limit, got -2"),
        (["checkpoint.progress_window_ms=-1"], "must be >= 0 (0: off), got -1"),
        (
            ["checkpoint.progress_window_ms=30000", "checkpoint.interval_ms=60000"],
            "checkpoint.progress_window_ms (30000) must exceed checkpoint.interval_ms (60000)",
        ),
        (
            ["checkpoint.progress_window_ms=5000", "checkpoint.min_pause_ms=5000"],
            "checkpoint.progress_window_ms (5000) must exceed checkpoint.min_pause_ms (5000)",
        ),
        (
            ["checkpoint.progress_window_ms=5000", "checkpoint.enabled=false"],
            "checkpoint.enabled is false: enable checkpoints or set the window to 0",
        ),
        (["checkpoint.tolerable-failure=1"], "did you mean 'checkpoint.tolerable_failures'?"),
        (["checkpoint.progress_window=1"], "did you mean 'checkpoint.progress_window_ms'?"),
        (["checkpoint.tolerable_failures=two"], "must be an integer"),
    ],
)
def test_health_keys_are_validated_naming_the_keys(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert message in str(err.value)


def test_health_defaults_and_values() -> None:
    ck = load_config(None, []).checkpoint
    assert (ck.tolerable_failures, ck.progress_window_ms) == (3, 0)
    ck = load_config(
        None,
        [
            "checkpoint.tolerable_failures=-1",
            "checkpoint.interval_ms=60000",
            "checkpoint.progress_window_ms=180000",
        ],
    ).checkpoint
    assert (ck.tolerable_failures, ck.progress_window_ms) == (-1, 180_000)


# ---------------------------------------------------------------------------- the answers


def test_the_failover_reason_is_the_jobs_error_word_for_word() -> None:
    """Not cut to the quoted cause (``short_error`` picks a StorageError out of a text)."""
    text = "3 consecutive checkpoints failed (checkpoint.tolerable_failures is 2): StorageError: x"
    failure = classify(CheckpointsUnhealthy(text), None, None)
    assert (failure.kind, failure.summary) == (Kind.RETRY, text)


def test_ready_while_processing_and_checkpointing() -> None:
    st = JobStatus("job", state=JobState.RUNNING)
    assert readiness(st).ready and readiness(st).reason is None
    st.checkpoint_health = lambda: HealthReport(problem="no checkpoint completed in 60 s")
    answer = readiness(st)
    assert (answer.ready, answer.reason) == (False, "no checkpoint completed in 60 s")
    st.checkpoint_health = HealthReport
    st.restarting, st.last_error = True, "lost executor 2"
    assert readiness(st).reason == "the job is restarting after a failure: lost executor 2"
    for state in (JobState.RECOVERING, JobState.FINISHED, JobState.STANDBY):
        answer = readiness(JobStatus("job", state=state))
        assert (answer.ready, answer.reason) == (False, f"the job is {state}")


# ---------------------------------------------------------------------------- the loop


def test_the_loop_fails_over_after_exactly_tolerable_plus_one_failures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Epochs 3-5 fail their checkpoints (first attempts): with 2 tolerable, the third fails
    the job over before epoch 6, to epoch 2's checkpoint; the replay checkpoints again and
    every epoch's output is committed once the job ends."""
    job, sink = build(
        tmp_path, 20, "checkpoint.async_upload=false", "checkpoint.tolerable_failures=2"
    )
    ran: list[int] = []

    def behaviour(spec: Any) -> dict[str, Any]:
        first = spec.epoch not in ran
        ran.append(spec.epoch)
        if first and 3 <= spec.epoch <= 5:
            return {"checkpoint_error": f"StorageError: refused epoch {spec.epoch}"}
        return {}

    monkeypatch.setattr(epoch_loop, "run_epoch_job", fake_job(job, behaviour))
    job.recovery.start(None)
    job._loop()
    assert ran[:6] == [1, 2, 3, 4, 5, 3], "failed over after epoch 5, back to epoch 3"
    assert job.status.restarts == 1
    assert job.status.last_error == (
        "3 consecutive checkpoints failed (checkpoint.tolerable_failures is 2): "
        "StorageError: refused epoch 5"
    )
    report = job.status.checkpoint_health()
    assert (report.failovers, report.healthy) == (1, True), "healthy again after the replay"
    assert report.last_failover == job.status.last_error
    assert job.status.state is JobState.FINISHED
    assert sorted(set(sink.commits)) == list(range(1, 11))


def test_the_loop_fails_over_when_no_checkpoint_completes_in_the_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Epochs 3-8 fail their checkpoints (first attempts), failures tolerated
    without limit; each epoch takes 100 ms of a fake clock: epoch 3's output waits more than
    the 450 ms window after epoch 8, and the job fails over to epoch 2's checkpoint."""
    job, sink = build(
        tmp_path,
        40,
        "checkpoint.async_upload=false",
        "checkpoint.tolerable_failures=-1",
        "checkpoint.progress_window_ms=450",
    )
    clock = Clock()
    job.checkpoints.health.clock = clock
    ran: list[int] = []

    def behaviour(spec: Any) -> dict[str, Any]:
        clock.s += 0.1
        first = spec.epoch not in ran
        ran.append(spec.epoch)
        if first and 3 <= spec.epoch <= 8:
            return {"checkpoint_error": "upload refused"}
        return {}

    monkeypatch.setattr(epoch_loop, "run_epoch_job", fake_job(job, behaviour))
    job.recovery.start(None)
    job._loop()
    assert ran[:9] == [1, 2, 3, 4, 5, 6, 7, 8, 3], "failed over after epoch 8"
    assert job.status.restarts == 1
    assert job.status.last_error == (
        "no checkpoint completed in 0.45 s (checkpoint.progress_window_ms): epoch 3 ended 0.5 s "
        "ago and no completed checkpoint covers it; the last failed: upload refused"
    )
    assert job.status.state is JobState.FINISHED
    assert sorted(set(sink.commits)) == list(range(1, 21))
