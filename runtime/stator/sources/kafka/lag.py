"""Consumer lag per partition, measured on the driver when an epoch is planned.

``records``: the partition's high watermark minus the job's position (what is in Kafka and
not yet planned into an epoch). ``seconds``: now minus the Kafka timestamp of the next
unread record, 0 when caught up: how old the oldest record waiting for the job is. Reading
that timestamp costs a fetch, so it is refreshed at most every ``PEEK_INTERVAL_MS`` per
partition; in between the last value ages with the clock.
"""

from __future__ import annotations

from collections.abc import Callable

from ..base import SplitLag

PEEK_INTERVAL_MS = 1_000

# split, offset -> the record's timestamp (ms), or None if none could be read
Peek = Callable[[str, int], int | None]


class LagMeter:
    def __init__(self) -> None:
        self.lag: dict[str, SplitLag] = {}
        self._peeked: dict[str, tuple[int, int, int]] = {}  # split -> (at_ms, offset, ts)

    def measure(self, split: str, position: int, high: int, now_ms: int, peek: Peek) -> None:
        records = max(0, high - position)
        if records == 0:
            self._peeked.pop(split, None)
            self.lag[split] = SplitLag(0, 0.0)
            return
        last = self._peeked.get(split)
        if last is None or (last[1] != position and now_ms - last[0] >= PEEK_INTERVAL_MS):
            ts = peek(split, position)
            if ts is None:  # nothing readable there (e.g. only transaction markers)
                self.lag[split] = SplitLag(records, 0.0)
                return
            last = self._peeked[split] = (now_ms, position, ts)
        self.lag[split] = SplitLag(records, max(0.0, (now_ms - last[2]) / 1000))

    def forget(self, keep: set[str]) -> None:
        """Drop splits that are no longer planned (finished, removed)."""
        for split in [s for s in self.lag if s not in keep]:
            del self.lag[split]
            self._peeked.pop(split, None)
