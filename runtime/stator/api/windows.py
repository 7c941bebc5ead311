"""Event-time windows as a library on keyed state and timers: tumbling, sliding and session.

A window's accumulator lives in MapState (window start -> (end, accumulator, fired)); a timer
at ``end - 1`` fires it once the watermark passes. Records that arrive after their window
fired are late: within ``allowed_lateness_ms`` they update the window and re-emit it, after
that they go to the ``late_output`` side output if one is given, else they are dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from ..errors import PipelineError
from ..state.descriptors import MapStateDescriptor
from ..state.serializers import INT64
from .functions import Context, KeyedProcessFunction, MapState, OutputTag, RuntimeContext


class Windowed(NamedTuple):
    key: Any
    start: int
    end: int
    value: Any


class Assigner(Protocol):
    merging: bool

    def assign(self, ts: int) -> list[tuple[int, int]]: ...


@dataclass(frozen=True)
class Tumbling:
    size_ms: int
    offset_ms: int = 0
    merging = False

    def __post_init__(self) -> None:
        if self.size_ms <= 0:
            raise PipelineError("Tumbling window size_ms must be positive")

    def assign(self, ts: int) -> list[tuple[int, int]]:
        start = ts - (ts - self.offset_ms) % self.size_ms
        return [(start, start + self.size_ms)]


@dataclass(frozen=True)
class Sliding:
    size_ms: int
    slide_ms: int
    merging = False

    def __post_init__(self) -> None:
        if self.size_ms <= 0 or self.slide_ms <= 0:
            raise PipelineError("Sliding window size_ms and slide_ms must be positive")

    def assign(self, ts: int) -> list[tuple[int, int]]:
        last = ts - ts % self.slide_ms
        return [(s, s + self.size_ms) for s in range(last, ts - self.size_ms, -self.slide_ms)][::-1]


@dataclass(frozen=True)
class Session:
    gap_ms: int
    merging = True

    def __post_init__(self) -> None:
        if self.gap_ms <= 0:
            raise PipelineError("Session window gap_ms must be positive")

    def assign(self, ts: int) -> list[tuple[int, int]]:
        return [(ts, ts + self.gap_ms)]


class Aggregate(Protocol):
    def create(self) -> Any: ...
    def add(self, acc: Any, value: Any) -> Any: ...
    def merge(self, a: Any, b: Any) -> Any: ...
    def result(self, acc: Any) -> Any: ...


@dataclass(frozen=True)
class Count:
    def create(self) -> Any:
        return 0

    def add(self, acc: Any, value: Any) -> Any:
        return acc + 1

    def merge(self, a: Any, b: Any) -> Any:
        return a + b

    def result(self, acc: Any) -> Any:
        return acc


@dataclass(frozen=True)
class Sum:
    value: Callable[[Any], Any]

    def create(self) -> Any:
        return 0

    def add(self, acc: Any, value: Any) -> Any:
        return acc + self.value(value)

    def merge(self, a: Any, b: Any) -> Any:
        return a + b

    def result(self, acc: Any) -> Any:
        return acc


@dataclass(frozen=True)
class Collect:
    """All values of the window, in arrival order."""

    def create(self) -> Any:
        return []

    def add(self, acc: Any, value: Any) -> Any:
        return [*acc, value]

    def merge(self, a: Any, b: Any) -> Any:
        return [*a, *b]

    def result(self, acc: Any) -> Any:
        return list(acc)


class WindowFunction(KeyedProcessFunction):
    def __init__(
        self,
        assigner: Assigner,
        aggregate: Aggregate,
        allowed_lateness_ms: int = 0,
        late_output: OutputTag | None = None,
    ):
        if allowed_lateness_ms < 0:
            raise PipelineError("allowed_lateness_ms must be >= 0")
        if late_output is not None and not isinstance(late_output, OutputTag):
            raise PipelineError(f"late_output must be an OutputTag, got {late_output!r}")
        self.assigner, self.aggregate, self.lateness = assigner, aggregate, allowed_lateness_ms
        self.late_output = late_output
        self.dropped = 0

    def open(self, ctx: RuntimeContext) -> None:
        self.windows: MapState = ctx.get_state(MapStateDescriptor("windows", key_serializer=INT64))

    def process_element(self, value: Any, ctx: Context) -> Iterable[Any] | None:
        ts = ctx.timestamp
        if ts is None:
            raise PipelineError(
                "windows need event timestamps: pass timestamps=... to pipeline.source()"
            )
        timers = ctx.timer_service
        watermark = timers.current_watermark()
        agg, out = self.aggregate, []
        late = True
        for assigned_start, assigned_end in self.assigner.assign(ts):
            start, end = assigned_start, assigned_end
            if end - 1 + self.lateness <= watermark and not (
                self.assigner.merging and self._overlaps(start, end)
            ):
                continue  # too late even for allowed lateness (a session is judged merged)
            late = False
            if self.assigner.merging:
                start, end, acc, fired = self._merge_sessions(start, end, timers)
            else:
                prev = self.windows.get(start)
                acc, fired = (prev[1], prev[2]) if prev else (agg.create(), False)
            acc = agg.add(acc, value)
            self.windows.put(start, (end, acc, fired))
            if fired or end - 1 <= watermark:  # late but allowed: fire an update now
                out.append(Windowed(ctx.current_key, start, end, agg.result(acc)))
                if not fired:
                    self.windows.put(start, (end, acc, True))
                    timers.register_event_time_timer(end - 1 + self.lateness)
            else:
                timers.register_event_time_timer(end - 1)
        if late:  # in no window that is still open: as Flink, late for every window
            self.dropped += 1
            if self.late_output is not None:
                ctx.output(self.late_output, value)
        return out

    def _overlaps(self, start: int, end: int) -> bool:
        """A kept session overlaps [start, end): merged with it, the record is not late (as
        Flink judges a merging window's lateness after merging)."""
        return any(s < end and start < e for s, (e, _, _) in self.windows.items())

    def _merge_sessions(self, start: int, end: int, timers: Any) -> tuple[int, int, Any, bool]:
        acc, fired = self.aggregate.create(), False
        for s, (e, a, f) in list(self.windows.items()):
            if s < end and start < e:  # overlaps: absorb it
                start, end = min(start, s), max(end, e)
                acc, fired = self.aggregate.merge(acc, a), fired or f
                self.windows.remove(s)
                timers.delete_event_time_timer(e - 1)
                if self.lateness:
                    timers.delete_event_time_timer(e - 1 + self.lateness)
        return start, end, acc, fired

    def on_timer(self, timestamp: int, ctx: Context) -> Iterable[Any] | None:
        out = []
        for start, (end, acc, fired) in list(self.windows.items()):
            if not fired and end - 1 == timestamp:
                out.append(Windowed(ctx.current_key, start, end, self.aggregate.result(acc)))
                if self.lateness:
                    self.windows.put(start, (end, acc, True))
                    ctx.timer_service.register_event_time_timer(end - 1 + self.lateness)
                else:
                    self.windows.remove(start)
            elif fired and end - 1 + self.lateness == timestamp:
                self.windows.remove(start)
        return out
