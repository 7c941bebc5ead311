"""Planning epochs: where every source split stands, what the next epoch reads, and whether
it takes a checkpoint.

Planning is deterministic for given positions and available input, so a job rewound to a
checkpoint re-reads exactly the records it read before.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from ..api.nodes import SourceNode
from ..api.time import MIN_TIMESTAMP
from ..checkpoint.coordinator import now_ms
from ..config import CheckpointConfig, EpochConfig
from ..epoch.reports import SplitReport
from ..sources.base import SplitLag, SplitRange, SplitState
from .epoch_budget import EpochBudget
from .idleness import IdleTracker

log = logging.getLogger("stator.planning")

Plan = dict[str, list[SplitRange]]  # source uid -> ranges, in split order


class EpochPlanner:
    """Source positions per split and the ranges of the next epoch."""

    def __init__(self, sources: dict[str, SourceNode], config: EpochConfig) -> None:
        self.sources, self.config = sources, config
        self.positions: dict[str, dict[str, SplitState]] = {}
        self.discovered_ms: dict[str, int] = {}  # source uid -> its last discovery
        self.idle = IdleTracker({uid: node.watermarks.idleness_ms for uid, node in sources.items()})
        self.budget = EpochBudget(config.max_records, config.max_ms)

    def rewind(self, restored: dict[str, dict[str, dict[str, Any]]] | None) -> None:
        """Positions from a checkpoint or savepoint (None: every split from its start mode).
        Splits a restored source's snapshot does not know appeared after the job first
        started (discovered while running, or since): they start at their beginning
        (``Source.new_split_position``), so a rewound job re-reads what it read before. A
        source the snapshot does not know at all starts by its start mode."""
        restored = restored or {}
        positions: dict[str, dict[str, SplitState]] = {}
        for uid, node in self.sources.items():
            known = restored.get(uid)
            start = (
                node.source.initial_position if known is None else node.source.new_split_position
            )
            splits: dict[str, SplitState | None] = dict.fromkeys(node.source.discover_splits())
            splits.update(dict.fromkeys(known or {}))  # known but gone: kept, at the end
            for split in splits:
                if known is not None and split in known:
                    position = SplitState.from_json(known[split])
                    # The source decides again whether a split is at its end: a bounded
                    # source may have been given more input since (costs at most one empty
                    # epoch).
                    position.finished = False
                    splits[split] = position
                else:
                    splits[split] = SplitState(start(split), MIN_TIMESTAMP)
            positions[uid] = _in_order(node, {s: st for s, st in splits.items() if st})
        self.positions = positions
        self.budget.reset()  # restored state and new workers: measured again
        now = now_ms()
        self.discovered_ms = dict.fromkeys(self.sources, now)
        self.idle.reset(now)

    def rediscover(self, now: int) -> None:
        """Sources due for discovery (``Source.discovery_interval_ms``) are asked for their
        splits again; new ones join at their beginning. A failing discovery is logged and
        tried again at the next interval: the known splits go on."""
        for uid, node in self.sources.items():
            interval = node.source.discovery_interval_ms
            if interval <= 0 or now - self.discovered_ms.get(uid, now) < interval:
                continue
            self.discovered_ms[uid] = now
            try:
                found = node.source.discover_splits()
                known = self.positions[uid]
                new = {
                    s: SplitState(node.source.new_split_position(s), MIN_TIMESTAMP)
                    for s in found
                    if s not in known
                }
            except Exception as exc:
                log.warning("source '%s': discovering splits failed: %s", uid, exc)
                continue
            if new:
                log.info("source '%s': new splits %s", uid, ", ".join(new))
                self.positions[uid] = _in_order(node, {**known, **new})

    def finished(self) -> bool:
        """Every split of every source is exhausted (and the job may end, if configured)."""
        if not self.config.stop_when_finished:
            return False
        return all(s.finished for splits in self.positions.values() for s in splits.values())

    def plan(self, paused: frozenset[tuple[str, str]] = frozenset()) -> Plan | None:
        """The next epoch's ranges, or None if there is nothing to read or finish now. Idle
        splits get an empty range: it still carries their watermark downstream. ``paused``
        (source uid, split): splits waiting out a restart delay get no range at all
        (``split_failover.py``)."""
        now = now_ms()
        self.rediscover(now)
        open_by_source = {
            uid: {
                s: st.position
                for s, st in self.positions[uid].items()
                if not st.finished and (uid, s) not in paused
            }
            for uid in self.sources
        }
        # The budget is shared by the sources that still read: a finished source (a small
        # rule table, a bounded side input) does not keep half of every later epoch.
        reading = sum(1 for splits in open_by_source.values() if splits)
        budget = max(1, self.budget.records() // max(1, reading))
        plan: Plan = {}
        work = False
        for uid, node in self.sources.items():
            open_splits = open_by_source[uid]
            if not open_splits:
                continue
            order = {s: i for i, s in enumerate(self.positions[uid])}
            ranges = [
                replace(r, order=order[r.split]) for r in node.source.plan(open_splits, budget, now)
            ]
            planned = {r.split for r in ranges}
            for split, pos in open_splits.items():
                if split not in planned:
                    ranges.append(SplitRange(split, pos, pos, order[split]))
            ranges, became_idle = self.idle.mark(uid, ranges, now)
            plan[uid] = sorted(ranges, key=lambda r: r.order)
            work = work or became_idle or any(r.final or r.end != r.start for r in plan[uid])
        return plan if work else None

    def empty_plan(self, paused: frozenset[tuple[str, str]] = frozenset()) -> Plan:
        """An epoch that reads nothing (a savepoint's epoch): every open split, zero records
        (a paused split not even that: its source may still be failing)."""
        plan: Plan = {}
        for uid, splits in self.positions.items():
            order = {s: i for i, s in enumerate(splits)}
            ranges = [
                SplitRange(s, st.position, st.position, order[s])
                for s, st in splits.items()
                if not st.finished and (uid, s) not in paused
            ]
            if ranges:
                plan[uid] = ranges
        return plan

    def is_last(self, plan: Plan) -> bool:
        """After this epoch every split is finished."""
        finishing = {(uid, r.split) for uid, rs in plan.items() for r in rs if r.final}
        return all(
            st.finished or (uid, split) in finishing
            for uid, splits in self.positions.items()
            for split, st in splits.items()
        )

    def advance(self, plan: Plan, reads: list[SplitReport]) -> int:
        """Move every split to the end of its range; returns the records read."""
        for uid, ranges in plan.items():
            for r in ranges:
                st = self.positions[uid][r.split]
                st.position, st.finished = r.end, r.final
        records = 0
        for rep in reads:
            st = self.positions[rep.uid][rep.split]
            st.max_timestamp = max(st.max_timestamp, rep.max_timestamp)
            records += rep.records
        return records

    def lag(self) -> dict[str, dict[str, SplitLag]]:
        """Per source and split, the lag its source measured at the last planning."""
        return {uid: node.source.lag() for uid, node in self.sources.items()}

    def max_timestamps(self) -> dict[str, dict[str, int]]:
        return {
            uid: {s: st.max_timestamp for s, st in splits.items()}
            for uid, splits in self.positions.items()
        }

    def to_json(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Positions as stored in checkpoints and savepoints."""
        return {
            uid: {s: st.to_json() for s, st in splits.items()}
            for uid, splits in self.positions.items()
        }

    def close(self) -> None:
        for node in self.sources.values():
            node.source.close()


def _in_order(node: SourceNode, splits: dict[str, SplitState]) -> dict[str, SplitState]:
    """Splits in the source's own order (``Source.split_key``; none: as discovered, new
    ones last): with a key, a split's place, and so the order in which keyed subtasks take
    its records, does not depend on when it was discovered."""
    key = node.source.split_key
    if key is None:
        return splits
    return {s: splits[s] for s in sorted(splits, key=key)}


class CheckpointSchedule:
    """Whether an epoch takes a checkpoint, with Flink's semantics: every N epochs, or
    ``interval_ms`` after the previous trigger; either way not sooner than ``min_pause_ms``
    after the previous checkpoint ended (completed or failed) and, while that pause is set,
    one at a time. The last epoch of a bounded job always takes one (so every sink commits
    before the end)."""

    def __init__(self, config: CheckpointConfig) -> None:
        self.config = config
        self.triggered_ms = 0  # the previous trigger: the first epoch's checkpoint is due
        self.ended_ms = 0  # the previous checkpoint's completion or failure
        self.epochs_since = 0

    def due(self, last_epoch: bool, in_flight: int = 0) -> bool:
        """``in_flight``: checkpoints triggered and not yet completed or failed."""
        cfg = self.config
        if not cfg.enabled:
            return False
        if last_epoch:
            return True
        if cfg.min_pause_ms > 0 and (in_flight or now_ms() - self.ended_ms < cfg.min_pause_ms):
            return False
        if cfg.interval_ms > 0:
            return now_ms() - self.triggered_ms >= cfg.interval_ms
        return self.epochs_since + 1 >= cfg.every_epochs

    def epoch_done(self) -> None:
        self.epochs_since += 1

    def triggered(self) -> None:
        """An epoch took a checkpoint (it may complete epochs later)."""
        self.epochs_since = -1  # the triggering epoch's epoch_done() brings it to 0
        self.triggered_ms = now_ms()

    def checkpoint_done(self) -> None:
        self.ended_ms = now_ms()

    def checkpoint_failed(self) -> None:
        """The next epoch takes a checkpoint again (after the pause, if any)."""
        self.ended_ms = now_ms()
        self.epochs_since = max(self.epochs_since, self.config.every_epochs - 1)
        self.triggered_ms = 0
