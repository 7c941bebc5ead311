"""Failover per source split, for a job (or failover region) without keyed operators.

Without ``key_by`` no record of one source split meets a record of another, so each split is
a failover region of its own (FLIP-1's embarrassingly parallel case): a failure in one split
must not hold back the others. Split ``s`` failing in epoch E, step by step:

1. Spark retries its source task (``spark.task_attempts``); the last attempt reports the
   failure instead of failing the Spark job (``tasks/source.py``), so epoch E completes for
   every other split, and their output commits with E's checkpoint.
2. The driver leaves ``s``'s position where it was (its range is read again) and commits none
   of its output (the failed attempt staged nothing it reported). The failure is classified
   as a failed epoch is (``failures.py``): one no restart can fix ends the job, and so does
   ``s``'s own restart strategy giving up (:class:`SplitRegionFailed`; staged output after
   the latest checkpoint is removed, as for any job that ends failed).
3. Otherwise ``s`` is not planned until its strategy's delay has passed; every other split goes
   on reading, committing and checkpointing. An epoch that reads ``s`` again without failing
   clears its failure (a later one is not "the same failure again").

A lost executor or driver still fails the epoch itself, and the job (or region) rewinds as a
whole (``recovery.py``): its tasks' output cannot be told apart.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..config import RestartConfig
from ..epoch.reports import SplitFailure, SplitReport
from ..errors import JobFailed
from .failures import Failure, Kind, classify_text
from .restart import RestartStrategy

log = logging.getLogger("stator.driver")


class SplitRegionFailed(JobFailed):
    """A split's failure cannot be restarted, or its restart strategy gave up."""


@dataclass
class SplitRegion:
    strategy: RestartStrategy
    paused_until: float = 0.0  # monotonic
    failure: Failure | None = None  # the last one, until the split reads again
    restarts: int = 0
    last_error: str | None = None


@dataclass
class SplitFailover:
    label: str  # "job 'x'" or "job 'x' region 'y'"
    config: RestartConfig
    clock: Callable[[], float] = time.monotonic
    splits: dict[tuple[str, str], SplitRegion] = field(default_factory=dict)
    last_error: str | None = None  # the latest failure's summary

    def paused(self) -> set[tuple[str, str]]:
        """(source uid, split) of the splits waiting out their restart delay."""
        now = self.clock()
        return {key for key, r in self.splits.items() if r.paused_until > now}

    def failed(self, failures: list[SplitFailure]) -> None:
        """Steps 2-3 (``last_error`` says the latest). Raises :class:`SplitRegionFailed`."""
        for f in failures:
            region = self.splits.get((f.uid, f.split))
            if region is None:
                region = self.splits[(f.uid, f.split)] = SplitRegion(
                    RestartStrategy(self.config, self.clock)
                )
            failure = classify_text(f.error, None, region.failure)
            region.failure = failure
            region.last_error = self.last_error = failure.summary
            where = f"{self.label} source '{f.uid}' split {f.split}"
            if failure.user_traceback:
                log.error("%s: %s\n%s", where, failure.summary, failure.user_traceback)
            if failure.kind is Kind.FATAL:
                raise SplitRegionFailed(f"{where} failed: {failure.summary} ({failure.reason})")
            delay = region.strategy.next_delay_ms()
            if delay is None:
                raise SplitRegionFailed(
                    f"{where} failed and the restart strategy '{self.config.strategy}' gave "
                    f"up ({region.strategy.why}): {failure.summary}"
                )
            region.restarts += 1
            region.paused_until = self.clock() + delay / 1000
            log.warning(
                "%s failed in epoch %d: %s; it is read again in %d ms (%s), the other splits go on",
                where,
                f.epoch,
                failure.summary,
                delay,
                region.strategy.why,
            )

    def read(self, reads: list[SplitReport]) -> None:
        """Step 3: these splits read their ranges without failing."""
        for r in reads:
            region = self.splits.get((r.uid, r.split))
            if region is not None:
                region.failure = None

    def to_json(self) -> list[dict[str, Any]]:
        now = self.clock()
        return [
            {
                "source": uid,
                "split": split,
                "restarts": r.restarts,
                "state": "RESTARTING" if r.paused_until > now else "RUNNING",
                "last_error": r.last_error,
            }
            for (uid, split), r in sorted(self.splits.items())
        ]
