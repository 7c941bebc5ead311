"""What ``examples/fraud_detection.py`` must output, computed in plain Python from its
generated input: the model its tests compare the job's output with, record for record."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from examples.fraud_detection import (
    CHANGE_WINDOW_MS,
    DAY_MS,
    EVENTS_EVERY,
    LIMITS,
    SESSION_GAP_MS,
    Alert,
    Transaction,
    account_event,
    is_late,
    limits_at,
    transaction,
)
from stator.api.windows import Windowed


def expected(transactions: int) -> tuple[Counter[Any], Counter[Any], Counter[Any]]:
    """(alerts, sessions, late transactions) of a run over ``transactions`` transactions, in
    epochs that span less event time than the late transactions are behind."""
    txns = [transaction(i) for i in range(transactions)]
    events = [account_event(j) for j in range(transactions // EVENTS_EVERY)]
    on_time = [t for t in txns if not is_late(t)]
    alerts: Counter[Any] = Counter()
    events_of: dict[str, list[Any]] = defaultdict(list)
    for e in events:
        events_of[e.account].append(e)
    for t in on_time:  # the interval join: an event at most CHANGE_WINDOW_MS before
        for e in events_of[t.account]:
            if t.ts - CHANGE_WINDOW_MS <= e.ts <= t.ts:
                alerts[Alert("after-account-change", t.account, t.txn_id, e.kind)] += 1
    for t in txns:  # every transaction's single-payment limit
        limits = limits_at(t.ts, LIMITS)
        if t.amount > limits.single:
            alerts[Alert("over-limit", t.account, t.txn_id, limits.single)] += 1
    per_account: dict[str, list[Transaction]] = defaultdict(list)
    for t in sorted(on_time, key=lambda t: t.ts):
        per_account[t.account].append(t)
    sessions: Counter[Any] = Counter()
    for account, ts in per_account.items():
        alerts.update(_daily_limits(account, ts))
        sessions.update(_sessions(account, ts))
    late = Counter(t for t in txns if is_late(t))
    return alerts, sessions, late


def _daily_limits(account: str, ts: list[Transaction]) -> list[Alert]:
    """The first transaction of a day past the daily limit, in event-time order."""
    out, spent = [], {}
    for t in ts:
        day = t.ts // DAY_MS
        before = spent.get(day, 0)
        spent[day] = before + t.amount
        daily = limits_at(t.ts, LIMITS).daily
        if before <= daily < before + t.amount:
            out.append(Alert("daily-limit", account, t.txn_id, daily))
    return out


def _sessions(account: str, ts: list[Transaction]) -> list[Windowed]:
    out = []
    start, end, total = ts[0].ts, ts[0].ts + SESSION_GAP_MS, ts[0].amount
    for t in ts[1:]:
        if t.ts < end:
            end, total = max(end, t.ts + SESSION_GAP_MS), total + t.amount
        else:
            out.append(Windowed(account, start, end, total))
            start, end, total = t.ts, t.ts + SESSION_GAP_MS, t.amount
    out.append(Windowed(account, start, end, total))
    return out
