"""Event time: timestamps and watermark strategies."""

from __future__ import annotations

from dataclasses import dataclass

MIN_TIMESTAMP = -(2**63)
MAX_TIMESTAMP = 2**63 - 1


@dataclass(frozen=True)
class BoundedOutOfOrderness:
    """Watermark = largest timestamp seen in a split minus ``max_delay_ms``; the job's
    watermark is the smallest over all splits. Records at or below the watermark that was in
    effect when their epoch started are late."""

    max_delay_ms: int = 0
    #: A split without input for this long stops holding the watermark back until it has
    #: input again (Flink's ``withIdleness``; 0: never). Its later records may then be late.
    idleness_ms: int = 0

    def __post_init__(self) -> None:
        if self.max_delay_ms < 0:
            raise ValueError(f"max_delay_ms must be >= 0, got {self.max_delay_ms}")
        if isinstance(self.idleness_ms, bool) or not isinstance(self.idleness_ms, int):
            raise ValueError(f"idleness_ms must be an int (ms), got {self.idleness_ms!r}")
        if self.idleness_ms < 0:
            raise ValueError(
                f"idleness_ms must be >= 0 (0: splits are never idle), got {self.idleness_ms}"
            )

    def with_idleness(self, idleness_ms: int) -> BoundedOutOfOrderness:
        """The same strategy, with idle splits after ``idleness_ms`` (Flink's name)."""
        return BoundedOutOfOrderness(self.max_delay_ms, idleness_ms)

    def watermark(self, max_timestamp: int) -> int:
        if max_timestamp == MIN_TIMESTAMP:
            return MIN_TIMESTAMP
        return max_timestamp - self.max_delay_ms


def monotonous() -> BoundedOutOfOrderness:
    """Timestamps never decrease within a split."""
    return BoundedOutOfOrderness(0)
