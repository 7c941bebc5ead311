"""How many records the next epoch may read: ``epoch.max_records``, and with ``epoch.max_ms``
what the job processes in about that long.

Every record of an epoch waits for the whole epoch: its source stage, shuffle, keyed stage
and commit. A backlog (a restart, a burst, a slow consumer catching up) read in one epoch of
``epoch.max_records`` makes that epoch seconds long and adds those seconds to the latency
of every record in it and of every record that arrives meanwhile. With ``epoch.max_ms`` the
planner cuts a backlog into epochs of about ``max_ms``.

An epoch of ``n`` records takes ``F + n c``: a fixed cost ``F`` (two Spark stages, state
opened and committed, a checkpoint) and ``c`` per record. The planner estimates ``F`` as
the shortest of the last :data:`WINDOW` epochs and ``c`` as a moving average of
``(duration - F) / n``, and reads at most ``(max_ms - F) / c`` records. A ``max_ms`` at or
near the fixed cost cannot be met without falling behind the input, so an epoch is always
allowed as much time for its records as its fixed cost (``F / c`` records): the job then
sustains at least half the rate it would without the cap, and its epochs take ``2 F``.
Epochs that read little (the input is not there) measure the fixed cost.

Until an epoch took longer than the shortest one (a per-record cost is measured), epochs
read at most :data:`FIRST_EPOCH` records. Epoch
boundaries never change what a pipeline computes (the records of every split are read in
order; processing-time timers see each epoch's planned time, as with a rate limit).
"""

from __future__ import annotations

from collections import deque

FIRST_EPOCH = 10_000  # records, before any epoch was measured (with epoch.max_ms)
MIN_EPOCH = 100  # records: an epoch that reads anything may read at least this many
WINDOW = 20  # epochs whose shortest duration estimates the fixed cost
SMOOTHING = 0.3  # weight of the newest epoch in the per-record cost


class EpochBudget:
    """``max_records`` (``epoch.max_records``) and, if ``max_ms`` > 0 (``epoch.max_ms``),
    the records the job processes in about ``max_ms``."""

    def __init__(self, max_records: int, max_ms: int = 0) -> None:
        self.max_records, self.max_ms = max_records, max_ms
        self._durations: deque[float] = deque(maxlen=WINDOW)  # s, recent epochs
        self.per_record_s: float | None = None  # c, estimated

    @property
    def fixed_s(self) -> float:
        """F, estimated: the shortest recent epoch."""
        return min(self._durations, default=0.0)

    def records(self) -> int:
        """The next epoch's budget, over all splits of all sources."""
        if self.max_ms <= 0:
            return self.max_records
        c = self.per_record_s
        if not c:  # nothing measured yet, or only the fixed cost
            return min(self.max_records, FIRST_EPOCH)
        fixed = self.fixed_s
        work_s = max(self.max_ms / 1000 - fixed, fixed)
        return max(MIN_EPOCH, min(self.max_records, int(work_s / c)))

    def observe(self, records: int, seconds: float) -> None:
        """An epoch read ``records`` and took ``seconds``. Epochs that read nothing (a
        savepoint's, an idle one) say nothing of either cost."""
        if self.max_ms <= 0 or records <= 0 or seconds <= 0:
            return
        self._durations.append(seconds)
        c = max(0.0, seconds - self.fixed_s) / records
        if c > 0:
            prev = self.per_record_s
            self.per_record_s = c if prev is None else SMOOTHING * c + (1 - SMOOTHING) * prev

    def reset(self) -> None:
        """After a failover or a restore: the first epochs restore state and start workers,
        and both costs are measured again (from :data:`FIRST_EPOCH`)."""
        self._durations.clear()
        self.per_record_s = None
