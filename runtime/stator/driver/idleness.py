"""Idle splits (Flink's ``WatermarkStrategy.withIdleness``): a split that had no input for
the watermark strategy's ``idleness_ms`` stops holding back the watermark of the operators
it feeds, until it has input again.

Decided on the driver when an epoch is planned and carried in the plan (``SplitRange.idle``),
so every attempt of a task sees the same decision. An operator whose inputs are all idle
keeps its watermark (``tasks/keyed.py``): idleness never advances time by itself.
"""

from __future__ import annotations

from dataclasses import replace

from ..sources.base import SplitRange


class IdleTracker:
    def __init__(self, idleness_ms: dict[str, int]) -> None:
        self.idleness_ms = idleness_ms  # source uid -> ms (0: never idle)
        self.active_ms: dict[tuple[str, str], int] = {}  # (uid, split) -> last input planned
        self.since_ms = 0  # splits not seen yet count from here (the job's (re)start)
        self.idle: set[tuple[str, str]] = set()  # (uid, split) idle in the latest plan

    def reset(self, now: int) -> None:
        """After a (re)start every split counts as active now."""
        self.active_ms.clear()
        self.idle.clear()
        self.since_ms = now

    def mark(self, uid: str, ranges: list[SplitRange], now: int) -> tuple[list[SplitRange], bool]:
        """``ranges`` of one source's next epoch, with ``idle`` set on the empty ranges of
        splits whose last input is ``idleness_ms`` or longer ago; and whether a split became
        idle (then the epoch is worth running even without input: it moves the watermark)."""
        limit = self.idleness_ms.get(uid, 0)
        out, became = [], False
        for r in ranges:
            key = (uid, r.split)
            if r.end != r.start or r.final:
                self.active_ms[key] = now
                self.idle.discard(key)
                out.append(r)
                continue
            last = self.active_ms.setdefault(key, self.since_ms or now)
            if limit > 0 and now - last >= limit:
                became = became or key not in self.idle
                self.idle.add(key)
                r = replace(r, idle=True)  # noqa: PLW2901
            out.append(r)
        return out, became
