"""Two-input jobs shared by the unit tests (in-process) and the Spark tests: orders and
payments connected by key, with a side output; a keyed count with broadcast resets."""

from __future__ import annotations

from collections import Counter
from typing import Any

from stator.api.functions import (
    Context,
    KeyedBroadcastProcessFunction,
    KeyedCoProcessFunction,
    OutputTag,
    RuntimeContext,
    ValueState,
)
from stator.api.operator_state import ReadOnlyStateError
from stator.api.pipeline import Pipeline
from stator.api.time import BoundedOutOfOrderness
from stator.sinks.collect import CollectSink
from stator.sources.generator import list_source
from stator.state.descriptors import MapStateDescriptor, ValueStateDescriptor
from tests.unit.inprocess_run import list_epochs

ORDERS = [(f"o{i % 7}", i, i * 10) for i in range(60)]  # (id, amount, ts)
PAYMENTS = [(f"o{i % 7}", -i, i * 10 + 5) for i in range(0, 60, 2)]


class Match(KeyedCoProcessFunction):
    """Per key: the running sum of input 1 and of input 2; emits both on every record, and
    the final balance from an event-time timer once both inputs' watermark passes 1000."""

    def open(self, ctx: RuntimeContext) -> None:
        self.orders: ValueState = ctx.get_state(ValueStateDescriptor("orders"))
        self.paid: ValueState = ctx.get_state(ValueStateDescriptor("paid"))

    def process_element1(self, value: Any, ctx: Context) -> list[Any]:
        total = self.orders.value(0) + value[1]
        self.orders.update(total)
        ctx.timer_service.register_event_time_timer(1000)
        return [("order", ctx.current_key, total)]

    def process_element2(self, value: Any, ctx: Context) -> list[Any]:
        total = self.paid.value(0) + value[1]
        self.paid.update(total)
        if total < -100:
            ctx.output(BIG, (ctx.current_key, total))
        return [("paid", ctx.current_key, total)]

    def on_timer(self, timestamp: int, ctx: Context) -> list[Any]:
        wm = ctx.timer_service.current_watermark()
        return [("balance", ctx.current_key, self.orders.value(0) + self.paid.value(0), wm)]


BIG = OutputTag("big-payments")


def expected_match() -> tuple[Counter[Any], Counter[Any]]:
    main: Counter[Any] = Counter()
    side: Counter[Any] = Counter()
    orders: dict[str, int] = {}
    paid: dict[str, int] = {}
    for key, amount, _ in ORDERS:
        orders[key] = orders.get(key, 0) + amount
        main[("order", key, orders[key])] += 1
    for key, amount, _ in PAYMENTS:
        paid[key] = paid.get(key, 0) + amount
        main[("paid", key, paid[key])] += 1
        if paid[key] < -100:
            side[(key, paid[key])] += 1
    return main, side


def expected_balances() -> list[tuple[str, int]]:
    """Each key's final balance (what the timer at 1000 emits once both inputs pass it)."""
    totals: Counter[str] = Counter()
    for key, amount, _ in [*ORDERS, *PAYMENTS]:
        totals[key] += amount
    return sorted(totals.items())


def connected(out: CollectSink, big: CollectSink, delay: int = 0) -> Pipeline:
    p = Pipeline("connected", max_parallelism=8)
    orders = p.source(
        list_source(ORDERS),
        uid="orders",
        timestamps=lambda r: r[2],
        watermarks=BoundedOutOfOrderness(delay),
    )
    payments = p.source(list_source(PAYMENTS), uid="payments", timestamps=lambda r: r[2])
    matched = orders.key_by(lambda r: r[0]).connect(payments.key_by(lambda r: r[0]))
    stream = matched.process(Match(), uid="match")
    stream.sink(out, uid="out")
    stream.side_output(BIG).sink(big, uid="big")
    return p


RESET = "reset"


class Counting(KeyedBroadcastProcessFunction):
    """Counts per key; a broadcast "reset" clears every key's count (apply_to_keyed_state),
    and each subtask acknowledges every broadcast record it applied."""

    def open(self, ctx: RuntimeContext) -> None:
        self.count: ValueState = ctx.get_state(ValueStateDescriptor("count"))
        self.subtask = ctx.subtask_index

    def process_element(self, value: Any, ctx: Any) -> list[Any]:
        n = self.count.value(0) + 1
        self.count.update(n)
        rules = ctx.get_broadcast_state(APPLIED)
        try:
            rules.put("x", 1)
        except ReadOnlyStateError:
            pass
        else:
            return [("broadcast state written from a keyed record", value)]
        return [("count", ctx.current_key, n, rules.get("rules", 0))]

    def process_broadcast_element(self, value: Any, ctx: Any) -> list[Any]:
        out: list[Any] = [("ack", value, self.subtask)]
        applied = ctx.get_broadcast_state(APPLIED)
        applied.put("rules", applied.get("rules", 0) + 1)
        try:
            self.count.value()
        except RuntimeError as exc:
            assert "apply_to_keyed_state" in str(exc)
        else:
            out.append(("keyed state reached without a key", value))
        if value[0] == RESET:
            ctx.apply_to_keyed_state(ValueStateDescriptor("count"), clear)
        return out


def clear(key: Any, state: ValueState) -> None:
    state.clear()


KEYED = [f"k{i % 5}" for i in range(60)]
APPLIED = MapStateDescriptor("applied")
RULES = [(RESET if i % 4 == 3 else "noop", i) for i in range(20)]


def broadcast_counts(out: CollectSink) -> Pipeline:
    """Epochs as ``list_epochs`` gives them for ``epoch.max_records``."""
    p = Pipeline("bcast", max_parallelism=8)
    events = p.source(list_source(KEYED), uid="events")
    control = p.source(list_source(RULES), uid="rules")
    events.key_by(lambda k: k).connect(control.broadcast(APPLIED)).process(
        Counting(), uid="c"
    ).sink(out, uid="out")
    return p


def expected_broadcast_counts(max_records: int = 20) -> Counter[Any]:
    """Per epoch, the epoch's broadcast records first, then its keyed records (each sees
    how many broadcast records its subtask's broadcast state has applied so far)."""
    expected: Counter[Any] = Counter()
    counts: dict[str, int] = {}
    applied = 0
    for (k0, k1), (r0, r1) in list_epochs([len(KEYED), len(RULES)], max_records):
        rules = RULES[r0:r1]
        applied += len(rules)
        if any(rule == RESET for rule, _ in rules):
            counts.clear()
        for key in KEYED[k0:k1]:
            counts[key] = counts.get(key, 0) + 1
            expected[("count", key, counts[key], applied)] += 1
    return expected
