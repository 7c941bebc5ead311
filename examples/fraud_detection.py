"""Fraud detection: the shape of a production job, on Stator.

Card transactions and account events (address changed, card replaced) arrive on two
streams; spending limits arrive on a third, at run time. The job raises three kinds of alert
and keeps spending sessions:

- **after an account change**: a transaction within ``CHANGE_WINDOW_MS`` after an event on the
  same account (an interval join of the two keyed streams);
- **over the limit**: a transaction above the single-payment limit in force at its event time
  (limits are broadcast to every subtask and kept in broadcast state; a transaction is
  checked once the watermark of both inputs passes it, so a limit that arrived late still
  applies by its own timestamp; a late transaction is checked at once);
- **daily limit**: the first transaction that takes an account's spending of the day past
  the daily limit in force (per-account state that expires after two days: state TTL);
- **sessions**: spending per account in session windows; transactions too late for their
  window go to a side output instead of being dropped.

The inputs are generated deterministically (so tests compare the output record for record).
``build`` wires the job to any sinks; ``pipeline`` is what ``stator run`` loads, with file
sinks under ``STATOR_FRAUD_OUT`` (default ``file:///tmp/stator-data/fraud``)::

    stator run examples/fraud_detection.py:pipeline
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from stator import (
    INT64,
    BoundedOutOfOrderness,
    KeyedBroadcastProcessFunction,
    MapStateDescriptor,
    OutputTag,
    Pipeline,
    RuntimeContext,
    ValueStateDescriptor,
)
from stator.api.windows import Session, Sum
from stator.sinks import FileSink
from stator.sinks.base import Sink
from stator.sources import GeneratorSource
from stator.sources.generator import list_source
from stator.state.ttl import StateTtlConfig

ACCOUNTS = 400
MS_PER_TRANSACTION = 200  # event time between consecutive transactions
EVENTS_EVERY = 10  # one account event per this many transactions' time
CHANGE_WINDOW_MS = 120_000  # "after an account change": within two minutes
SESSION_GAP_MS = 60_000
LATE_EVERY = 499  # one transaction in this many arrives 20 minutes late ...
LATE_AFTER_MS = 2_400_000  # ... once the job is 40 minutes into event time
LATE_BY_MS = 1_200_000 + 100  # (+100: never on the timestamp of an on-time transaction)
DAY_MS = 86_400_000
_MULT = 2654435761


class Transaction(NamedTuple):
    txn_id: int
    account: str
    amount: int  # cents
    ts: int


class AccountEvent(NamedTuple):
    account: str
    kind: str
    ts: int


class Limits(NamedTuple):
    """Limits in force from ``ts`` on (event time)."""

    ts: int
    single: int
    daily: int


class Alert(NamedTuple):
    kind: str
    account: str
    txn_id: int
    detail: Any


# Limits change during the run: tighter after the first hour, looser later.
LIMITS = [
    Limits(0, 90_000, 400_000),
    Limits(3_600_000, 60_000, 250_000),
    Limits(7_200_000, 95_000, 500_000),
    Limits(10_800_000, 50_000, 200_000),
]


def _account(i: int, salt: int) -> str:
    return f"acct-{((i * _MULT + salt) & 0xFFFFFFFF) % ACCOUNTS}"


def transaction(i: int) -> Transaction:
    """Transaction ``i``: the same on every call (how replays and tests see the same input)."""
    amount = (i * 7919) % 40_000 + (80_000 if i % 97 == 0 else 0)
    ts = i * MS_PER_TRANSACTION
    if i % LATE_EVERY == 0 and ts >= LATE_AFTER_MS:
        ts -= LATE_BY_MS
    return Transaction(i, _account(i, 17), amount, ts)


def account_event(j: int) -> AccountEvent:
    kind = "address-changed" if j % 3 else "card-replaced"
    return AccountEvent(_account(j, 91), kind, j * EVENTS_EVERY * MS_PER_TRANSACTION)


def is_late(txn: Transaction) -> bool:
    """The generator's late transactions (20 minutes behind: late for every operator once
    an epoch spans less event time than that)."""
    return txn.ts != txn.txn_id * MS_PER_TRANSACTION


@dataclass(frozen=True)
class Transactions:
    def make(self, start: int, stop: int, step: int) -> list[Any]:
        return [transaction(i) for i in range(start, stop, step)]


@dataclass(frozen=True)
class AccountEvents:
    def make(self, start: int, stop: int, step: int) -> list[Any]:
        return [account_event(j) for j in range(start, stop, step)]


LATE = OutputTag("late-transactions")
LIMITS_STATE = MapStateDescriptor("limits", key_serializer=INT64)


class CheckLimits(KeyedBroadcastProcessFunction):
    """Limits from the broadcast stream; each transaction checked against the limits in
    force at its timestamp, once the watermark passes it (by then every limit up to that
    time has arrived)."""

    def open(self, ctx: RuntimeContext) -> None:
        self.pending = ctx.get_state(MapStateDescriptor("pending", key_serializer=INT64))
        # (day, spent that day); gone two days after its last write.
        self.spent = ctx.get_state(
            ValueStateDescriptor("spent-today", ttl=StateTtlConfig(ttl_ms=2 * DAY_MS))
        )

    def process_broadcast_element(self, value: Limits, ctx: Any) -> None:
        ctx.get_broadcast_state(LIMITS_STATE).put(value.ts, value)

    def process_element(self, value: Transaction, ctx: Any) -> Iterable[Any] | None:
        if value.ts <= ctx.timer_service.current_watermark():
            # Too late to take its turn in event-time order: its single-payment limit now.
            limits = limits_at(value.ts, ctx.get_broadcast_state(LIMITS_STATE).values())
            if value.amount > limits.single:
                return [Alert("over-limit", value.account, value.txn_id, limits.single)]
            return None
        self.pending.put(value.ts, [*self.pending.get(value.ts, []), value])
        ctx.timer_service.register_event_time_timer(value.ts)
        return None

    def on_timer(self, timestamp: int, ctx: Any) -> Iterable[Any]:
        limits = limits_at(timestamp, ctx.get_broadcast_state(LIMITS_STATE).values())
        out = []
        for txn in self.pending.get(timestamp, []):
            if txn.amount > limits.single:
                out.append(Alert("over-limit", txn.account, txn.txn_id, limits.single))
            day = txn.ts // DAY_MS
            spent_day, spent = self.spent.value((day, 0))
            before = spent if spent_day == day else 0
            self.spent.update((day, before + txn.amount))
            if before <= limits.daily < before + txn.amount:
                out.append(Alert("daily-limit", txn.account, txn.txn_id, limits.daily))
        self.pending.remove(timestamp)
        return out


def limits_at(ts: int, known: Iterable[Limits]) -> Limits:
    """The limits in force at ``ts``: the newest that started at or before it."""
    return max((lim for lim in known if lim.ts <= ts), key=lambda lim: lim.ts)


def after_change(txn: Transaction, event: AccountEvent) -> Alert:
    return Alert("after-account-change", txn.account, txn.txn_id, event.kind)


def build(
    alerts: Sink,
    sessions: Sink,
    late: Sink,
    transactions: int = 60_000,
    splits: int = 2,
    max_parallelism: int = 128,
    rate: float | None = None,
) -> Pipeline:
    """The job, writing to the given sinks; ``transactions``: how many (200 ms of event time
    each; account events are a tenth of that); ``rate``: transactions per second (account
    events follow at a tenth), or as fast as epochs allow."""
    p = Pipeline("fraud-detection", max_parallelism=max_parallelism)
    txns = p.source(
        GeneratorSource(Transactions(), count=transactions, splits=splits, rate_per_second=rate),
        uid="transactions",
        timestamps=lambda t: t.ts,
        watermarks=BoundedOutOfOrderness(max_delay_ms=1_000),
    )
    events = p.source(
        GeneratorSource(
            AccountEvents(),
            count=transactions // EVENTS_EVERY,
            splits=1,
            rate_per_second=rate / EVENTS_EVERY if rate else None,
        ),
        uid="account-events",
        timestamps=lambda e: e.ts,
    )
    limits = p.source(list_source(LIMITS), uid="limits", timestamps=lambda lim: lim.ts)
    by_account = txns.key_by(lambda t: t.account)

    joined = by_account.interval_join(
        events.key_by(lambda e: e.account),
        -CHANGE_WINDOW_MS,
        0,
        uid="after-account-change",
        join=after_change,
    )
    checked = by_account.connect(limits.broadcast(LIMITS_STATE)).process(
        CheckLimits(), uid="limits-check"
    )
    joined.union(checked).sink(alerts, uid="alerts")

    spending = by_account.window(
        Session(SESSION_GAP_MS),
        Sum(lambda t: t.amount),
        uid="sessions",
        late_output=LATE,
    )
    spending.sink(sessions, uid="sessions-out")
    spending.side_output(LATE).sink(late, uid="late-out")
    return p


def pipeline() -> Pipeline:
    out = os.environ.get("STATOR_FRAUD_OUT", "file:///tmp/stator-data/fraud").rstrip("/")
    count = int(os.environ.get("STATOR_FRAUD_TRANSACTIONS", "60000"))
    rate = os.environ.get("STATOR_FRAUD_RATE")  # transactions per second; unset: no limit
    return build(
        FileSink(f"{out}/alerts"),
        FileSink(f"{out}/sessions"),
        FileSink(f"{out}/late"),
        transactions=count,
        rate=float(rate) if rate else None,
    )
