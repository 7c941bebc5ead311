"""Failover per source split (``driver/split_failover.py``) with a fake clock: a failed split
waits out its own restart delay while the others are planned, its strategy gives up on its
own count, and a failure no restart can fix ends the job at once."""

from __future__ import annotations

import pytest

from stator.api.pipeline import Pipeline
from stator.config import EpochConfig, RestartConfig
from stator.driver.planning import EpochPlanner
from stator.driver.split_failover import SplitFailover, SplitRegionFailed
from stator.epoch.reports import SplitFailure, SplitReport
from stator.sinks import CollectSink
from stator.sources.generator import list_source
from stator.tasks.user_errors import USER_ERROR_MARKER


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def failure(split: str, error: str = "ConnectionResetError: reset") -> SplitFailure:
    """As a source task's last attempt reports it (``tasks/source.py``)."""
    return SplitFailure("in", split, 3, error)


def test_a_failed_split_waits_out_its_own_delay_and_gives_up_on_its_own_count() -> None:
    clock = Clock()
    sf = SplitFailover("job 'j'", RestartConfig("fixed-delay", attempts=2, delay_ms=1500), clock)
    sf.failed([failure("gen-1")])
    assert sf.paused() == {("in", "gen-1")}
    clock.now += 1.0
    assert sf.paused() == {("in", "gen-1")}
    clock.now += 0.6
    assert sf.paused() == set()
    sf.failed([failure("gen-0")])  # another split: a count of its own
    sf.failed([failure("gen-1")])
    assert sf.paused() == {("in", "gen-0"), ("in", "gen-1")}
    with pytest.raises(SplitRegionFailed, match=r"split gen-1 failed and the restart strategy"):
        sf.failed([failure("gen-1")])
    assert sf.last_error == "ConnectionResetError: reset"
    states = {s["split"]: (s["restarts"], s["state"]) for s in sf.to_json()}
    assert states == {"gen-0": (1, "RESTARTING"), "gen-1": (2, "RESTARTING")}


def test_a_user_function_that_raised_on_every_attempt_ends_the_job_at_once() -> None:
    sf = SplitFailover("job 'j'", RestartConfig("fixed-delay", attempts=5), Clock())
    user = (
        f"UserFunctionError: {USER_ERROR_MARKER}: KeyError: 'price' in operator 'in'\n"
        f"(the task failed 4 times)"
    )
    with pytest.raises(SplitRegionFailed, match="raised on all 4 attempts of its task"):
        sf.failed([failure("gen-0", user)])


def test_paused_splits_are_not_planned() -> None:
    p = Pipeline("plan")
    p.source(list_source(list(range(9)), splits=3), uid="in").sink(CollectSink(), uid="out")
    planner = EpochPlanner({"in": p.nodes[0]}, EpochConfig())  # type: ignore[dict-item]
    planner.rewind(None)
    plan = planner.plan(frozenset({("in", "gen-1")}))
    assert plan is not None and [r.split for r in plan["in"]] == ["gen-0", "gen-2"]
    assert planner.plan(frozenset({("in", s) for s in ("gen-0", "gen-1", "gen-2")})) is None
    sf = SplitFailover("job 'j'", RestartConfig(), Clock())
    sf.failed([failure("gen-1")])
    sf.read([SplitReport("in", "gen-1", 4, 0, 3)])
    assert sf.splits[("in", "gen-1")].failure is None, "read again: not the same failure"
