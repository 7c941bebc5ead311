"""Where a Kafka partition starts when no checkpoint knows it (Flink's ``OffsetsInitializer``).

The choice is made once per split, on the driver, when the job first discovers it; afterwards
the checkpoint holds the position. Partitions discovered while the job runs start at their
earliest offset whatever the start mode (as Flink does), so nothing written to a new
partition before it was seen is skipped, and a replay re-reads it the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

EARLIEST, LATEST, TIMESTAMP, GROUP, OFFSETS = (
    "earliest",
    "latest",
    "timestamp",
    "group-offsets",
    "offsets",
)
_RESETS = (EARLIEST, LATEST)


@dataclass(frozen=True)
class StartFrom:
    """A start mode: build it with the class methods, or pass ``"earliest"``, ``"latest"``
    or ``"group-offsets"`` to ``KafkaSource(start=...)``."""

    mode: str
    timestamp_ms: int | None = None
    offsets: Mapping[str, int] = field(default_factory=dict)  # "topic:partition" -> offset
    fallback: str = EARLIEST  # group-offsets / offsets: partitions without one

    @staticmethod
    def earliest() -> StartFrom:
        return StartFrom(EARLIEST)

    @staticmethod
    def latest() -> StartFrom:
        return StartFrom(LATEST)

    @staticmethod
    def timestamp(ms: int) -> StartFrom:
        """The first record whose timestamp is at or after ``ms`` (the end if there is none)."""
        if isinstance(ms, bool) or not isinstance(ms, int) or ms < 0:
            raise ValueError(
                f"StartFrom.timestamp(ms) takes epoch milliseconds >= 0, got {ms!r}; "
                f"e.g. StartFrom.timestamp(int(time.time() * 1000) - 3_600_000)"
            )
        return StartFrom(TIMESTAMP, timestamp_ms=ms)

    @staticmethod
    def group_offsets(fallback: str = EARLIEST) -> StartFrom:
        """The consumer group's committed offsets (``KafkaSource(group_id=...)``); partitions
        the group has no offset for start at ``fallback`` (earliest or latest)."""
        return StartFrom(GROUP, fallback=_reset("StartFrom.group_offsets(fallback)", fallback))

    @staticmethod
    def given(
        offsets: Mapping[str, int] | Mapping[tuple[str, int], int], fallback: str = EARLIEST
    ) -> StartFrom:
        """Given offsets per partition, keyed ``"topic:partition"`` or ``(topic, partition)``;
        partitions not listed start at ``fallback``."""
        norm: dict[str, int] = {}
        for key, offset in offsets.items():
            split = f"{key[0]}:{key[1]}" if isinstance(key, tuple) else str(key)
            topic, _, part = split.rpartition(":")
            if not topic or not part.isdigit():
                raise ValueError(
                    f"StartFrom.given(offsets): key {key!r} is not 'topic:partition' or "
                    f"(topic, partition); e.g. {{'orders:0': 42}}"
                )
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise ValueError(
                    f"StartFrom.given(offsets): offset of {split} must be an int >= 0, "
                    f"got {offset!r}"
                )
            norm[split] = offset
        return StartFrom(
            OFFSETS, offsets=norm, fallback=_reset("StartFrom.given(fallback)", fallback)
        )


def _reset(name: str, value: str) -> str:
    if value not in _RESETS:
        raise ValueError(f"{name} must be 'earliest' or 'latest', got {value!r}")
    return value


def parse_start(start: str | StartFrom, group_id: str | None) -> StartFrom:
    """``KafkaSource(start=...)`` checked: a bad value names the argument and the choices."""
    if isinstance(start, str):
        if start == GROUP:
            start = StartFrom.group_offsets()
        elif start in _RESETS:
            start = StartFrom(start)
        else:
            raise ValueError(
                f"KafkaSource start must be 'earliest', 'latest', 'group-offsets' or a "
                f"StartFrom (StartFrom.timestamp(ms), StartFrom.given({{...}})), got {start!r}"
            )
    if not isinstance(start, StartFrom):
        raise ValueError(f"KafkaSource start must be a str or a StartFrom, got {start!r}")
    if start.mode == GROUP and not group_id:
        raise ValueError(
            "KafkaSource start='group-offsets' needs group_id='<consumer group>': the group "
            "whose committed offsets the job starts from"
        )
    return start


def resolve(
    start: StartFrom,
    split: str,
    low: int,
    high: int,
    by_time: int | None = None,
    committed: int | None = None,
) -> int:
    """The start offset of ``split`` (pure: the caller fetched what the mode needs).
    ``low``/``high``: the partition's watermark offsets; ``by_time``: the offset for
    ``start.timestamp_ms`` (None: no record that late); ``committed``: the group's offset
    (None: the group has none). The result is clamped into ``[low, high]``."""
    if start.mode == EARLIEST:
        offset = low
    elif start.mode == LATEST:
        offset = high
    elif start.mode == TIMESTAMP:
        offset = high if by_time is None else by_time
    elif start.mode == GROUP:
        offset = committed if committed is not None else _fallback(start, low, high)
    else:
        given = start.offsets.get(split)
        offset = given if given is not None else _fallback(start, low, high)
    return min(max(offset, low), high)


def _fallback(start: StartFrom, low: int, high: int) -> int:
    return low if start.fallback == EARLIEST else high
