"""When an epoch takes a checkpoint: Flink's interval (between triggers) and minimum pause
(from the end of one checkpoint to the next trigger, one at a time), on a fake clock."""

from __future__ import annotations

import pytest

from stator.config import CheckpointConfig
from stator.driver import planning
from stator.driver.planning import CheckpointSchedule


class Clock:
    def __init__(self) -> None:
        self.ms = 1_000_000

    def __call__(self) -> int:
        return self.ms


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(planning, "now_ms", c)
    return c


def _epochs(schedule: CheckpointSchedule, clock: Clock, n: int, step_ms: int) -> list[int]:
    """Run ``n`` epochs of ``step_ms`` each, every checkpoint completing within its epoch;
    the epochs (1-based) that took one."""
    took = []
    for epoch in range(1, n + 1):
        if schedule.due(last_epoch=False):
            schedule.triggered()
            took.append(epoch)
            clock.ms += step_ms
            schedule.checkpoint_done()
        else:
            clock.ms += step_ms
        schedule.epoch_done()
    return took


def test_every_n_epochs(clock: Clock) -> None:
    schedule = CheckpointSchedule(CheckpointConfig(every_epochs=3))
    assert _epochs(schedule, clock, 9, 100) == [3, 6, 9]


def test_interval_counts_from_the_previous_trigger(clock: Clock) -> None:
    schedule = CheckpointSchedule(CheckpointConfig(interval_ms=1000))
    assert _epochs(schedule, clock, 10, 300) == [1, 5, 9]


def test_interval_checkpoints_do_not_follow_each_other_while_one_is_in_flight(
    clock: Clock,
) -> None:
    """A trigger starts the interval: an upload still running does not make every later
    epoch a checkpoint (it did: the timer moved only when a checkpoint completed)."""
    schedule = CheckpointSchedule(CheckpointConfig(interval_ms=1000))
    assert schedule.due(False, in_flight=0)
    schedule.triggered()
    for _ in range(3):
        clock.ms += 300
        assert not schedule.due(False, in_flight=1)
    clock.ms += 100
    assert schedule.due(False, in_flight=1)


def test_min_pause_counts_from_the_end_and_allows_one_at_a_time(clock: Clock) -> None:
    schedule = CheckpointSchedule(CheckpointConfig(every_epochs=1, min_pause_ms=500))
    assert schedule.due(False)
    schedule.triggered()
    schedule.epoch_done()
    clock.ms += 2000
    assert not schedule.due(False, in_flight=1), "one at a time while a pause is set"
    schedule.checkpoint_done()
    clock.ms += 499
    assert not schedule.due(False)
    clock.ms += 1
    assert schedule.due(False)


def test_min_pause_spaces_checkpoints_that_take_long(clock: Clock) -> None:
    schedule = CheckpointSchedule(CheckpointConfig(interval_ms=100, min_pause_ms=1000))
    assert _epochs(schedule, clock, 12, 200) == [1, 7]


def test_the_last_epoch_and_a_failure(clock: Clock) -> None:
    schedule = CheckpointSchedule(CheckpointConfig(every_epochs=5, min_pause_ms=10_000))
    assert schedule.due(last_epoch=True, in_flight=2), "the last epoch always commits"
    schedule.triggered()
    schedule.epoch_done()
    schedule.checkpoint_failed()
    assert not schedule.due(False), "a failure ends a checkpoint: the pause applies"
    clock.ms += 10_000
    assert schedule.due(False), "after a failure the next epoch tries again"
    assert not CheckpointSchedule(CheckpointConfig(enabled=False)).due(True)
