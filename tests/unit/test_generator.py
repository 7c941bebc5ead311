"""The generator source's pace: a rate counts from where the job (re)started, and a burst of
records is there at once before the rate applies."""

from __future__ import annotations

from stator.sources import GeneratorSource, KeyedEvents


def ends(source: GeneratorSource, positions: dict[str, int], now_ms: int) -> dict[str, int]:
    return {r.split: r.end for r in source.plan(positions, budget=10_000, now_ms=now_ms)}


def test_a_rate_counts_from_where_the_job_restarted() -> None:
    """A job restored at position 5000 per split reads on at the rate from there, instead of
    waiting until the time it was away has passed."""
    src = GeneratorSource(KeyedEvents(10), count=100_000, splits=2, rate_per_second=100)
    restored = {"gen-0": 5000, "gen-1": 5000}
    assert ends(src, restored, now_ms=0) == {"gen-0": 5001, "gen-1": 5001}
    assert ends(src, restored, now_ms=2000) == {"gen-0": 5101, "gen-1": 5101}  # 100/s in all


def test_a_burst_comes_at_once_then_the_rate_applies() -> None:
    src = GeneratorSource(KeyedEvents(10), count=100_000, splits=2, rate_per_second=10, burst=600)
    start = {"gen-0": 0, "gen-1": 0}
    assert ends(src, start, now_ms=0) == {"gen-0": 300, "gen-1": 300}
    # Past the burst, the rate counts from the start position (the burst is by index).
    at = {"gen-0": 300, "gen-1": 300}
    assert ends(src, at, now_ms=1000) == {}  # nothing new yet: the rate is behind the burst
    assert ends(src, at, now_ms=60_000) == {"gen-0": 301, "gen-1": 301}
    late = GeneratorSource(KeyedEvents(10), count=100_000, splits=2, rate_per_second=10, burst=6)
    assert ends(late, start, now_ms=0)["gen-0"] == 3
    assert ends(late, start, now_ms=10_000)["gen-0"] == 51
