"""Running one epoch of a keyed operator on one subtask's state.

Input arrives as batches from every upstream task, sorted by a deterministic order key, so a
replayed epoch sees the same records in the same order. Late records (at or below the
watermark in effect when the epoch started) are passed to process functions, which decide;
event-time timers fire up to the epoch's new watermark after all records are processed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import chain, repeat
from operator import is_
from typing import Any

from ..api.functions import (
    NO_KEY,
    AnyProcessFunction,
    BroadcastProcessFunction,
    KeyCursor,
    KeyedBroadcastProcessFunction,
    KeyedCoProcessFunction,
    KeyedProcessFunction,
    OutputTag,
    ProcessFunction,
    RuntimeContext,
    Timestamped,
)
from ..api.nodes import (
    BroadcastProcessNode,
    CoProcessNode,
    NonKeyedBroadcastNode,
    OperatorNode,
    ReduceNode,
    Route,
    _add,
    _one,
)
from ..api.operator_state import BroadcastState
from ..keygroups import decode_key
from ..state.backend import KeyedBackend
from ..state.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from ..state.key_scan import keys_with_state
from ..state.layout import EVENT_TIME, PROCESSING_TIME
from ..state.markers import MISSING
from ..state.serializers import INT64, PICKLE
from .routing import Batch, Columns

REDUCE_STATE = "reduce"
# The functions that have a key, and so timers.
KeyedFunction = KeyedProcessFunction | KeyedCoProcessFunction | KeyedBroadcastProcessFunction


class _Timers:
    """The timer service a function sees, bound to the current key."""

    def __init__(self, runner: ProcessRunner) -> None:
        self._r = runner

    def _store(self) -> Any:
        return self._r.backend.timers

    def register_event_time_timer(self, timestamp: int) -> None:
        self._store().register(self._r.cursor.kkey, EVENT_TIME, int(timestamp))

    def delete_event_time_timer(self, timestamp: int) -> None:
        self._store().delete(self._r.cursor.kkey, EVENT_TIME, int(timestamp))

    def register_processing_time_timer(self, timestamp: int) -> None:
        self._store().register(self._r.cursor.kkey, PROCESSING_TIME, int(timestamp))

    def delete_processing_time_timer(self, timestamp: int) -> None:
        self._store().delete(self._r.cursor.kkey, PROCESSING_TIME, int(timestamp))

    def current_watermark(self) -> int:
        return self._r.watermark

    def current_processing_time(self) -> int:
        return self._r.processing_time


class _Context:
    """What ``process_element`` and ``on_timer`` see. The runner sets the key and timestamp
    as plain attributes per record (a property computing the key was a tenth of a user
    function's per-record cost)."""

    __slots__ = (
        "_read_only",
        "_runner",
        "_writable",
        "broadcast_writable",
        "current_key",
        "side",
        "timer_service",
        "timestamp",
    )

    def __init__(self, runner: ProcessRunner) -> None:
        self.current_key: Any = None
        self.timestamp: int | None = None
        self.timer_service = _Timers(runner)
        self.side: dict[OutputTag, Batch] = {}
        self._runner = runner
        # Broadcast state may change only while the broadcast input is processed: the same
        # records in the same order on every subtask keep the copies equal.
        self.broadcast_writable = False
        self._writable: dict[str, BroadcastState] = {}
        self._read_only: dict[str, BroadcastState] = {}

    def get_broadcast_state(self, desc: MapStateDescriptor) -> BroadcastState:
        """The operator's broadcast state: writable in ``process_broadcast_element``,
        read-only elsewhere."""
        writable = self.broadcast_writable
        handle = (self._writable if writable else self._read_only).get(desc.name)
        if handle is None:
            declared = [d.name for d in self._runner.broadcast_states]
            if desc.name not in declared:
                raise RuntimeError(
                    f"broadcast state '{desc.name}' is not declared: pass its descriptor to "
                    f"stream.broadcast(...) (declared: {declared})"
                )
            full = self._runner.runtime.get_broadcast_state(desc)
            handle = full if writable else full.read_only()
            (self._writable if writable else self._read_only)[desc.name] = handle
        return handle

    def apply_to_keyed_state(self, desc: StateDescriptor, fn: Callable[[Any, Any], None]) -> None:
        """Call ``fn(key, state)`` for every key of this subtask that has ``desc``'s state
        (``process_broadcast_element`` only: elsewhere there is a current key)."""
        runner = self._runner
        if runner.cursor.kkey is not NO_KEY:
            raise RuntimeError(
                "apply_to_keyed_state() is for process_broadcast_element; in process_element "
                "use the state handle, which is bound to the current key"
            )
        handle = runner.runtime.get_state(desc)
        table = runner.backend.table(desc)
        assert runner.backend.db is not None
        try:
            for kk in keys_with_state(runner.backend.db, runner.backend.key_groups, table):
                runner.cursor.kkey = kk
                fn(decoded(kk), handle)
        finally:
            runner.cursor.kkey = NO_KEY

    def output(self, tag: OutputTag, value: Any) -> None:
        if not isinstance(tag, OutputTag):
            raise TypeError(f"ctx.output() needs an OutputTag, got {tag!r}")
        values, stamps = self.side.setdefault(tag, ([], []))
        values.append(value)
        stamps.append(self.timestamp)


class ProcessRunner:
    """Runs a process function (one input, or two connected by key) over an epoch's input."""

    def __init__(
        self,
        node: OperatorNode,
        backend: KeyedBackend,
        subtask: int,
        parallelism: int,
        processing_time: int,
    ) -> None:
        self.node, self.backend = node, backend
        self.cursor = KeyCursor()
        self.watermark = backend.watermark
        self.processing_time = processing_time
        self.fn: AnyProcessFunction = node.function
        self.ctx = _Context(self)
        # How each input arrives: inputs without a key run first (broadcast, then forward).
        self.routes = [node.route(side) for side in range(len(node.inputs))]
        if isinstance(node, CoProcessNode):
            self.handlers = [node.function.process_element1, node.function.process_element2]
        elif isinstance(node, BroadcastProcessNode | NonKeyedBroadcastNode):
            self.handlers = [
                node.function.process_element,
                node.function.process_broadcast_element,
            ]
        else:
            self.handlers = [node.function.process_element]
        self.runtime = RuntimeContext(
            backend, self.cursor, node.uid, subtask, parallelism, backend.max_parallelism
        )
        self.broadcast_states: tuple[MapStateDescriptor, ...] = getattr(node, "states", ())
        for desc in self.broadcast_states:  # declared, so a restore keeps them
            self.runtime.get_broadcast_state(desc)
        self.fn.open(self.runtime)

    def current_key(self) -> Any:
        """The key being processed (None before the first record): for error messages."""
        kkey = self.cursor.kkey
        return None if kkey is NO_KEY or not kkey else decoded(kkey)

    @property
    def side_outputs(self) -> dict[OutputTag, Batch]:
        """What the function emitted with ``ctx.output`` (after ``run``)."""
        return self.ctx.side

    def run(self, batches: list[tuple[int, Columns]], new_watermark: int) -> Batch:
        """``batches``: (input, columns) in processing order."""
        out_v: list[Any] = []
        out_t: list[Any] = []
        cursor, ctx = self.cursor, self.ctx
        routes = self.routes
        if any(r is not Route.KEYED for r in routes):
            order = (Route.BROADCAST, Route.FORWARD)
            keyless = [(s, b) for r in order for s, b in batches if routes[s] is r]
            self._keyless(keyless, out_v, out_t)
            batches = [(s, b) for s, b in batches if routes[s] is Route.KEYED]
        self._prefetch([b for _, b in batches])
        for side, (kkeys, values, stamps) in batches:
            process = self.handlers[side]
            for kk, key, value, ts in zip(kkeys, user_keys(kkeys), values, stamps, strict=True):
                cursor.kkey = kk
                ctx.current_key = key
                ctx.timestamp = ts
                result = process(value, ctx)
                if result is not None:
                    _collect(result, ts, out_v, out_t)
        # Timers: event time up to the new watermark, processing time up to the epoch's time.
        self.watermark = max(self.watermark, new_watermark)
        if not isinstance(self.fn, BroadcastProcessFunction | ProcessFunction):  # no key: no timers
            self._fire(self.fn, EVENT_TIME, self.watermark, out_v, out_t)
            self._fire(self.fn, PROCESSING_TIME, self.processing_time, out_v, out_t)
        self.fn.close()
        return out_v, out_t

    def _keyless(
        self, batches: list[tuple[int, Columns]], out_v: list[Any], out_t: list[Any]
    ) -> None:
        """The epoch's records without a key (broadcast, then forward), before its keyed
        records."""
        cursor, ctx = self.cursor, self.ctx
        cursor.kkey = NO_KEY
        ctx.current_key = None
        try:
            for side, (_, values, stamps) in batches:
                process = self.handlers[side]
                ctx.broadcast_writable = self.routes[side] is Route.BROADCAST
                for value, ts in zip(values, stamps, strict=True):
                    ctx.timestamp = ts
                    result = process(value, ctx)
                    if result is not None:
                        _collect(result, ts, out_v, out_t)
        finally:
            cursor.kkey = b""
            ctx.broadcast_writable = False

    def _prefetch(self, batches: list[Columns]) -> None:
        tables = [
            t
            for t in self.backend.tables.values()
            if isinstance(
                t.desc,
                ValueStateDescriptor
                | ReducingStateDescriptor
                | ListStateDescriptor
                | AggregatingStateDescriptor,
            )
        ]
        if all(t.complete for t in tables):  # absent keys need no read: nothing to gather
            return
        distinct = list(dict.fromkeys(chain.from_iterable(kkeys for kkeys, _, _ in batches)))
        self.backend.prefetch(tables, distinct)

    def _fire(
        self, fn: KeyedFunction, domain: int, bound: int, out_v: list[Any], out_t: list[Any]
    ) -> None:
        timers = self.backend.timers
        assert timers is not None
        kgs = range(self.backend.key_groups.start, self.backend.key_groups.end)
        cursor, ctx = self.cursor, self.ctx
        while True:
            due = timers.pop_due(domain, bound, kgs)
            if not due:
                return
            for ts, kk in due:
                cursor.kkey = kk
                ctx.current_key = decoded(kk)
                ctx.timestamp = ts
                result = fn.on_timer(ts, ctx)
                if result is not None:
                    _collect(result, ts, out_v, out_t)


class ReduceRunner:
    """Applies pre-combined contributions: one state read and one write per key per epoch."""

    def __init__(self, node: ReduceNode, backend: KeyedBackend) -> None:
        self.node, self.backend = node, backend
        counting = node.reduce_fn is _add and node.value_fn is _one
        self.table = backend.table(
            ReducingStateDescriptor(REDUCE_STATE, node.reduce_fn, INT64 if counting else PICKLE)
        )

    def current_key(self) -> Any:
        """Keys are reduced in bulk: no single key is current."""
        return None

    @property
    def side_outputs(self) -> dict[OutputTag, Batch]:
        return {}

    def run(self, batches: list[tuple[int, Columns]], new_watermark: int) -> Batch:
        reduce_fn = self.node.reduce_fn
        adding = reduce_fn is _add
        # Merge the upstream tasks' pre-combined entries (written as comprehensions and
        # dict operations: per-key Python statements dominate this operator's cost).
        sums: dict[bytes, Any] = {}
        last_ts: dict[bytes, Any] = {}
        for _, (kkeys, values, stamps) in batches:
            if not sums:
                sums = dict(zip(kkeys, values, strict=True))
            elif adding:
                get = sums.get
                sums.update(
                    [
                        (kk, v if (c := get(kk, MISSING)) is MISSING else c + v)
                        for kk, v in zip(kkeys, values, strict=True)
                    ]
                )
            else:
                get = sums.get
                sums.update(
                    [
                        (kk, v if (c := get(kk, MISSING)) is MISSING else reduce_fn(c, v))
                        for kk, v in zip(kkeys, values, strict=True)
                    ]
                )
            last_ts.update(zip(kkeys, stamps, strict=True))
        kks = list(sums)
        vals = list(sums.values())
        table = self.table
        self.backend.prefetch([table], kks)
        get = table.cache.get  # a complete cache lacks absent keys
        currents = [get(k, MISSING) for k in kks]
        cache = table.cache
        if adding:
            totals = [v if c is MISSING else c + v for c, v in zip(currents, vals, strict=True)]
        else:
            totals = [
                v if c is MISSING else reduce_fn(c, v) for c, v in zip(currents, vals, strict=True)
            ]
        cache.update(zip(kks, totals, strict=True))
        table.dirty.update(kks)
        # Keys are mostly strings (tag "s" after the 4-byte header): decode those inline.
        user_keys = [kk[5:].decode() if kk[4] == 0x73 else decoded(kk) for kk in kks]
        return list(zip(user_keys, totals, strict=True)), [last_ts[kk] for kk in kks]


_DECODED: dict[bytes, Any] = {}


def user_keys(kkeys: list[bytes]) -> list[Any]:
    """The user key of each kkey, looked up at C speed where memoized."""
    keys = list(map(_DECODED.get, kkeys))
    # Not memoized yet (or a key that is None: decoded again, harmless). By identity: ``in``
    # would call each user key's ``__eq__`` with None.
    if any(map(is_, keys, repeat(None))):
        keys = [decoded(kk) if key is None else key for kk, key in zip(kkeys, keys, strict=True)]
    return keys


def decoded(kkey: bytes) -> Any:
    """The user key of a kkey, memoized (keys recur across epochs; decoding is not free)."""
    key = _DECODED.get(kkey, MISSING)
    if key is MISSING:
        if len(_DECODED) >= 2_000_000:
            _DECODED.clear()
        key = _DECODED[kkey] = decode_key(kkey[4:])
    return key


def _collect(result: Iterable[Any], ts: Any, out_v: list[Any], out_t: list[Any]) -> None:
    """A function's output records, each with the timestamp of what produced it (``ts``) or
    its own (``Timestamped``)."""
    for o in result:
        if type(o) is Timestamped:
            out_v.append(o.value)
            out_t.append(o.timestamp)
        else:
            out_v.append(o)
            out_t.append(ts)
