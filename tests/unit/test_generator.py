"""The generator source's pace: a rate counts from where the job (re)started, and a burst of
records is there at once, and the rate adds to it."""

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


def test_a_burst_comes_at_once_and_the_rate_adds_to_it() -> None:
    src = GeneratorSource(KeyedEvents(10), count=100_000, splits=2, rate_per_second=10, burst=600)
    start = {"gen-0": 0, "gen-1": 0}
    assert ends(src, start, now_ms=0) == {"gen-0": 301, "gen-1": 301}  # the burst, and 1
    at = {"gen-0": 301, "gen-1": 301}
    assert ends(src, at, now_ms=1000) == {"gen-0": 306, "gen-1": 306}  # 10/s in all
    assert ends(src, at, now_ms=60_000) == {"gen-0": 601, "gen-1": 601}
    # Restored past the burst: the rate counts from the restored position only.
    again = GeneratorSource(KeyedEvents(10), count=100_000, splits=2, rate_per_second=10, burst=600)
    assert ends(again, {"gen-0": 700, "gen-1": 700}, now_ms=0) == {"gen-0": 701, "gen-1": 701}
