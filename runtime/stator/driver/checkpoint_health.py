"""Checkpoint health of one failover region: when failing checkpoints fail the job over.

A failed checkpoint is retried by the next one, but the output of the epochs it was to cover
stays staged (exactly-once sinks commit only what a completed checkpoint covers) and a
failover would replay them all. So two rules escalate, as Flink does:

- ``checkpoint.tolerable_failures`` (Flink's ``execution.checkpointing.tolerable-failed-
  checkpoints``): more than that many checkpoints *in a row* failed. Counted: every failure
  of a checkpoint itself (a task's snapshot or upload, an upload's timeout or lost executor,
  the metadata write, a checkpoint whose base failed). Not counted: checkpoints aborted
  because the job fails over or fails (Flink ignores those too). A completed checkpoint
  starts the count over, and so does every failover (the job restarts from its latest
  completed checkpoint with a fresh allowance).
- ``checkpoint.progress_window_ms`` (the Flink operator's checkpoint-progress health check):
  the output and state of an epoch have waited longer than the window for a completed
  checkpoint to cover them. Only epochs that ran count, from their end: a job idle without
  input has nothing waiting and stays healthy, however long it idles.

Either verdict (:meth:`CheckpointHealth.problem`) makes the epoch loop fail over through the
restart strategy (:class:`~stator.errors.CheckpointsUnhealthy`), to the latest completed
checkpoint; the reason is the job's ``last_error``. The control API's readiness and
``/v1/job`` read :meth:`CheckpointHealth.report` from another thread (hence the lock).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..checkpoint.coordinator import now_ms
from ..config import CheckpointConfig
from ..errors import CheckpointsUnhealthy

# Epochs whose end the window remembers at most (one per checkpoint in flight or failed since
# the last completed one, plus one): beyond it the newest are not recorded, which can only
# make the window's verdict later, never wrong.
MAX_WAITING = 4096


@dataclass(frozen=True)
class HealthReport:
    """What the control API shows of a region's (or a job's) checkpoint health."""

    consecutive_failures: int = 0  # checkpoints failed in a row, as counted
    tolerable_failures: int = -1  # -1: no limit
    progress_window_ms: int = 0  # 0: off
    waiting_ms: int = 0  # how long the oldest epoch not covered by a checkpoint has waited
    failovers: int = 0  # failovers these rules caused since the driver started
    last_failover: str | None = None  # the reason of the latest of them
    last_failover_ms: int | None = None  # when (epoch ms)
    problem: str | None = None  # why the job fails over now; None: healthy

    @property
    def healthy(self) -> bool:
        return self.problem is None


class CheckpointHealth:
    """The two rules of the module docstring for one region (its epoch loop calls in)."""

    def __init__(self, cfg: CheckpointConfig, clock: Callable[[], float] = time.monotonic):
        self.tolerable = cfg.tolerable_failures
        self.window_ms = cfg.progress_window_ms if cfg.enabled else 0
        self.clock = clock
        self._lock = threading.Lock()
        self._consecutive = 0
        self._cause: str | None = None  # the latest counted failure since a completed one
        # (epoch, when it ended): the oldest epoch not covered by a completed checkpoint,
        # and each epoch after one that took a checkpoint (the oldest uncovered once that
        # checkpoint completes). Kept only while the window is on.
        self._waiting: deque[tuple[int, float]] = deque()
        self._after_checkpoint = False
        self._failovers = 0
        self._last_failover: str | None = None
        self._last_failover_ms: int | None = None

    # ------------------------------------------------------------------ the loop's events

    def epoch_ended(self, epoch: int, took_checkpoint: bool) -> None:
        """An epoch ran (its output and state now wait for a checkpoint that covers them)."""
        if self.window_ms <= 0:
            return
        with self._lock:
            if (not self._waiting or self._after_checkpoint) and len(self._waiting) < MAX_WAITING:
                self._waiting.append((epoch, self.clock()))
            self._after_checkpoint = took_checkpoint

    def completed(self, epoch: int) -> None:
        """A checkpoint of ``epoch`` completed: it covers every epoch up to it."""
        with self._lock:
            self._consecutive, self._cause = 0, None
            while self._waiting and self._waiting[0][0] <= epoch:
                self._waiting.popleft()

    def failed(self, error: str, counted: bool = True) -> None:
        """A checkpoint failed; ``counted`` False: it was aborted because the job fails over."""
        if not counted:
            return
        with self._lock:
            self._consecutive += 1
            self._cause = error

    def restarted(self) -> None:
        """The region rewound to its latest completed checkpoint: the epochs after it will
        run again, and the count starts over."""
        with self._lock:
            self._consecutive, self._cause = 0, None
            self._waiting.clear()
            self._after_checkpoint = False

    def check(self) -> None:
        """Raise :class:`CheckpointsUnhealthy` if a rule says fail over (and count it). The
        verdict is spent once raised: while the failover waits out its restart delay the
        region reports the failover, not a problem still to act on (a problem that stays
        means the loop cannot act: the operator's cue)."""
        problem = self.problem()
        if problem is None:
            return
        with self._lock:
            self._failovers += 1
            self._last_failover, self._last_failover_ms = problem, now_ms()
        self.restarted()
        raise CheckpointsUnhealthy(problem)

    # ------------------------------------------------------------------ verdicts

    def problem(self) -> str | None:
        """Why the region must fail over now, if it must."""
        with self._lock:
            consecutive, cause = self._consecutive, self._cause
            oldest = self._waiting[0] if self._waiting else None
        if 0 <= self.tolerable < consecutive:
            return (
                f"{consecutive} consecutive checkpoints failed (checkpoint.tolerable_failures "
                f"is {self.tolerable}): {cause}"
            )
        if self.window_ms > 0 and oldest is not None:
            epoch, ended = oldest
            waited_s = self.clock() - ended
            if waited_s * 1000 > self.window_ms:
                last = f"; the last failed: {cause}" if cause else ""
                return (
                    f"no checkpoint completed in {self.window_ms / 1000:g} s "
                    f"(checkpoint.progress_window_ms): epoch {epoch} ended {waited_s:.1f} s ago "
                    f"and no completed checkpoint covers it{last}"
                )
        return None

    def report(self) -> HealthReport:
        problem = self.problem()
        with self._lock:
            oldest = self._waiting[0][1] if self._waiting else None
            return HealthReport(
                consecutive_failures=self._consecutive,
                tolerable_failures=self.tolerable,
                progress_window_ms=self.window_ms,
                waiting_ms=0 if oldest is None else max(0, round((self.clock() - oldest) * 1000)),
                failovers=self._failovers,
                last_failover=self._last_failover,
                last_failover_ms=self._last_failover_ms,
                problem=problem,
            )


def merge_reports(reports: Mapping[str, HealthReport]) -> HealthReport:
    """A job of several regions: healthy if every region is; its worst numbers; the first
    problem and the latest failover, each naming its region."""
    if not reports:
        return HealthReport()
    problems = [f"region '{r}': {h.problem}" for r, h in reports.items() if h.problem]
    latest = max(
        ((h.last_failover_ms or 0, r, h) for r, h in reports.items() if h.last_failover),
        default=None,
        key=lambda item: item[0],
    )
    first = next(iter(reports.values()))
    failover = None if latest is None else f"region '{latest[1]}': {latest[2].last_failover}"
    return HealthReport(
        consecutive_failures=max(h.consecutive_failures for h in reports.values()),
        tolerable_failures=first.tolerable_failures,  # one config for every region
        progress_window_ms=first.progress_window_ms,
        waiting_ms=max(h.waiting_ms for h in reports.values()),
        failovers=sum(h.failovers for h in reports.values()),
        last_failover=failover,
        last_failover_ms=None if latest is None else latest[2].last_failover_ms,
        problem=problems[0] if problems else None,
    )
