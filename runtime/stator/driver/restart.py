"""Restart strategies, as in Flink: how long to wait after a failure, and when to give up."""

from __future__ import annotations

import time
from collections import deque

from ..config import RestartConfig


class RestartStrategy:
    def __init__(self, cfg: RestartConfig, clock: object = time.monotonic) -> None:
        self.cfg = cfg
        self.clock = clock
        self.failures: deque[float] = deque()
        self.restarts = 0
        self._delay = cfg.delay_ms
        self._last_failure: float | None = None

    def next_delay_ms(self) -> int | None:
        """Record a failure; the delay before restarting, or None to give up."""
        now: float = self.clock()  # type: ignore[operator]
        cfg = self.cfg
        if cfg.strategy == "none":
            return None
        if cfg.strategy == "fixed-delay":
            if self.restarts >= cfg.attempts:
                return None
            self.restarts += 1
            return cfg.delay_ms
        if cfg.strategy == "failure-rate":
            self.failures.append(now)
            while self.failures and now - self.failures[0] > cfg.interval_ms / 1000:
                self.failures.popleft()
            if len(self.failures) > cfg.attempts:
                return None
            self.restarts += 1
            return cfg.delay_ms
        # exponential-backoff
        if self._last_failure is not None and now - self._last_failure > cfg.reset_after_ms / 1000:
            self._delay = cfg.delay_ms
        self._last_failure = now
        delay = self._delay
        self._delay = int(min(cfg.max_delay_ms, max(1, self._delay) * cfg.multiplier))
        self.restarts += 1
        return delay
