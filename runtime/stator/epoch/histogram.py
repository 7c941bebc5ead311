"""Duration histograms with fixed buckets: filled per batch in a task, merged by adding at the
driver (reports travel through the epoch's accumulator), exposed as Prometheus histograms.

One set of bounds serves every duration (epochs, processing and committed latency): merging
needs equal bounds, and a dashboard compares them bucket by bucket.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

# Upper bounds of the buckets, in ms (a value equal to a bound falls in its bucket, as
# Prometheus' ``le``); one more bucket holds what is above the last bound.
BOUNDS_MS: tuple[int, ...] = (
    1,
    5,
    10,
    25,
    50,
    100,
    250,
    500,
    1_000,
    2_500,
    5_000,
    10_000,
    30_000,
    60_000,
    120_000,
    300_000,
    600_000,
    1_800_000,
)


def _zeros() -> list[int]:
    return [0] * (len(BOUNDS_MS) + 1)


@dataclass
class Histogram:
    """Counts per bucket of ``BOUNDS_MS`` (the last: above it), the count and the sum (ms)."""

    counts: list[int] = field(default_factory=_zeros)
    sum_ms: float = 0.0

    @property
    def count(self) -> int:
        return sum(self.counts)

    def observe(self, value_ms: float, weight: int = 1) -> None:
        """``weight`` values of ``value_ms`` (a negative duration, from clocks that disagree,
        counts as 0)."""
        if weight <= 0:
            return
        value_ms = max(0.0, value_ms)
        self.counts[bisect_left(BOUNDS_MS, value_ms)] += weight
        self.sum_ms += value_ms * weight

    def merge(self, other: Histogram) -> None:
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        self.sum_ms += other.sum_ms

    def copy(self) -> Histogram:
        return Histogram(list(self.counts), self.sum_ms)

    def quantile(self, q: float) -> float:
        """The ``q``-quantile (ms), interpolated linearly inside its bucket as Prometheus'
        ``histogram_quantile`` does; in the bucket above the last bound, that bound. 0 when
        empty."""
        total = self.count
        if total == 0:
            return 0.0
        rank = q * total
        seen = 0
        for i, n in enumerate(self.counts):
            if n and seen + n >= rank:
                if i == len(BOUNDS_MS):
                    return float(BOUNDS_MS[-1])
                low = 0 if i == 0 else BOUNDS_MS[i - 1]
                return low + (BOUNDS_MS[i] - low) * max(0.0, rank - seen) / n
            seen += n
        return float(BOUNDS_MS[-1])

    def cumulative(self) -> list[int]:
        """Counts at or below each bound, then the total (Prometheus' ``le`` buckets)."""
        out, running = [], 0
        for n in self.counts:
            running += n
            out.append(running)
        return out
