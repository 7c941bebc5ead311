"""The benchmarks' own checks: a run counts only if its result matches an independent
computation, so that computation and the comparison must themselves be right."""

from __future__ import annotations

from collections import Counter

import pytest

from bench.cases import check_counts, expected_counts
from bench.harness import Comparison, Runs, WrongOutput
from stator.sources import KeyedEvents


def test_the_vectorized_expectation_matches_the_generator_record_for_record() -> None:
    events, keys = 50_000, 1_234
    generated = Counter(key for key, _, _ in KeyedEvents(keys, seed=1).make(0, events, 1))
    assert expected_counts(events, keys) == dict(generated)
    assert sum(expected_counts(events, keys).values()) == events


def test_a_wrong_missing_or_extra_count_fails_the_run() -> None:
    good = expected_counts(10_000, 100)
    check_counts("exact", dict(good), 10_000, 100)
    off_by_one = {**good, "k7": good["k7"] + 1}
    missing = {k: v for k, v in good.items() if k != "k3"}
    extra = {**good, "k100": 1}
    for wrong in (off_by_one, missing, extra):
        with pytest.raises(WrongOutput, match=r"first wrong|extra"):
            check_counts("wrong", wrong, 10_000, 100)


def test_ratios_favour_stator_above_one_for_rates_and_for_times() -> None:
    fast = Runs("stator", "events/s", (90.0, 100.0, 300.0))
    slow = Runs("peer", "events/s", (10.0, 50.0, 60.0))
    assert Comparison("rate", fast, slow).ratio == pytest.approx(2.0)  # medians 100 / 50
    quick = Runs("stator", "s", (1.0, 2.0, 9.0))
    long = Runs("peer", "s", (8.0, 10.0, 11.0))
    assert Comparison("time", quick, long, higher_is_better=False).ratio == pytest.approx(5.0)


def test_kafka_keys_follow_the_generators_formula() -> None:
    from bench.kafka import _key

    generated = [key for key, _, _ in KeyedEvents(321, seed=1).make(0, 5_000, 1)]
    assert [_key(i, 321).decode() for i in range(5_000)] == generated


def test_a_records_latency_ends_at_the_first_output_that_covers_it() -> None:
    from bench.kafka import latencies

    # key a: records at 1000, 1100, 1200 ms; outputs count 2 at 1500, count 3 at 2000.
    inputs = [(0, b"a", b"", 1000), (0, b"a", b"", 1100), (1, b"b", b"", 1050)]
    inputs.append((0, b"a", b"", 1200))
    seen = {"a": [(1500, 2), (2000, 3)], "b": [(1300, 1)]}
    assert latencies(inputs, seen, 0).tolist() == [500, 250, 400, 800]  # in broker time order
    assert latencies(inputs, seen, 1060).tolist() == [400, 800]  # after the warm-up only
    with pytest.raises(WrongOutput, match="key a: 3 records in, outputs covered 2"):
        latencies(inputs, {**seen, "a": [(1500, 2)]}, 0)
