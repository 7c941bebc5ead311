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
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)

# ---------------------------------------------------------------------------- the program

Op = tuple[Any, ...]
Record = tuple[str, int, int, tuple[Op, ...]]  # (key, sequence number, timestamp, ops)


class Program(KeyedProcessFunction):
    """Runs each record's operations on its key's state; every read is output."""

    def open(self, ctx: RuntimeContext) -> None:
        self.v = ctx.get_state(ValueStateDescriptor("v"))
        self.lst = ctx.get_state(ListStateDescriptor("l"))
        self.m = ctx.get_state(MapStateDescriptor("m"))
        self.r = ctx.get_state(ReducingStateDescriptor("r"))

    def process_element(self, value: Record, ctx: Context) -> Iterable[Any]:
        key, seq, _, ops = value
        reads = tuple(self._op(op, ctx) for op in ops)
        return [(key, ("record", seq, reads))]

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
            raise AssertionError(f"unknown op {name}")
        return None


# ---------------------------------------------------------------------------- the model


@dataclass
class KeyModel:
    v: Any = None
    lst: list[Any] = field(default_factory=list)
    m: dict[Any, Any] = field(default_factory=dict)
    r: Any = None
    timers: set[int] = field(default_factory=set)


def model(records: list[Record], epoch_size: int, delay: int) -> dict[str, list[Any]]:
    """What the job must output, per key in order: records in input order; after each epoch
    (``epoch_size`` records), timers up to the watermark in rounds, as the runtime fires
    them; all remaining timers once the input ends."""
    keys: dict[str, KeyModel] = {}
    out: dict[str, list[Any]] = {}
    max_ts: int | None = None
    for start in range(0, len(records), epoch_size):
        for key, seq, ts, ops in records[start : start + epoch_size]:
            s = keys.setdefault(key, KeyModel())
            out.setdefault(key, []).append(("record", seq, tuple(_model_op(s, op) for op in ops)))
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
    return None
