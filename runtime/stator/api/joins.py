"""Joins of two keyed streams as a library on ``KeyedCoProcessFunction``, keyed state and
event-time timers (as ``windows.py`` builds windows on ``KeyedProcessFunction``).

- **Interval join** (Flink's ``intervalJoin().between(lower, upper)``): each pair of the same
  key with ``left.ts + lower_ms <= right.ts <= left.ts + upper_ms`` (bounds inclusive) gives
  ``join(left, right)``, stamped ``max(left.ts, right.ts)`` (``lower_exclusive`` /
  ``upper_exclusive`` make a bound strict, as Flink's ``lowerBoundExclusive()``). Each
  side is buffered per key and timestamp until the watermark passes the last time the other
  side could still match it (left: ``ts + max(upper, 0)``, right: ``ts + max(-lower, 0)``,
  with the bounds of a strict side moved a ms inward, as Flink's ``IntervalJoinOperator``),
  when an event-time timer drops it.
- **Window join / co-group** over Tumbling, Sliding or Session windows: when a window fires
  (its end - 1 passed by the watermark of both inputs), ``co_group(key, window, lefts,
  rights)`` is called once per key and window with both sides' records in arrival order
  (``window_join`` emits ``join(l, r)`` for every pair). Session windows merge across both
  inputs.

A record at or below the watermark in effect when its epoch started is late (Stator's rule,
``docs/runtime.md``): a join drops it, or sends it to ``late_output`` if given. Within an
epoch records are processed in a deterministic order, not by timestamp; the buffers make the
result independent of that order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..errors import PipelineError
from ..state.descriptors import ValueStateDescriptor
from .functions import Context, KeyedCoProcessFunction, OutputTag, RuntimeContext, Timestamped
from .windows import Assigner, Windowed

if TYPE_CHECKING:
    from .streams import ConnectedStreams, KeyedStream, Stream

JoinFn = Callable[[Any, Any], Any]


def pair(left: Any, right: Any) -> tuple[Any, Any]:
    """The default join: both records, as a tuple."""
    return (left, right)


def _timestamp(ctx: Context, what: str) -> int:
    ts = ctx.timestamp
    if ts is None:
        raise PipelineError(
            f"{what} needs event timestamps on both inputs: pass timestamps=... to "
            f"pipeline.source() for each"
        )
    return ts


class IntervalJoin(KeyedCoProcessFunction):
    """Each side's buffer is one value per key: ``{ts: [records]}`` (small: a key holds only
    what the interval can still match), read once per key and epoch from the state cache."""

    def __init__(
        self,
        lower_ms: int,
        upper_ms: int,
        join: JoinFn,
        late_output: OutputTag | None = None,
        *,
        lower_exclusive: bool = False,
        upper_exclusive: bool = False,
    ) -> None:
        for name, value in (("lower_ms", lower_ms), ("upper_ms", upper_ms)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise PipelineError(f"interval_join {name} must be an int (ms), got {value!r}")
        if lower_ms > upper_ms:
            raise PipelineError(
                f"interval_join needs lower_ms <= upper_ms, got {lower_ms} > {upper_ms}"
            )
        # Timestamps are whole ms: a strict bound is the inclusive one a ms inside (as Flink
        # moves its bounds), so the lookups and the cleanup times need no other case.
        for name, flag in (
            ("lower_exclusive", lower_exclusive),
            ("upper_exclusive", upper_exclusive),
        ):
            if not isinstance(flag, bool):
                raise PipelineError(f"interval_join {name} must be True or False, got {flag!r}")
        lower, upper = lower_ms + lower_exclusive, upper_ms - upper_exclusive
        if lower > upper:
            raise PipelineError(
                f"interval_join's interval ({lower_ms}, {upper_ms}) holds no timestamp with "
                f"lower_exclusive={lower_exclusive}, upper_exclusive={upper_exclusive}: widen "
                f"it or make a bound inclusive"
            )
        if not callable(join):
            raise PipelineError(f"interval_join join= must be a function, got {join!r}")
        if late_output is not None and not isinstance(late_output, OutputTag):
            raise PipelineError(f"late_output must be an OutputTag, got {late_output!r}")
        self.lower, self.upper, self.join, self.late_output = lower, upper, join, late_output

    def open(self, ctx: RuntimeContext) -> None:
        self.left = ctx.get_state(ValueStateDescriptor("interval-join-left"))
        self.right = ctx.get_state(ValueStateDescriptor("interval-join-right"))

    def process_element1(self, value: Any, ctx: Context) -> Iterable[Any] | None:
        join = self.join
        return self._arrive(
            value,
            ctx,
            self.left,
            self.right,
            self.upper,
            self.lower,
            self.upper,
            lambda other: join(value, other),
        )

    def process_element2(self, value: Any, ctx: Context) -> Iterable[Any] | None:
        join = self.join
        return self._arrive(
            value,
            ctx,
            self.right,
            self.left,
            -self.lower,
            -self.upper,
            -self.lower,
            lambda other: join(other, value),
        )

    def _arrive(
        self,
        value: Any,
        ctx: Context,
        own: Any,
        other: Any,
        kept_for: int,
        lower: int,
        upper: int,
        pair: Callable[[Any], Any],
    ) -> Iterable[Any] | None:
        """A record of one side: buffered until the watermark passes ``ts + kept_for`` (the
        last time the other side can still match it), joined with the other side's buffered
        records at ``ts + lower ..= ts + upper`` (relative to this side)."""
        ts = _timestamp(ctx, "interval_join")
        if self._late(ts, value, ctx):
            return None
        _add(own, ts, value)
        ctx.timer_service.register_event_time_timer(ts + max(kept_for, 0))
        others = other.value()
        if not others:
            return None
        lo, hi = ts + lower, ts + upper
        return [
            Timestamped(pair(o), max(ts, ots))
            for ots, os_ in others.items()
            if lo <= ots <= hi
            for o in os_
        ]

    def on_timer(self, timestamp: int, ctx: Context) -> Iterable[Any] | None:
        _drop(self.left, timestamp - max(self.upper, 0))
        _drop(self.right, timestamp - max(-self.lower, 0))
        return None

    def _late(self, ts: int, value: Any, ctx: Context) -> bool:
        if ts > ctx.timer_service.current_watermark():
            return False
        if self.late_output is not None:
            ctx.output(self.late_output, value)
        return True


def _add(state: Any, ts: int, value: Any) -> None:
    buffer = state.value() or {}
    buffer.setdefault(ts, []).append(value)
    state.update(buffer)


def _drop(state: Any, ts: int) -> None:
    buffer = state.value()
    if buffer and buffer.pop(ts, None) is not None:
        if buffer:
            state.update(buffer)
        else:
            state.clear()


class WindowCoGroup(KeyedCoProcessFunction):
    """Both inputs' records per key and window, in one value per key:
    ``{start: (end, lefts, rights)}``; a window fires at ``end - 1`` by an event-time timer."""

    def __init__(
        self,
        assigner: Assigner,
        co_group: Callable[[Any, Windowed, list[Any], list[Any]], Iterable[Any]],
        late_output: OutputTag | None = None,
    ) -> None:
        if not hasattr(assigner, "assign"):
            raise PipelineError(
                f"a window join needs a window assigner (Tumbling, Sliding, Session), "
                f"got {assigner!r}"
            )
        if not callable(co_group):
            raise PipelineError(f"co_group needs a function, got {co_group!r}")
        if late_output is not None and not isinstance(late_output, OutputTag):
            raise PipelineError(f"late_output must be an OutputTag, got {late_output!r}")
        self.assigner, self.co_group, self.late_output = assigner, co_group, late_output

    def open(self, ctx: RuntimeContext) -> None:
        self.windows = ctx.get_state(ValueStateDescriptor("co-group-windows"))

    def process_element1(self, value: Any, ctx: Context) -> Iterable[Any] | None:
        self._add(0, value, ctx)
        return None

    def process_element2(self, value: Any, ctx: Context) -> Iterable[Any] | None:
        self._add(1, value, ctx)
        return None

    def _add(self, side: int, value: Any, ctx: Context) -> None:
        ts = _timestamp(ctx, "a window join")
        timers = ctx.timer_service
        watermark = timers.current_watermark()
        windows: dict[int, tuple[int, list[Any], list[Any]]] = self.windows.value() or {}
        placed = False
        for assigned_start, assigned_end in self.assigner.assign(ts):
            start, end = assigned_start, assigned_end
            if self.assigner.merging:  # merged first, then judged late (as Flink)
                start, end = self._merge(windows, start, end, timers)
            if end - 1 <= watermark:
                continue  # late for this window
            placed = True
            _, lefts, rights = windows.get(start, (end, [], []))
            (lefts if side == 0 else rights).append(value)
            windows[start] = (end, lefts, rights)
            timers.register_event_time_timer(end - 1)
        if placed:
            self.windows.update(windows)
        elif self.late_output is not None:
            ctx.output(self.late_output, value)

    @staticmethod
    def _merge(
        windows: dict[int, tuple[int, list[Any], list[Any]]], start: int, end: int, timers: Any
    ) -> tuple[int, int]:
        """Absorb every window overlapping [start, end) (both inputs' sessions merge)."""
        lefts: list[Any] = []
        rights: list[Any] = []
        for s in sorted(windows):
            e, ls, rs = windows[s]
            if s < end and start < e:
                start, end = min(start, s), max(end, e)
                lefts += ls
                rights += rs
                del windows[s]
                timers.delete_event_time_timer(e - 1)
        if lefts or rights:
            windows[start] = (end, lefts, rights)
        return start, end

    def on_timer(self, timestamp: int, ctx: Context) -> Iterable[Any] | None:
        windows = self.windows.value() or {}
        out: list[Any] = []
        for start in sorted(windows):
            end, lefts, rights = windows[start]
            if end - 1 == timestamp:
                window = Windowed(ctx.current_key, start, end, None)
                out.extend(self.co_group(ctx.current_key, window, lefts, rights))
                del windows[start]
        if windows:
            self.windows.update(windows)
        else:
            self.windows.clear()
        return out


class _PairsInWindow:
    """``window_join``'s co-group: ``join(l, r)`` for every pair of the window."""

    def __init__(self, join: JoinFn) -> None:
        self.join = join

    def __call__(self, key: Any, window: Windowed, lefts: list[Any], rights: list[Any]) -> Any:
        return [self.join(left, right) for left in lefts for right in rights]


def interval_join(
    left: KeyedStream,
    right: KeyedStream,
    lower_ms: int,
    upper_ms: int,
    *,
    uid: str,
    join: JoinFn = pair,
    late_output: OutputTag | None = None,
    lower_exclusive: bool = False,
    upper_exclusive: bool = False,
    parallelism: int | None = None,
) -> Stream:
    """``join(l, r)`` for every pair of the same key with
    ``l.ts + lower_ms <= r.ts <= l.ts + upper_ms`` (``<`` on an exclusive side)."""
    fn = IntervalJoin(
        lower_ms,
        upper_ms,
        join,
        late_output,
        lower_exclusive=lower_exclusive,
        upper_exclusive=upper_exclusive,
    )
    connected: ConnectedStreams = left.connect(right)
    return connected.process(fn, uid=uid, parallelism=parallelism)


def co_group(
    left: KeyedStream,
    right: KeyedStream,
    assigner: Assigner,
    fn: Callable[[Any, Windowed, list[Any], list[Any]], Iterable[Any]],
    *,
    uid: str,
    late_output: OutputTag | None = None,
    parallelism: int | None = None,
) -> Stream:
    """``fn(key, window, lefts, rights)`` once per key and window that holds a record of
    either input (the other list may be empty); ``window.value`` is None."""
    function = WindowCoGroup(assigner, fn, late_output)
    connected: ConnectedStreams = left.connect(right)
    return connected.process(function, uid=uid, parallelism=parallelism)


def window_join(
    left: KeyedStream,
    right: KeyedStream,
    assigner: Assigner,
    *,
    uid: str,
    join: JoinFn = pair,
    late_output: OutputTag | None = None,
    parallelism: int | None = None,
) -> Stream:
    """``join(l, r)`` for every pair of the same key in the same window, when it fires."""
    if not callable(join):
        raise PipelineError(f"window_join join= must be a function, got {join!r}")
    return co_group(
        left,
        right,
        assigner,
        _PairsInWindow(join),
        uid=uid,
        late_output=late_output,
        parallelism=parallelism,
    )
