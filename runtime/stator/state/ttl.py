"""State time-to-live: when a keyed state's values expire (Flink's ``StateTtlConfig``).

The clock is the pipeline's processing time: every record and timer of an epoch sees the
epoch's ``processing_time_ms`` (``EpochSpec``), so a retried task attempt sees the same
expiries. A TTL-enabled value is stored with the processing time of its last write (or read,
with ``ON_READ_AND_WRITE``) as an 8-byte prefix; it is expired once that stamp plus
``ttl_ms`` is at or before the epoch's time. Storing the stamp, not the expiry, lets a
restore change ``ttl_ms``: the new duration applies to the stored values at once.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

STAMP = struct.Struct(">q")  # the last-access time prefixed to a TTL-enabled value
STAMP_BYTES = STAMP.size


class TtlUpdateType(StrEnum):
    """Which accesses restart a value's time to live."""

    ON_CREATE_AND_WRITE = "on_create_and_write"
    ON_READ_AND_WRITE = "on_read_and_write"


class TtlVisibility(StrEnum):
    """Whether a read may still return an expired value that cleanup has not removed yet
    (it is removed by that read either way)."""

    NEVER_RETURN_EXPIRED = "never_return_expired"
    RETURN_EXPIRED_IF_NOT_CLEANED_UP = "return_expired_if_not_cleaned_up"


DEFAULT_CLEANUP_SCAN = 10_000


@dataclass(frozen=True)
class StateTtlConfig:
    """``ttl_ms``: how long a value lives after its last write (or read); per element of a
    list state, per entry of a map state. ``cleanup_scan_per_epoch``: how many database
    entries each commit scans for expired entries, continuing where the last one stopped
    (a subtask with several TTL states scans the largest of their numbers). An expired entry
    is removed from the database, and so from every later checkpoint and savepoint, within
    ceil(entries in the subtask's database / cleanup_scan_per_epoch) epochs of expiring; a
    read removes it at once."""

    ttl_ms: int
    update_type: TtlUpdateType = TtlUpdateType.ON_CREATE_AND_WRITE
    visibility: TtlVisibility = TtlVisibility.NEVER_RETURN_EXPIRED
    cleanup_scan_per_epoch: int = DEFAULT_CLEANUP_SCAN

    def __post_init__(self) -> None:
        for name in ("ttl_ms", "cleanup_scan_per_epoch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(
                    f"StateTtlConfig.{name} must be a positive int (milliseconds for ttl_ms), "
                    f"got {value!r}"
                )
        if not isinstance(self.update_type, TtlUpdateType):
            raise ValueError(
                f"StateTtlConfig.update_type must be a TtlUpdateType (e.g. "
                f"TtlUpdateType.ON_READ_AND_WRITE), got {self.update_type!r}"
            )
        if not isinstance(self.visibility, TtlVisibility):
            raise ValueError(
                f"StateTtlConfig.visibility must be a TtlVisibility (e.g. "
                f"TtlVisibility.NEVER_RETURN_EXPIRED), got {self.visibility!r}"
            )

    @property
    def refresh_on_read(self) -> bool:
        return self.update_type is TtlUpdateType.ON_READ_AND_WRITE

    @property
    def return_expired(self) -> bool:
        return self.visibility is TtlVisibility.RETURN_EXPIRED_IF_NOT_CLEANED_UP

    def registry_entry(self) -> dict[str, Any]:
        """What the state's registry entry records (a restore checks TTL is still on; the
        offline reader needs ``ttl_ms`` to skip expired values)."""
        return {
            "ttl_ms": self.ttl_ms,
            "update_type": self.update_type.value,
            "visibility": self.visibility.value,
        }


def check_ttl(state: str, ttl: object) -> None:
    if ttl is not None and not isinstance(ttl, StateTtlConfig):
        raise ValueError(
            f"state '{state}': ttl must be a StateTtlConfig (e.g. StateTtlConfig(ttl_ms="
            f"3_600_000)) or None, got {ttl!r}"
        )


class TtlClock:
    """The processing time TTL compares against: the epoch's, set once when a keyed task
    opens its state (``locality/restore.open_state``); shared by the backend's TTL tables."""

    __slots__ = ("now_ms",)

    def __init__(self, now_ms: int = 0) -> None:
        self.now_ms = now_ms
