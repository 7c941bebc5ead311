"""Sources: split discovery and epoch planning on the driver, reading on executors.

A source's progress is a position per split, stored in every checkpoint. Planning an epoch
turns positions into ranges to read; it is deterministic for a given set of positions and
available input, so a job restored from a checkpoint re-reads exactly the same records.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..epoch.availability import Availability, at


@dataclass(frozen=True)
class SplitRange:
    """What one Spark task reads in one epoch: ``split`` from ``start`` up to ``end``."""

    split: str
    start: Any
    end: Any
    order: int  # position of the split among the source's splits: fixes processing order
    final: bool = False  # the split has no more input after this range
    # The planner found the split idle (no input for the watermark strategy's idleness_ms):
    # its task sends no watermark, so it does not hold the others back. Decided on the
    # driver and carried in the plan, so a retried task decides the same.
    idle: bool = False


@dataclass(frozen=True)
class SplitLag:
    """How far a split's reader is behind its input, measured when an epoch is planned:
    ``records`` not yet planned (the end of the input minus the position), ``seconds``
    from the event time stamp of the next unread record to now (0 when caught up)."""

    records: int
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {"records": self.records, "seconds": self.seconds}


@dataclass
class SplitState:
    """A split's progress, as stored in checkpoints (JSON)."""

    position: Any
    max_timestamp: int
    finished: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "max_timestamp": self.max_timestamp,
            "finished": self.finished,
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> SplitState:
        return SplitState(data["position"], int(data["max_timestamp"]), bool(data["finished"]))


class Source(ABC):
    """A replayable source. Implementations must be picklable (they travel to executors)."""

    #: Readers of this source return ``(record, timestamp)`` pairs themselves.
    provides_timestamps = False
    #: Look for new splits this often while running (ms; 0: only when the job starts).
    discovery_interval_ms = 0
    #: A sort key that puts splits in their fixed order whenever they were discovered
    #: (None: the order of :meth:`discover_splits`, splits discovered later last).
    split_key: Callable[[str], Any] | None = None

    @abstractmethod
    def discover_splits(self) -> list[str]:
        """Stable split ids, in a fixed order."""

    @abstractmethod
    def initial_position(self, split: str) -> Any:
        """Where a split starts when no checkpoint has a position for it."""

    def new_split_position(self, split: str) -> Any:
        """Where a split starts that appeared after the job first started (discovered while
        running, or unknown to the checkpoint being restored): by default its beginning, as
        Flink starts newly discovered Kafka partitions at their earliest offset."""
        return self.initial_position(split)

    @abstractmethod
    def plan(self, positions: dict[str, Any], budget: int, now_ms: int) -> list[SplitRange]:
        """Ranges to read this epoch, at most about ``budget`` records in total; empty if no
        input is available now. Splits already finished are not in ``positions``."""

    @abstractmethod
    def read(self, rng: SplitRange) -> list[Any]:
        """Runs on an executor: the records of ``rng``, in order."""

    def read_counted(self, rng: SplitRange) -> tuple[list[Any], int]:
        """Runs on an executor: the records of ``rng`` and how many records were set aside
        (sent to a dead-letter sink instead of failing the job)."""
        return self.read(rng), 0

    def read_available(
        self, rng: SplitRange, planned_ms: int
    ) -> tuple[list[Any], int, Availability]:
        """Runs on an executor: :meth:`read_counted`, and when its records became available
        to the job (``epoch/availability.py``; ``planned_ms``: when the epoch was planned)."""
        records, rejected = self.read_counted(rng)
        return records, rejected, self.availability(rng, len(records), planned_ms)

    def availability(self, rng: SplitRange, records: int, planned_ms: int) -> Availability:
        """When the ``records`` read from ``rng`` became available: by default when the
        epoch was planned (a source that cannot tell: they were there by then)."""
        return at(planned_ms, records)

    def lag(self) -> dict[str, SplitLag]:
        """Per split, its lag as of the last :meth:`plan` (sources that can tell)."""
        return {}

    def on_checkpoint_complete(self, positions: dict[str, Any]) -> None:  # noqa: B027
        """A checkpoint holding ``positions`` (split -> position) completed: e.g. publish
        them for monitoring. Optional; an exception here is logged, never fails the job."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release driver-side resources (clients)."""
