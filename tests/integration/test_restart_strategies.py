"""Each restart strategy, on a real Spark job whose source cannot reach its input: the delays
between the epoch's attempts (measured on the driver, where each attempt plans the epoch) and
the point where the job gives up match the configuration, and the error says why."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from stator import Job, Pipeline
from stator.config import JobConfig
from stator.errors import JobFailed
from stator.sinks import CollectSink
from stator.sources.base import SplitRange
from stator.sources.generator import FromList, GeneratorSource
from tests.helpers import with_overrides


class Unreachable(GeneratorSource):
    """Plans like a list source; every read fails as a network error would (retryable), and
    says when in ``reads`` (a file: reads run in Spark's Python workers)."""

    def __init__(self, reads: Path) -> None:
        super().__init__(FromList(tuple(range(8))), count=8, splits=1)
        self.reads = str(reads)
        self.attempts: list[float] = []  # driver side: when each attempt planned the epoch

    def plan(self, positions: dict[str, Any], budget: int, now_ms: int) -> list[SplitRange]:
        self.attempts.append(time.time())
        return super().plan(positions, budget, now_ms)

    def read(self, rng: SplitRange) -> list[Any]:
        with open(self.reads, "a") as out:
            out.write(f"{time.time()}\n")
        raise ConnectionRefusedError("input unreachable (injected)")

    def delays(self) -> list[float]:
        """Per restart: from the last failed read of an attempt to the next attempt's plan,
        i.e. the strategy's delay plus the driver's own handling of the failure."""
        reads = sorted(float(t) for t in Path(self.reads).read_text().split())
        return [
            nxt - max(t for t in reads if prev <= t < nxt)
            for prev, nxt in zip(self.attempts, self.attempts[1:], strict=False)
        ]


CASES = {
    # strategy settings -> (delays between attempts in ms, the reason it gives up)
    "fixed-delay": (
        {"attempts": 2, "delay_ms": 1500},
        [1500, 1500],
        "2 restarts (fixed-delay allows 2)",
    ),
    "exponential-backoff": (
        {"attempts": 3, "delay_ms": 500, "multiplier": 4, "max_delay_ms": 6000, "jitter": 0},
        [500, 2000, 6000],
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
    spark: Any, job_config: JobConfig, strategy: str, tmp_path: Path
) -> None:
    settings, delays_ms, why = CASES[strategy]
    source = Unreachable(tmp_path / "reads")
    p = Pipeline(f"restart-{strategy}")
    p.source(source, uid="numbers").sink(CollectSink(), uid="out")
    cfg = with_overrides(job_config, restart={"strategy": strategy, **settings})
    driver = Job(p, cfg, spark)
    with pytest.raises(JobFailed) as err:
        driver.run()
    assert f"restart strategy '{strategy}' gave up ({why})" in str(err.value), err.value
    assert "ConnectionRefusedError: input unreachable (injected)" in str(err.value)
    assert driver.status.restarts == len(delays_ms)
    assert driver.status.last_error and "ConnectionRefusedError" in driver.status.last_error
    assert len(source.attempts) == len(delays_ms) + 1, "one attempt more than restarts"
    for measured, delay in zip(source.delays(), delays_ms, strict=True):
        # At least the delay; above it only by the driver's handling of the failure.
        assert delay / 1000 <= measured < delay / 1000 + 1.5, (source.delays(), delays_ms)
