"""Sources: split discovery and epoch planning on the driver, reading on executors.

A source's progress is a position per split, stored in every checkpoint. Planning an epoch
turns positions into ranges to read; it is deterministic for a given set of positions and
available input, so a job restored from a checkpoint re-reads exactly the same records.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SplitRange:
    """What one Spark task reads in one epoch: ``split`` from ``start`` up to ``end``."""

    split: str
    start: Any
    end: Any
    order: int  # position of the split among the source's splits: fixes processing order
    final: bool = False  # the split has no more input after this range


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

    @abstractmethod
    def discover_splits(self) -> list[str]:
        """Stable split ids, in a fixed order."""

    @abstractmethod
    def initial_position(self, split: str) -> Any:
        """Where a split starts when no checkpoint has a position for it."""

    @abstractmethod
    def plan(self, positions: dict[str, Any], budget: int, now_ms: int) -> list[SplitRange]:
        """Ranges to read this epoch, at most about ``budget`` records in total; empty if no
        input is available now. Splits already finished are not in ``positions``."""

    @abstractmethod
    def read(self, rng: SplitRange) -> list[Any]:
        """Runs on an executor: the records of ``rng``, in order."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release driver-side resources (clients)."""
