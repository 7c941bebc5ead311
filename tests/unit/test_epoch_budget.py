"""``epoch.max_ms``: the planner reads what the job processes in that long, so a backlog is
taken in epochs of about that duration (``driver/epoch_budget.py``)."""

from __future__ import annotations

from stator import Pipeline
from stator.config import EpochConfig
from stator.driver.epoch_budget import FIRST_EPOCH, MIN_EPOCH, EpochBudget
from stator.driver.planning import EpochPlanner
from stator.sinks import CollectSink
from stator.sources import GeneratorSource


def _epoch_s(records: int, fixed_s: float = 0.1, per_record_s: float = 1e-5) -> float:
    """An epoch's wall time: a fixed cost and a cost per record."""
    return fixed_s + records * per_record_s


def test_without_max_ms_the_budget_is_max_records() -> None:
    budget = EpochBudget(200_000)
    budget.observe(5_000, 0.5)
    assert budget.records() == 200_000


def _run_backlog(budget: EpochBudget, epochs: int, fixed_s: float = 0.1) -> list[float]:
    """A backlog: every epoch reads its whole budget; returns the epochs' durations."""
    took = []
    for _ in range(epochs):
        n = budget.records()
        took.append(_epoch_s(n, fixed_s))
        budget.observe(n, took[-1])
    return took


def test_a_backlog_is_read_in_epochs_of_max_ms() -> None:
    budget = EpochBudget(200_000, max_ms=300)
    assert budget.records() == FIRST_EPOCH
    budget.observe(10, _epoch_s(10))  # a quiet epoch first: it measures the fixed cost
    took = _run_backlog(budget, 10)
    # F = 0.1 s, c = 10 us: (0.3 - 0.1) / 1e-5 = 20,000 records, an epoch of 0.3 s.
    assert abs(budget.records() - 20_000) < 500
    assert all(abs(t - 0.3) < 0.01 for t in took[1:])


def test_a_max_ms_below_the_fixed_cost_still_keeps_up() -> None:
    """max_ms 50 ms with a fixed cost of 100 ms: epochs get as long for their records as
    their fixed cost, 2 F, so the job still reads half the records per second it could."""
    budget = EpochBudget(200_000, max_ms=50)
    budget.observe(10, _epoch_s(10))
    took = _run_backlog(budget, 10)
    assert abs(budget.records() - 10_000) < 500
    rate = budget.records() / took[-1]
    assert rate > 0.5 * (1 / 1e-5)  # half of the 100,000 records/s without a fixed cost


def test_the_budget_stays_within_max_records_and_probes_until_it_measured() -> None:
    capped = EpochBudget(3_000, max_ms=1_000)
    capped.observe(100, 0.1)
    capped.observe(50_000, 0.2)
    assert capped.records() == 3_000
    flat = EpochBudget(200_000, max_ms=100)
    flat.observe(1_000, 0.1)  # one epoch: its duration is the fixed cost, nothing per record
    assert flat.records() == FIRST_EPOCH


def test_empty_epochs_say_nothing_and_a_rewind_measures_again() -> None:
    budget = EpochBudget(200_000, max_ms=200)
    budget.observe(0, 0.3)
    assert budget.records() == FIRST_EPOCH
    budget.observe(10, _epoch_s(10))
    budget.observe(5_000, _epoch_s(5_000))
    assert abs(budget.records() - 10_000) < 100  # (0.2 - 0.1) s / 10 us
    budget.reset()
    assert budget.records() == FIRST_EPOCH


def test_an_epoch_that_reads_anything_may_read_at_least_min_epoch() -> None:
    slow = EpochBudget(200_000, max_ms=10)
    slow.observe(10, 0.1)
    slow.observe(1_000, 10.1)  # 10 ms a record: 10 records in the fixed cost's 100 ms
    assert slow.records() == MIN_EPOCH


def test_the_planner_reads_the_budget_across_splits() -> None:
    p = Pipeline("budget")
    p.source(GeneratorSource(count=1_000_000, splits=2), uid="in").sink(CollectSink(), uid="o")
    planner = EpochPlanner({"in": p.nodes[0]}, EpochConfig(max_ms=150))  # type: ignore[dict-item]
    planner.rewind(None)
    plan = planner.plan()
    assert plan is not None
    assert sum(r.end - r.start for r in plan["in"]) == FIRST_EPOCH
    planner.budget.observe(1_000, 0.06)  # F = 60 ms
    planner.budget.observe(FIRST_EPOCH, 0.16)  # c = 10 us: (150 - 60) ms / 10 us = 9,000
    plan = planner.plan()
    assert plan is not None and abs(sum(r.end - r.start for r in plan["in"]) - 9_000) <= 2
