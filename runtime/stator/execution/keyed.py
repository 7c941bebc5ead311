"""Running one epoch of a keyed operator on one subtask's state.

Input arrives as batches from every upstream task, sorted by a deterministic order key, so a
replayed epoch sees the same records in the same order. Late records (at or below the
watermark in effect when the epoch started) are passed to process functions, which decide;
event-time timers fire up to the epoch's new watermark after all records are processed.
"""

from __future__ import annotations

from typing import Any

from ..api.functions import KeyCursor, KeyedProcessFunction, RuntimeContext
from ..api.pipeline import ProcessNode, ReduceNode
from ..api.state import ListStateDescriptor, ReducingStateDescriptor, ValueStateDescriptor
from ..keygroups import KeyGroupRange, decode_key
from ..state.backend import KeyedBackend
from ..state.layout import EVENT_TIME, PROCESSING_TIME, key_suffix
from ..state.tables import MISSING
from .routing import Batch, Entry

REDUCE_STATE = "reduce"


class _Timers:
    """The timer service a function sees, bound to the current key."""

    def __init__(self, runner: ProcessRunner) -> None:
        self._r = runner

    def register_event_time_timer(self, timestamp: int) -> None:
        c = self._r.cursor
        self._r.backend.timers.register(c.kg, EVENT_TIME, int(timestamp), c.kb)  # type: ignore[union-attr]

    def delete_event_time_timer(self, timestamp: int) -> None:
        c = self._r.cursor
        self._r.backend.timers.delete(c.kg, EVENT_TIME, int(timestamp), c.kb)  # type: ignore[union-attr]

    def register_processing_time_timer(self, timestamp: int) -> None:
        c = self._r.cursor
        self._r.backend.timers.register(c.kg, PROCESSING_TIME, int(timestamp), c.kb)  # type: ignore[union-attr]

    def delete_processing_time_timer(self, timestamp: int) -> None:
        c = self._r.cursor
        self._r.backend.timers.delete(c.kg, PROCESSING_TIME, int(timestamp), c.kb)  # type: ignore[union-attr]

    def current_watermark(self) -> int:
        return self._r.watermark

    def current_processing_time(self) -> int:
        return self._r.processing_time


class _Context:
    __slots__ = ("_key", "_r", "timer_service", "timestamp")

    def __init__(self, runner: ProcessRunner) -> None:
        self._r = runner
        self._key: Any = MISSING
        self.timestamp: int | None = None
        self.timer_service = _Timers(runner)

    @property
    def current_key(self) -> Any:
        if self._key is MISSING:
            self._key = decode_key(self._r.cursor.kb)
        return self._key


class ProcessRunner:
    def __init__(
        self,
        node: ProcessNode,
        backend: KeyedBackend,
        subtask: int,
        parallelism: int,
        processing_time: int,
    ) -> None:
        self.node, self.backend = node, backend
        self.cursor = KeyCursor()
        self.watermark = backend.watermark
        self.processing_time = processing_time
        self.fn: KeyedProcessFunction = node.function
        self.ctx = _Context(self)
        self.fn.open(
            RuntimeContext(
                backend, self.cursor, node.uid, subtask, parallelism, backend.max_parallelism
            )
        )

    def run(self, batches: list[list[Entry]], new_watermark: int) -> Batch:
        out: Batch = []
        cursor, ctx, fn = self.cursor, self.ctx, self.fn
        self._prefetch(batches)
        suffixes: dict[bytes, bytes] = {}
        for records in batches:
            for kb, kg, value, ts in records:
                cursor.kg, cursor.kb = kg, kb
                suffix = suffixes.get(kb)
                if suffix is None:
                    suffix = suffixes[kb] = key_suffix(kb)
                cursor.suffix = suffix
                ctx._key = MISSING
                ctx.timestamp = ts
                result = fn.process_element(value, ctx)
                if result is not None:
                    out.extend((o, ts) for o in result)
        # Timers: event time up to the new watermark, processing time up to the epoch's time.
        self.watermark = max(self.watermark, new_watermark)
        self._fire(EVENT_TIME, self.watermark, out)
        self._fire(PROCESSING_TIME, self.processing_time, out)
        self.fn.close()
        return out

    def _prefetch(self, batches: list[list[Entry]]) -> None:
        tables = [
            t
            for t in self.backend.tables.values()
            if isinstance(
                t.desc, ValueStateDescriptor | ReducingStateDescriptor | ListStateDescriptor
            )
        ]
        if not tables:
            return
        seen: dict[bytes, int] = {}
        for records in batches:
            for kb, kg, _, _ in records:
                seen[kb] = kg
        for table in tables:
            prefixes = table.prefixes
            table.prefetch([prefixes[kg] + key_suffix(kb) for kb, kg in seen.items()])

    def _fire(self, domain: int, bound: int, out: Batch) -> None:
        timers = self.backend.timers
        assert timers is not None
        kgs = range(self.backend.key_groups.start, self.backend.key_groups.end)
        cursor, ctx, fn = self.cursor, self.ctx, self.fn
        while True:
            due = timers.pop_due(domain, bound, kgs)
            if not due:
                return
            for ts, kg, kb in due:
                cursor.kg, cursor.kb, cursor.suffix = kg, kb, key_suffix(kb)
                ctx._key = MISSING
                ctx.timestamp = ts
                result = fn.on_timer(ts, ctx)
                if result is not None:
                    out.extend((o, ts) for o in result)


class ReduceRunner:
    """Applies pre-combined contributions: one state read and one write per key per epoch."""

    def __init__(self, node: ReduceNode, backend: KeyedBackend) -> None:
        self.node, self.backend = node, backend
        self.table = backend.table(ReducingStateDescriptor(REDUCE_STATE, node.reduce_fn))

    def run(self, batches: list[list[Entry]], new_watermark: int) -> Batch:
        reduce_fn = self.node.reduce_fn
        merged: dict[bytes, list[Any]] = {}
        for records in batches:
            for kb, kg, value, ts in records:
                cur = merged.get(kb)
                if cur is None:
                    merged[kb] = [kg, value, ts]
                else:
                    cur[1] = reduce_fn(cur[1], value)
                    cur[2] = ts
        table = self.table
        prefixes = table.prefixes
        keys = [prefixes[kg] + key_suffix(kb) for kb, (kg, _, _) in merged.items()]
        table.prefetch(keys)
        cache, dirty = table.cache, table.dirty
        out: Batch = []
        for key, (kb, (_, value, ts)) in zip(keys, merged.items(), strict=True):
            current = cache[key]
            total = value if current is MISSING else reduce_fn(current, value)
            cache[key] = total
            dirty.add(key)
            out.append(((decode_key(kb), total), ts))
        return out


def key_group_range_of(backend: KeyedBackend) -> KeyGroupRange:
    return backend.key_groups
