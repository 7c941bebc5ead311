"""Restart strategies: the delays and the give-up point each configuration promises."""

from __future__ import annotations

import pytest

from stator.config import RestartConfig, load_config
from stator.driver.restart import History, RestartStrategy, decide
from stator.errors import ConfigError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def delays(strategy: RestartStrategy, clock: Clock, gaps: list[float]) -> list[int | None]:
    """Failures ``gaps`` seconds apart; the strategy's answer to each."""
    out = []
    for gap in gaps:
        clock.now += gap
        out.append(strategy.next_delay_ms())
    return out


def test_fixed_delay_restarts_attempts_times_then_gives_up() -> None:
    clock = Clock()
    s = RestartStrategy(RestartConfig("fixed-delay", attempts=3, delay_ms=250), clock)
    assert delays(s, clock, [1, 1, 1000, 1]) == [250, 250, 250, None]
    assert "3 restarts (fixed-delay allows 3)" in s.why


def test_none_never_restarts() -> None:
    assert RestartStrategy(RestartConfig("none")).next_delay_ms() is None


def test_exponential_backoff_grows_caps_and_stops_at_its_ceiling() -> None:
    clock = Clock()
    cfg = RestartConfig(
        "exponential-backoff", attempts=6, delay_ms=100, max_delay_ms=1000, multiplier=3, jitter=0
    )
    s = RestartStrategy(cfg, clock)
    assert delays(s, clock, [1] * 7) == [100, 300, 900, 1000, 1000, 1000, None]
    assert "exponential-backoff allows 6" in s.why


def test_exponential_backoff_starts_over_after_a_stable_period() -> None:
    clock = Clock()
    cfg = RestartConfig(
        "exponential-backoff", attempts=2, delay_ms=100, multiplier=2, jitter=0, reset_after_ms=5000
    )
    s = RestartStrategy(cfg, clock)
    # Two quick failures use the budget; 5 s of stable running (> reset_after) restores it.
    assert delays(s, clock, [1, 1, 6, 1, 1]) == [100, 200, 100, 200, None]


@pytest.mark.parametrize("draw", [0.0, 0.5, 1.0])
def test_jitter_spreads_each_delay_within_its_fraction(draw: float) -> None:
    cfg = RestartConfig("exponential-backoff", attempts=9, delay_ms=1000, jitter=0.2)
    expected = {0.0: 800, 0.5: 1000, 1.0: 1200}[draw]
    first = decide(cfg, History(), 0.0, lambda: draw)
    assert first.delay_ms == expected
    assert first.history.backoff_ms == 2000, "the un-jittered delay doubles"


def test_jitter_never_exceeds_the_maximum_delay() -> None:
    cfg = RestartConfig(
        "exponential-backoff", attempts=9, delay_ms=1000, max_delay_ms=1000, jitter=0.5
    )
    assert decide(cfg, History(), 0.0, lambda: 1.0).delay_ms == 1000


def test_failure_rate_counts_failures_in_the_sliding_interval() -> None:
    clock = Clock()
    cfg = RestartConfig("failure-rate", attempts=2, delay_ms=50, interval_ms=10_000)
    s = RestartStrategy(cfg, clock)
    # 3 failures within 10 s give up; spaced by 6 s, at most 2 fall in any window.
    assert delays(s, clock, [1, 6, 6, 6, 1]) == [50, 50, 50, 50, None]
    assert "3 failures within 10000 ms (failure-rate allows 2)" in s.why


def test_history_round_trips_through_json() -> None:
    h = History(count=2, backoff_ms=400, failures=(1.5, 2.5), last_failure=2.5)
    assert History.from_json(h.to_json()) == h
    assert History.from_json(None) == History()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("restart.jitter=1.5", "restart.jitter is a fraction of the delay: 0 to 1"),
        ("restart.multiplier=0.5", "restart.multiplier must be >= 1"),
        ("restart.delay_ms=-1", "restart.delay_ms must be >= 0"),
        ("restart.max_delay_ms=10", "restart.max_delay_ms (10) is below restart.delay_ms"),
        ("restart.reset_after_ms=0", "restart.reset_after_ms must be >= 1 with exponential"),
        ("restart.interval_ms=-5", "restart.interval_ms must be >= 0"),
    ],
)
def test_bad_restart_settings_name_the_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(None, ["restart.strategy=exponential-backoff", override])


def test_a_strategy_with_one_delay_takes_any_delay() -> None:
    # max_delay_ms and reset_after_ms are exponential-backoff's: a long fixed delay (or a
    # failure-rate one) is not refused for being above the backoff's ceiling.
    for strategy in ("fixed-delay", "failure-rate"):
        cfg = load_config(None, [f"restart.strategy={strategy}", "restart.delay_ms=120000"])
        assert cfg.restart.delay_ms == 120_000
