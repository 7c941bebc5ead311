"""Driver side of standby copies (``local_recovery.standby``; the executor side is
``tasks/standby_copy.py``): which executor keeps a copy of each keyed subtask's latest
completed checkpoint, written into every epoch's spec as orders.

1. A subtask's standby executor stays the same while it lives and the subtask is not planned
   on it: a new standby reads the subtask's whole state from the object store once, an old
   one only each checkpoint's new files.
2. Otherwise it is the next live executor after the one the subtask is planned on, in id
   order (evenly spread when the subtasks are), skipping those on the same node (a lost
   node then leaves a copy elsewhere).
3. Orders name the files of the subtask's snapshot in the latest completed checkpoint of
   this job: none before the first one, none for an operator it holds at another
   parallelism (a rescale starts copies over), none with a single executor.
4. They travel in the epoch's spec, and a keyed task hands its executor's orders to that
   executor's uploader. An executor the epoch plans no keyed task on gets them from one small
   task per such executor (placed process-locally, as the survey's), run before the epoch
   once per checkpoint: executors are idle between epochs.

A copy that an executor did not finish is caught up at a restore (its missing files read then)
or not used; either way the object store stays the truth, so a wrong guess here costs time,
never state.
"""

from __future__ import annotations

import functools
from typing import Any

from ..checkpoint.metadata import CheckpointMetadata
from ..epoch.spec import StandbyOrder, StandbyTask
from ..storage import ObjectStore
from ..tasks.standby_copy import hand_over_orders
from .jvm import executor_location, prefer_locations
from .placement import EpochLocations

Subtask = tuple[str, int, int]  # (operator uid, subtask, parallelism)


class StandbyAssigner:
    """Steps 1-3 of the module docstring, remembering each subtask's standby executor."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self.assigned: dict[Subtask, str] = {}  # -> executor id
        self._sent: dict[str, int] = {}  # executor location -> checkpoint its orders name
        # Executor id -> node, of executors that ran no keyed task (their tasks here say).
        self.nodes: dict[str, str] = {}

    def orders(
        self,
        planned: EpochLocations,
        parallelism: dict[str, int],
        latest: CheckpointMetadata | None,
        nodes: dict[str, str],
    ) -> StandbyTask | None:
        """The next epoch's standby orders, from where its subtasks are planned
        (``planned``), and the node of each executor where known (``nodes``)."""
        live = planned.live
        if latest is None or len(live) < 2:
            return None
        by_location = {executor_location(host, e): e for e, host in live.items()}
        self.assigned = {k: e for k, e in self.assigned.items() if e in live}
        load = {e: 0 for e in live}
        for e in self.assigned.values():
            load[e] += 1
        orders: dict[str, list[StandbyOrder]] = {}
        for uid, p in sorted(parallelism.items()):
            op = latest.operators.get(uid)
            if op is None or op.parallelism != p:
                continue
            for snapshot in op.subtasks:
                key = (uid, snapshot.index, p)
                runs_on = by_location.get(planned.by_operator[uid][snapshot.index], "")
                standby = self.assigned.get(key)
                if standby is None or standby == runs_on:
                    if standby is not None:
                        load[standby] -= 1
                    standby = _choose(live, load, runs_on, nodes)
                    self.assigned[key] = standby
                    load[standby] += 1
                where = executor_location(live[standby], standby)
                orders.setdefault(where, []).append(
                    StandbyOrder(uid, snapshot.index, p, latest.checkpoint_id, snapshot.files)
                )
        return StandbyTask(self.store, {w: tuple(o) for w, o in orders.items()})

    def send_to_idle(
        self, sc: Any, task: StandbyTask, planned: EpochLocations, job: str, local_dir: str
    ) -> None:
        """Step 4 of the module docstring."""
        keyed = {loc for locations in planned.by_operator.values() for loc in locations}
        due = {
            where: max(o.checkpoint_id for o in orders)
            for where, orders in task.orders.items()
            if where not in keyed and self._sent.get(where) != max(o.checkpoint_id for o in orders)
        }
        if not due:
            return
        targets = sorted(due)
        rdd = sc.parallelize(range(len(targets)), len(targets))
        placed = prefer_locations(sc, rdd, targets)
        handed = placed.mapPartitions(
            functools.partial(hand_over_orders, task, job, local_dir)
        ).collect()
        self._sent.update({w: due[w] for w, _, _ in handed if w in due})
        self.nodes.update({e: node for _, e, node in handed if e and node})


def _choose(live: dict[str, str], load: dict[str, int], runs_on: str, nodes: dict[str, str]) -> str:
    """Step 2 of the module docstring: the next executor after ``runs_on`` in id order
    (spread evenly when subtasks are), on another node if one is; the least loaded one for a
    subtask planned on no known executor."""
    ring = sorted(live, key=lambda e: (len(e), e))
    if runs_on not in live:
        return min(ring, key=lambda e: (load[e], len(e), e))
    start = ring.index(runs_on)
    after = [ring[(start + i) % len(ring)] for i in range(1, len(ring))]
    node = nodes.get(runs_on, "")
    elsewhere = [e for e in after if not node or nodes.get(e) != node]
    return (elsewhere or after)[0]
