"""The state API's model: a keyed process function that runs a random program of state and
timer operations and outputs every read (:class:`Program`), and what a plain-Python model of
the same program outputs (:func:`model`). The unit test drives it with hypothesis through
the real driver and tasks (``unit/test_state_model.py``); the integration test runs it on
Spark (``integration/test_state_model_spark.py``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from stator.api.functions import Context, KeyedProcessFunction, RuntimeContext
from stator.state.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from stator.state.ttl import StateTtlConfig, TtlUpdateType

# ---------------------------------------------------------------------------- the program

Op = tuple[Any, ...]
Record = tuple[str, int, int, tuple[Op, ...]]  # (key, sequence number, timestamp, ops)
TTL_MS = 25
CLEANUP_SCAN = 7  # entries per commit: a test's small state is cleaned up in a few epochs


class SumCount:
    """An aggregate function (``api.windows.Aggregate``): (sum, count) of the added values."""

    def create(self) -> Any:
        return (0, 0)

    def add(self, acc: Any, value: Any) -> Any:
        return (acc[0] + value, acc[1] + 1)

    def merge(self, a: Any, b: Any) -> Any:
        return (a[0] + b[0], a[1] + b[1])

    def result(self, acc: Any) -> Any:
        return acc


class Program(KeyedProcessFunction):
    """Runs each record's operations on its key's state; every read is output, with the
    processing time the record saw (TTL expiry depends on it)."""

    def __init__(self, ttl_ms: int = TTL_MS) -> None:
        self.ttl_ms = ttl_ms

    def open(self, ctx: RuntimeContext) -> None:
        self.v = ctx.get_state(ValueStateDescriptor("v"))
        self.lst = ctx.get_state(ListStateDescriptor("l"))
        self.m = ctx.get_state(MapStateDescriptor("m"))
        self.r = ctx.get_state(ReducingStateDescriptor("r"))
        self.a = ctx.get_state(AggregatingStateDescriptor("a", SumCount()))
        on_write = StateTtlConfig(self.ttl_ms, cleanup_scan_per_epoch=CLEANUP_SCAN)
        on_read = StateTtlConfig(
            self.ttl_ms, TtlUpdateType.ON_READ_AND_WRITE, cleanup_scan_per_epoch=CLEANUP_SCAN
        )
        self.tv = ctx.get_state(ValueStateDescriptor("tv", ttl=on_write))
        self.tl = ctx.get_state(ListStateDescriptor("tl", ttl=on_read))
        self.tm = ctx.get_state(MapStateDescriptor("tm", ttl=on_read))
        self.tr = ctx.get_state(ReducingStateDescriptor("tr", ttl=on_read))
        self.ta = ctx.get_state(AggregatingStateDescriptor("ta", SumCount(), ttl=on_write))

    def process_element(self, value: Record, ctx: Context) -> Iterable[Any]:
        key, seq, _, ops = value
        reads = tuple(self._op(op, ctx) for op in ops)
        now = ctx.timer_service.current_processing_time()
        return [(key, ("record", seq, now, reads))]

    def on_timer(self, timestamp: int, ctx: Context) -> Iterable[Any]:
        out = [(ctx.current_key, ("fire", timestamp, self.v.value(), self.r.get(), self.lst.get()))]
        self.v.clear()  # the pattern of the bug report: clear in on_timer, read again later
        if timestamp % 2 == 0:  # fires in the same epoch's next round if already due
            ctx.timer_service.register_event_time_timer(timestamp + 1)
        return out

    def _op(self, op: Op, ctx: Context) -> Any:  # noqa: PLR0911, PLR0912 - one case per op
        name, args = op[0], op[1:]
        if name == "v.get":
            return self.v.value()
        if name == "v.set":
            self.v.update(args[0])
        elif name == "v.clear":
            self.v.clear()
        elif name == "v.due":  # keep the latest due time; register a timer when it grows
            prev = self.v.value()
            if prev is None or args[0] > prev:
                ctx.timer_service.register_event_time_timer(args[0])
                self.v.update(args[0])
            return prev
        elif name == "l.get":
            return self.lst.get()
        elif name == "l.add":
            self.lst.add(args[0])
        elif name == "l.update":
            self.lst.update(list(args[0]))
        elif name == "l.clear":
            self.lst.clear()
        elif name == "m.get":
            return self.m.get(args[0])
        elif name == "m.put":
            self.m.put(args[0], args[1])
        elif name == "m.remove":
            self.m.remove(args[0])
        elif name == "m.contains":
            return self.m.contains(args[0])
        elif name == "m.items":
            return sorted(self.m.items())
        elif name == "m.empty":
            return self.m.is_empty()
        elif name == "m.clear":
            self.m.clear()
        elif name == "r.get":
            return self.r.get()
        elif name == "r.add":
            self.r.add(args[0])
        elif name == "r.clear":
            self.r.clear()
        elif name == "t.reg":
            ctx.timer_service.register_event_time_timer(args[0])
        elif name == "t.del":
            ctx.timer_service.delete_event_time_timer(args[0])
        else:
            return self._more(name, args)
        return None

    def _more(self, name: str, args: Op) -> Any:  # noqa: PLR0911, PLR0912 - one case per op
        """The aggregating and TTL-enabled states' operations."""
        if name == "a.get":
            return self.a.get()
        if name == "a.add":
            self.a.add(args[0])
        elif name == "a.clear":
            self.a.clear()
        elif name == "tv.get":
            return self.tv.value()
        elif name == "tv.set":
            self.tv.update(args[0])
        elif name == "tv.clear":
            self.tv.clear()
        elif name == "tl.get":
            return self.tl.get()
        elif name == "tl.add":
            self.tl.add(args[0])
        elif name == "tl.update":
            self.tl.update(list(args[0]))
        elif name == "tm.get":
            return self.tm.get(args[0])
        elif name == "tm.put":
            self.tm.put(args[0], args[1])
        elif name == "tm.remove":
            self.tm.remove(args[0])
        elif name == "tm.contains":
            return self.tm.contains(args[0])
        elif name == "tm.items":
            return sorted(self.tm.items())
        elif name == "tm.empty":
            return self.tm.is_empty()
        elif name == "tr.get":
            return self.tr.get()
        elif name == "tr.add":
            self.tr.add(args[0])
        elif name == "ta.get":
            return self.ta.get()
        elif name == "ta.add":
            self.ta.add(args[0])
        else:
            raise AssertionError(f"unknown op {name}")
        return None


# ---------------------------------------------------------------------------- the model


Stamped = tuple[int, Any]  # (last access time, value) of a TTL-enabled value


@dataclass
class KeyModel:
    v: Any = None
    lst: list[Any] = field(default_factory=list)
    m: dict[Any, Any] = field(default_factory=dict)
    r: Any = None
    a: Any = None
    timers: set[int] = field(default_factory=set)
    # TTL-enabled: tv and ta refresh on write, tl, tm and tr on read and write
    tv: Stamped | None = None
    tl: list[Stamped] = field(default_factory=list)
    tm: dict[Any, Stamped] = field(default_factory=dict)
    tr: Stamped | None = None
    ta: Stamped | None = None
    now: int = 0
    ttl: int = TTL_MS

    def live(self, stamped: Stamped | None) -> bool:
        return stamped is not None and stamped[0] + self.ttl > self.now


def record_times(out: dict[str, list[Any]]) -> dict[int, int]:
    """The processing time each record saw (sequence number -> ms), from the job's output."""
    return {item[1]: item[2] for items in out.values() for item in items if item[0] == "record"}


def model(
    records: list[Record],
    epoch_size: int,
    delay: int,
    times: dict[int, int],
    ttl_ms: int = TTL_MS,
) -> dict[str, list[Any]]:
    """What the job must output, per key in order: records in input order; after each epoch
    (``epoch_size`` records), timers up to the watermark in rounds, as the runtime fires
    them; all remaining timers once the input ends. ``times``: the processing time each
    record saw (the job's clock; ``record_times``), against which TTL-enabled state expires."""
    keys: dict[str, KeyModel] = {}
    out: dict[str, list[Any]] = {}
    max_ts: int | None = None
    for start in range(0, len(records), epoch_size):
        for key, seq, ts, ops in records[start : start + epoch_size]:
            s = keys.setdefault(key, KeyModel(ttl=ttl_ms))
            s.now = times.get(seq, 0)
            reads = tuple(_model_op(s, op) for op in ops)
            out.setdefault(key, []).append(("record", seq, s.now, reads))
            max_ts = ts if max_ts is None else max(max_ts, ts)
        final = start + epoch_size >= len(records)
        bound = 2**63 - 1 if final else (max_ts - delay if max_ts is not None else None)
        if bound is not None:
            _fire(keys, out, bound)
    return out


def _fire(keys: dict[str, KeyModel], out: dict[str, list[Any]], bound: int) -> None:
    while True:
        due = {k: sorted(t for t in s.timers if t <= bound) for k, s in keys.items()}
        if not any(due.values()):
            return
        for key, stamps in due.items():
            keys[key].timers.difference_update(stamps)
        for key, stamps in due.items():
            s = keys[key]
            for ts in stamps:
                l_copy = list(s.lst)
                out.setdefault(key, []).append(("fire", ts, s.v, s.r, l_copy))
                s.v = None
                if ts % 2 == 0:
                    s.timers.add(ts + 1)


def _model_op(s: KeyModel, op: Op) -> Any:  # noqa: PLR0911, PLR0912 - one case per op
    name, args = op[0], op[1:]
    if name == "v.get":
        return s.v
    if name == "v.set":
        s.v = args[0]
    elif name == "v.clear":
        s.v = None
    elif name == "v.due":
        prev = s.v
        if prev is None or args[0] > prev:
            s.timers.add(args[0])
            s.v = args[0]
        return prev
    elif name == "l.get":
        return list(s.lst)
    elif name == "l.add":
        s.lst.append(args[0])
    elif name == "l.update":
        s.lst = list(args[0])
    elif name == "l.clear":
        s.lst = []
    elif name == "m.get":
        return s.m.get(args[0])
    elif name == "m.put":
        s.m[args[0]] = args[1]
    elif name == "m.remove":
        s.m.pop(args[0], None)
    elif name == "m.contains":
        return args[0] in s.m
    elif name == "m.items":
        return sorted(s.m.items())
    elif name == "m.empty":
        return not s.m
    elif name == "m.clear":
        s.m = {}
    elif name == "r.get":
        return s.r
    elif name == "r.add":
        s.r = args[0] if s.r is None else s.r + args[0]
    elif name == "r.clear":
        s.r = None
    elif name == "t.reg":
        s.timers.add(args[0])
    elif name == "t.del":
        s.timers.discard(args[0])
    else:
        return _model_more(s, name, args)
    return None


def _model_more(s: KeyModel, name: str, args: Op) -> Any:  # noqa: PLR0911, PLR0912
    """Aggregating and TTL-enabled states, as Flink's TTL defines them (NEVER_RETURN_EXPIRED:
    an expired value reads as absent; ON_READ_AND_WRITE: a read restarts its time)."""
    now = s.now
    if name == "a.get":
        return s.a
    if name == "a.add":
        s.a = (args[0], 1) if s.a is None else (s.a[0] + args[0], s.a[1] + 1)
    elif name == "a.clear":
        s.a = None
    elif name == "tv.get":
        return s.tv[1] if s.tv is not None and s.live(s.tv) else None
    elif name == "tv.set":
        s.tv = (now, args[0])
    elif name == "tv.clear":
        s.tv = None
    elif name == "tl.get":
        s.tl = [(now, v) for stamp, v in s.tl if s.live((stamp, v))]
        return [v for _, v in s.tl]
    elif name == "tl.add":
        s.tl.append((now, args[0]))
    elif name == "tl.update":
        s.tl = [(now, v) for v in args[0]]
    elif name in ("tm.get", "tm.contains"):
        entry = s.tm.get(args[0])
        if entry is not None and s.live(entry):
            s.tm[args[0]] = (now, entry[1])
            return True if name == "tm.contains" else entry[1]
        s.tm.pop(args[0], None)
        return False if name == "tm.contains" else None
    elif name == "tm.put":
        s.tm[args[0]] = (now, args[1])
    elif name == "tm.remove":
        s.tm.pop(args[0], None)
    elif name == "tm.items":
        s.tm = {k: (now, e[1]) for k, e in s.tm.items() if s.live(e)}
        return sorted((k, e[1]) for k, e in s.tm.items())
    elif name == "tm.empty":
        return not any(s.live(e) for e in s.tm.values())
    elif name == "tr.get":
        if s.tr is not None and s.live(s.tr):
            s.tr = (now, s.tr[1])
            return s.tr[1]
        return None
    elif name == "tr.add":
        s.tr = (now, args[0] + s.tr[1] if s.tr is not None and s.live(s.tr) else args[0])
    elif name == "ta.get":
        return s.ta[1] if s.ta is not None and s.live(s.ta) else None
    elif name == "ta.add":
        acc = s.ta[1] if s.ta is not None and s.live(s.ta) else (0, 0)
        s.ta = (now, (acc[0] + args[0], acc[1] + 1))
    else:
        raise AssertionError(f"unknown op {name}")
    return None
