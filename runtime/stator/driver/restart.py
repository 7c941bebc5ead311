"""Restart strategies, as in Flink: how long to wait after a failure, and when to give up.

:func:`decide` is pure (config, history, clock, random draw in; delay and new history out) so
the two places that restart something decide the same way: the driver restarting a failed
epoch (:class:`RestartStrategy`, history in memory) and the operator restarting a failed
driver pod (history in the ``StatefulPipeline`` status, so it survives operator restarts).

- ``fixed-delay``: up to ``attempts`` restarts in the job's life, ``delay_ms`` apart.
- ``exponential-backoff``: ``delay_ms``, then x ``multiplier`` per restart up to
  ``max_delay_ms``, each spread by +-``jitter`` (a fraction) so that many jobs failing on one
  cause do not retry in lockstep; after ``reset_after_ms`` without a failure the delay and the
  count start over; ``attempts`` is the ceiling on restarts between resets.
- ``failure-rate``: give up when more than ``attempts`` failures fall within ``interval_ms``;
  otherwise restart after ``delay_ms``.
- ``none``: the first failure ends the job.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ..config import RestartConfig


@dataclass(frozen=True)
class History:
    """What a strategy remembers between failures."""

    count: int = 0  # restarts counted against `attempts` (since the last reset)
    backoff_ms: int = 0  # exponential-backoff: the next delay before jitter (0: delay_ms)
    failures: tuple[float, ...] = ()  # failure-rate: failure times inside the interval
    last_failure: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "backoffMs": self.backoff_ms,
            "failures": list(self.failures),
            "lastFailure": self.last_failure,
        }

    @staticmethod
    def from_json(data: dict[str, Any] | None) -> History:
        if not data:
            return History()
        return History(
            count=int(data.get("count", 0)),
            backoff_ms=int(data.get("backoffMs", 0)),
            failures=tuple(float(t) for t in data.get("failures", ())),
            last_failure=data.get("lastFailure"),
        )


@dataclass(frozen=True)
class Decision:
    delay_ms: int | None  # None: give up
    history: History
    why: str  # for a log line or an event: the attempt, or why the strategy gave up


def decide(
    cfg: RestartConfig,
    history: History,
    now: float,
    draw: Callable[[], float] = random.random,
) -> Decision:
    """One failure at ``now`` (seconds): restart after ``delay_ms``, or give up."""
    if cfg.strategy == "none":
        return Decision(None, history, "restart strategy 'none' never restarts")
    if cfg.strategy == "failure-rate":
        return _failure_rate(cfg, history, now)
    if cfg.strategy == "exponential-backoff":
        return _exponential(cfg, history, now, draw)
    return _fixed_delay(cfg, history, now)


def _fixed_delay(cfg: RestartConfig, history: History, now: float) -> Decision:
    if history.count >= cfg.attempts:
        why = f"{history.count} restarts (fixed-delay allows {cfg.attempts})"
        return Decision(None, replace(history, last_failure=now), why)
    h = replace(history, count=history.count + 1, last_failure=now)
    return Decision(cfg.delay_ms, h, f"restart {h.count} of {cfg.attempts}")


def _exponential(
    cfg: RestartConfig, history: History, now: float, draw: Callable[[], float]
) -> Decision:
    last = history.last_failure
    if last is not None and now - last > cfg.reset_after_ms / 1000:
        history = History()  # ran stably: start over
    if history.count >= cfg.attempts:
        why = (
            f"{history.count} restarts without {cfg.reset_after_ms} ms of stable running "
            f"(exponential-backoff allows {cfg.attempts})"
        )
        return Decision(None, replace(history, last_failure=now), why)
    base = history.backoff_ms or cfg.delay_ms
    spread = base * cfg.jitter * (2 * draw() - 1)
    delay = max(0, min(cfg.max_delay_ms, round(base + spread)))
    following = int(min(cfg.max_delay_ms, max(1, base) * cfg.multiplier))
    h = History(count=history.count + 1, backoff_ms=following, last_failure=now)
    return Decision(delay, h, f"restart {h.count} of {cfg.attempts}")


def _failure_rate(cfg: RestartConfig, history: History, now: float) -> Decision:
    window = (*(t for t in history.failures if now - t <= cfg.interval_ms / 1000), now)
    h = replace(history, failures=window, last_failure=now, count=history.count + 1)
    if len(window) > cfg.attempts:
        why = (
            f"{len(window)} failures within {cfg.interval_ms} ms "
            f"(failure-rate allows {cfg.attempts})"
        )
        return Decision(None, h, why)
    return Decision(cfg.delay_ms, h, f"failure {len(window)} of {cfg.attempts} allowed")


class RestartStrategy:
    """The driver's strategy for one job: :func:`decide` with its history in memory."""

    def __init__(
        self,
        cfg: RestartConfig,
        clock: Callable[[], float] = time.monotonic,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self.cfg, self.clock, self.draw = cfg, clock, draw
        self.history = History()
        self.why = ""

    def next_delay_ms(self) -> int | None:
        """Record a failure; the delay before restarting, or None to give up (``why`` says)."""
        d = decide(self.cfg, self.history, self.clock(), self.draw)
        self.history, self.why = d.history, d.why
        return d.delay_ms
