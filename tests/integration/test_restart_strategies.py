"""Each restart strategy, on a real Spark job whose source cannot reach its input: the delays
between the epoch's attempts (measured on the driver, where each attempt plans the epoch) and
the point where the job gives up match the configuration, and the error says why."""

from __future__ import annotations

import time
from typing import Any

import pytest

from stator import Pipeline
from stator.config import JobConfig
from stator.driver.epoch_loop import JobDriver
from stator.errors import JobFailed
from stator.sinks import CollectSink
from stator.sources.base import SplitRange
from stator.sources.generator import FromList, GeneratorSource
from tests.helpers import with_overrides


class Unreachable(GeneratorSource):
    """Plans like a list source; every read fails as a network error would (retryable)."""

    def __init__(self) -> None:
        super().__init__(FromList(tuple(range(8))), count=8, splits=1)
        self.attempts: list[float] = []  # driver side: when each attempt planned the epoch

    def plan(self, positions: dict[str, Any], budget: int, now_ms: int) -> list[SplitRange]:
        self.attempts.append(time.monotonic())
        return super().plan(positions, budget, now_ms)

    def read(self, rng: SplitRange) -> list[Any]:
        raise ConnectionRefusedError("input unreachable (injected)")


CASES = {
    # strategy settings -> (delays between attempts in ms, the reason it gives up)
    "fixed-delay": (
        {"attempts": 2, "delay_ms": 1500},
        [1500, 1500],
        "2 restarts (fixed-delay allows 2)",
    ),
    "exponential-backoff": (
        {"attempts": 3, "delay_ms": 400, "multiplier": 3, "max_delay_ms": 2000, "jitter": 0},
        [400, 1200, 2000],
        "3 restarts without 600000 ms of stable running (exponential-backoff allows 3)",
    ),
    "failure-rate": (
        {"attempts": 2, "delay_ms": 800, "interval_ms": 60_000},
        [800, 800],
        "3 failures within 60000 ms (failure-rate allows 2)",
    ),
    "none": ({}, [], "restart strategy 'none' never restarts"),
}


@pytest.mark.parametrize("strategy", list(CASES))
def test_delays_and_give_up_point_match_the_strategy(
    spark: Any, job_config: JobConfig, strategy: str
) -> None:
    settings, delays_ms, why = CASES[strategy]
    source = Unreachable()
    p = Pipeline(f"restart-{strategy}")
    p.source(source, uid="numbers").sink(CollectSink(), uid="out")
    cfg = with_overrides(job_config, restart={"strategy": strategy, **settings})
    driver = JobDriver(p, cfg, spark)
    with pytest.raises(JobFailed) as err:
        driver.run()
    assert f"restart strategy '{strategy}' gave up ({why})" in str(err.value), err.value
    assert "ConnectionRefusedError: input unreachable (injected)" in str(err.value)
    assert driver.status.restarts == len(delays_ms)
    assert driver.status.last_error and "ConnectionRefusedError" in driver.status.last_error
    assert len(source.attempts) == len(delays_ms) + 1, "one attempt more than restarts"
    gaps = [b - a for a, b in zip(source.attempts, source.attempts[1:], strict=False)]
    for gap, delay in zip(gaps, delays_ms, strict=True):
        # At least the delay; above it only by the failed attempt itself (Spark's task
        # retries on a 2-core machine shared with the test bed).
        assert delay / 1000 <= gap < delay / 1000 + 10, (gaps, delays_ms)
    # The delays grow where the strategy says they do, not by the attempt's own cost.
    if strategy == "exponential-backoff":
        assert gaps[1] - gaps[0] > 0.5 and gaps[2] - gaps[1] > 0.5, gaps
