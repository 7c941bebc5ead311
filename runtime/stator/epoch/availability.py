"""When records became available to the job, carried with them through an epoch as a small
summary, so that latency is measured per batch instead of per record.

A source task summarizes the records it read (``Source.read_available``: a Kafka record's
broker timestamp, a rate-limited generator's scheduled emission, else the time the epoch
was planned) as at most ``MAX_ENTRIES`` (time, records) pairs, sent with every batch it
ships to a keyed subtask. A subtask attributes its records of that batch to the pairs in
proportion (keys are hashed independently of arrival, so a subtask's share of a read has
the read's distribution) and measures each pair's latency with one clock read. What a keyed
subtask sends on carries the summary of what it took in, so every keyed operator measures
from the source.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

# ((available at, epoch ms), records) in time order; () for no records.
Availability = tuple[tuple[int, int], ...]
MAX_ENTRIES = 8


def at(ms: int, records: int) -> Availability:
    """``records`` that became available at ``ms``."""
    return ((ms, records),) if records > 0 else ()


def spread(first_ms: int, last_ms: int, records: int) -> Availability:
    """``records`` that became available one after another at an even pace from ``first_ms``
    to ``last_ms`` (a rate-limited source's schedule)."""
    if records <= 0:
        return ()
    groups = min(MAX_ENTRIES, records)
    out = []
    for g in range(groups):
        lo, hi = records * g // groups, records * (g + 1) // groups
        middle = (lo + hi - 1) / 2 / max(1, records - 1)
        out.append((round(first_ms + (last_ms - first_ms) * middle), hi - lo))
    return summarize(out)


def from_times(times: Iterable[int]) -> Availability:
    """The summary of records with these availability times (e.g. Kafka's timestamps)."""
    return summarize(Counter(times).items())


def summarize(pairs: Iterable[tuple[int, int]]) -> Availability:
    """At most ``MAX_ENTRIES`` pairs: equal times merged, then runs of about equal records,
    each at its records' mean time."""
    merged: dict[int, int] = {}
    for t, n in pairs:
        if n > 0:
            merged[t] = merged.get(t, 0) + n
    items = sorted(merged.items())
    if len(items) <= MAX_ENTRIES:
        return tuple(items)
    total = sum(n for _, n in items)
    out: list[tuple[int, int]] = []
    group_n = group_sum = seen = 0
    for t, n in items:
        group_n, group_sum, seen = group_n + n, group_sum + t * n, seen + n
        if seen * MAX_ENTRIES >= total * (len(out) + 1):
            out.append((round(group_sum / group_n), group_n))
            group_n = group_sum = 0
    if group_n:  # cannot happen with the thresholds above; kept exact all the same
        t, n = out.pop()
        out.append((round((t * n + group_sum) / (n + group_n)), n + group_n))
    return tuple(out)


def merge(parts: Iterable[Availability]) -> Availability:
    return summarize(pair for part in parts for pair in part)


def attribute(avail: Availability, records: int) -> list[tuple[int, int]]:
    """``records`` of a batch cut from a read summarized as ``avail``: (time, records) in
    proportion to ``avail``, whole records summing to ``records`` (largest remainders)."""
    total = sum(n for _, n in avail)
    if records <= 0 or total <= 0:
        return []
    if len(avail) == 1:
        return [(avail[0][0], records)]
    exact = [n * records / total for _, n in avail]
    whole = [int(x) for x in exact]
    short = records - sum(whole)
    for i in sorted(range(len(exact)), key=lambda i: whole[i] - exact[i])[:short]:
        whole[i] += 1
    return [(t, w) for (t, _), w in zip(avail, whole, strict=True) if w]
