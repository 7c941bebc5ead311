"""Driver side of standby copies (``local_recovery.standby``; the executor side is
``locality/standby_copy.py``): which executor keeps a copy of each keyed subtask's latest
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
   task per such executor (placed process-locally, as the survey's), once per checkpoint, in
   a Spark job of its own that a background thread runs beside the epoch: the epoch does not
   wait for it (run before each epoch, it took 0.3-0.7 s of epochs of 0.5-1 s on the loaded
   test bed, and of the epoch that resumes a lost executor's subtask). One such job at a
   time; orders that come while one runs wait for the next epoch, which sends the newest. A
   job that fails is logged: the copy waits for the next checkpoint's orders.

A copy that an executor did not finish is caught up at a restore (its missing files read then)
or not used; either way the object store stays the truth, so a wrong guess here costs time,
never state.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from ..checkpoint.metadata import CheckpointMetadata
from ..cluster.jvm import executor_location, prefer_locations
from ..epoch.reports import StandbyTally
from ..epoch.spec import StandbyOrder, StandbyTask
from ..storage import ObjectStore
from .placement import EpochLocations
from .standby_copy import hand_over_orders

log = logging.getLogger("stator.cluster")

Subtask = tuple[str, int, int]  # (operator uid, subtask, parallelism)


class StandbyAssigner:
    """Steps 1-3 of the module docstring, remembering each subtask's standby executor."""

    def __init__(self, store: ObjectStore, on_tally: Callable[[StandbyTally | None], None]) -> None:
        self.store = store
        self.on_tally = on_tally  # the tallies the hand-over tasks report (the job's status)
        self.assigned: dict[Subtask, str] = {}  # -> executor id
        self._sent: dict[str, int] = {}  # executor location -> checkpoint its orders name
        # Executor id -> node, of executors that ran no keyed task (their tasks here say).
        self.nodes: dict[str, str] = {}
        self._sending: threading.Thread | None = None  # step 4's job, while it runs

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
        if not due or (self._sending is not None and self._sending.is_alive()):
            return
        self._sending = threading.Thread(
            target=self._send,
            args=(sc, task, due, job, local_dir),
            name="standby-orders",
            daemon=True,
        )
        self._sending.start()

    def _send(
        self, sc: Any, task: StandbyTask, due: dict[str, int], job: str, local_dir: str
    ) -> None:
        """The background job of step 4. ``_sent`` and ``nodes`` are replaced, never changed
        in place: the epoch's thread reads them meanwhile."""
        targets = sorted(due)
        try:
            rdd = sc.parallelize(range(len(targets)), len(targets))
            placed = prefer_locations(sc, rdd, targets)
            handed = placed.mapPartitions(
                functools.partial(hand_over_orders, task, job, local_dir)
            ).collect()
        except Exception as exc:  # an executor lost meanwhile, the driver stopping
            log.warning("standby orders for %s not handed over: %s", ", ".join(targets), exc)
            return
        self._sent = {**self._sent, **{w: due[w] for w, _, _, _ in handed if w in due}}
        self.nodes = {**self.nodes, **{e: node for _, e, node, _ in handed if e and node}}
        for *_, tally in handed:
            self.on_tally(tally)

    def wait_sent(self, timeout: float | None = None) -> None:
        """Until the orders job in flight, if any, ended (a job that ends)."""
        if self._sending is not None:
            self._sending.join(timeout)


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
