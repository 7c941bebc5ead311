"""State-aware placement of keyed tasks: run each keyed subtask on the executor that holds its
local state (its RocksDB and the local copy of its latest checkpoint).

PySpark cannot set preferred locations, so the driver wraps each keyed stage's shuffled RDD
in a small JVM RDD (``jvm.py``) that prefers, per subtask:

1. the executor that ran the subtask last (``executor_<host>_<id>``, Spark's process-local
   location), while that executor lives (the block manager master lists it): its RocksDB
   is where the job left it;
2. otherwise a live executor that holds the subtask's local copy of the checkpoint the job
   restores from (a replacement executor on the same node and volume, or any executor of a
   new driver), as the executors' survey found it (``inventory.py``); failing that, one that
   holds a standby copy of it or of an older checkpoint (``standby.py``);
3. otherwise the last executor's host when that host has another executor (a node-local
   preference: the node's disk may hold the state);
4. otherwise the live executor with the fewest subtasks (a new job or a rescale: subtasks
   are spread evenly from the first epoch on; a lost executor's subtasks restore from the
   object store there).

Before an epoch whose keyed subtasks may need a restore (their last executor is gone or
unknown), the driver (:class:`Placer`) surveys the executors it has not surveyed and, while
fewer executors are registered than requested and a subtask's local copy is on none of them,
waits up to ``local_recovery.executor_wait_ms`` for replacements: a restarted executor on the
same node and volume restores locally instead of reading the object store. With standby
copies, when every such subtask's standby executor lives, the driver hands the subtasks to
them at once, without a survey (:func:`standby_holdings`).

Tasks learn their executor id and host from the task's local properties that the JVM RDD
sets (``jvm.task_location``) and report them; the driver remembers them (``PlacementTracker``)
and counts, per epoch, how many keyed tasks ran where their state is.

Only masters with several executors use this (``local-cluster[...]`` and ``k8s://``);
``local[*]`` has one executor and keeps the plain path, with no wrapping at all.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from ..cluster.jvm import executor_location, live_executors
from ..epoch.reports import RestoreSource, StateReport
from ..keygroups import SubtaskId
from .inventory import Copy, Holding, Inventory

log = logging.getLogger("stator.cluster")

PLACEMENT_MASTERS = ("local-cluster", "k8s://")
SURVEY_POLL_S = 0.5

Subtask = tuple[str, int, int]  # (operator uid, subtask, parallelism)
Placement = Callable[[str, int], list[str]]


def uses_placement(master: str) -> bool:
    """Whether a Spark master runs several executors, so that placement matters."""
    return master.strip().startswith(PLACEMENT_MASTERS)


@dataclass(frozen=True)
class Where:
    """An executor, as Spark names it, and the node it runs on ("" outside Kubernetes)."""

    executor: str
    host: str
    node: str = ""

    @property
    def location(self) -> str:
        return executor_location(self.host, self.executor)


@dataclass(frozen=True)
class EpochPlacement:
    """Of ``total`` keyed tasks that reported an executor, ``local`` ran where their state
    was: they found their database at the expected epoch, or restored it from a local copy
    (or had no state yet). A task that read its state from the object store was not."""

    local: int
    total: int


@dataclass(frozen=True)
class EpochLocations:
    """One epoch's preferred location of every keyed subtask (a :data:`Placement`), and the
    subtasks sent to the executor that holds their state (steps 1 and 2): a Spark retry of
    such a task on another executor must not restore from the object store
    (``EpochSpec.pinned``)."""

    by_operator: dict[str, list[str]]
    pinned: dict[SubtaskId, str]
    live: dict[str, str] = field(default_factory=dict)  # executor id -> host, when planned
    # Subtasks whose executor is gone, handed to the executors keeping their standby copies
    # (:func:`standby_holdings`): they restore a completed checkpoint there.
    resumed: tuple[Subtask, ...] = ()

    def __call__(self, uid: str, parallelism: int) -> list[str]:
        return self.by_operator[uid]


@dataclass(frozen=True)
class LocalRestore:
    """The checkpoint of this job that keyed subtasks restore from if their local state is
    not where the job is, and its operators at their current parallelism: only those can
    have local copies of it."""

    checkpoint_id: int
    operators: frozenset[str]


class PlacementTracker:
    """Driver side: where each keyed subtask last ran, and where to ask for it next.

    Kept across failovers (a rewound job still finds its local copies on the same executors)
    and keyed by parallelism too, so a rescaled operator starts without preferences."""

    def __init__(self) -> None:
        self._where: dict[Subtask, Where] = {}
        # Executor id -> subtasks that moved off it since ``take_left`` was last called: a
        # lost executor's subtasks run elsewhere an epoch later, and whoever looks for lost
        # executors must still learn what it held.
        self._left: dict[str, list[str]] = {}
        self._left_lock = threading.Lock()
        # Subtask -> (executor id, node) keeping its standby copy (``standby.py``): status.
        self.standby: dict[Subtask, tuple[str, str]] = {}

    def locations(
        self,
        uid: str,
        parallelism: int,
        live: dict[str, str] | None = None,
        holdings: dict[str, Holding] | None = None,
        restore: LocalRestore | None = None,
    ) -> list[str]:
        """Preferred locations of the operator's subtasks, by index ("" for anywhere): steps
        1-4 of the module docstring. ``live`` (executor id -> host, if known): an executor
        that is gone is never asked for, so that a task never waits out the locality delay
        for an executor that cannot come back."""
        return self._choose(uid, parallelism, live, holdings, restore)[0]

    def plan(
        self,
        parallelism: dict[str, int],
        live: dict[str, str],
        holdings: dict[str, Holding],
        restore: LocalRestore | None,
    ) -> EpochLocations:
        """Every keyed operator's locations for one epoch, and which subtasks go to the
        executor that holds their state. Those are pinned only where a local copy could
        serve a restore (``restore``: this job's checkpoint, local recovery on, the same
        parallelism), the only case in which the driver waits for a lost executor's
        replacement; otherwise a retry elsewhere may as well restore at once."""
        by_operator: dict[str, list[str]] = {}
        pinned: dict[SubtaskId, str] = {}
        for uid, p in sorted(parallelism.items()):
            locations, held = self._choose(uid, p, live, holdings, restore)
            by_operator[uid] = locations
            if restore is not None and uid in restore.operators:
                pinned.update({SubtaskId(uid, s): locations[s] for s in range(p) if held[s]})
        return EpochLocations(by_operator, pinned, dict(live))

    def _choose(
        self,
        uid: str,
        parallelism: int,
        live: dict[str, str] | None,
        holdings: dict[str, Holding] | None,
        restore: LocalRestore | None,
    ) -> tuple[list[str], list[bool]]:
        """:meth:`locations`, and per subtask whether its location holds its state (steps 1
        and 2: its live last executor, or a surveyed holder of its local copy)."""
        hosts = set(live.values()) if live is not None else set()
        out: list[str] = []
        held: list[bool] = []
        for subtask in range(parallelism):
            key = (uid, subtask, parallelism)
            where = self._where.get(key)
            holders = _holders(holdings or {}, key, restore)
            if where is not None and (live is None or live.get(where.executor) == where.host):
                out.append(where.location)
                held.append(True)
            elif holders:  # several hold it only where executors share a disk: spread them
                out.append(min(holders, key=lambda h: out.count(h.location)).location)
                held.append(True)
            elif where is not None and where.host in hosts:
                out.append(where.host)
                held.append(False)
            else:
                out.append("")
                held.append(False)
        return spread(out, live), held

    def stranded(self, parallelism: dict[str, int], live: dict[str, str]) -> list[Subtask]:
        """Subtasks whose last executor is gone or unknown: they may need a restore."""
        out = []
        for uid, p in sorted(parallelism.items()):
            for subtask in range(p):
                where = self._where.get((uid, subtask, p))
                if where is None or live.get(where.executor) != where.host:
                    out.append((uid, subtask, p))
        return out

    def record(self, states: Iterable[StateReport], parallelism: dict[str, int]) -> EpochPlacement:
        """Remember where an epoch's keyed tasks ran; count those that ran where their state
        was."""
        local = total = 0
        for s in states:
            if not s.executor:
                continue
            key = (s.uid, s.subtask, parallelism.get(s.uid, 0))
            now = Where(s.executor, s.host, s.node)
            total += 1
            # "none": its database was here at the expected epoch (or it had no state yet).
            local += s.restore.source != RestoreSource.REMOTE
            before = self._where.get(key)
            if before is not None and before.executor != now.executor:
                with self._left_lock:
                    self._left.setdefault(before.executor, []).append(f"{s.uid}[{s.subtask}]")
            self._where[key] = now
        return EpochPlacement(local, total)

    def give_back(self, executor: str, subtasks: list[str]) -> None:
        """Undo ``take_left`` for one executor (its look failed)."""
        with self._left_lock:
            self._left.setdefault(executor, []).extend(subtasks)

    def take_left(self) -> dict[str, list[str]]:
        """Executor id -> the subtasks that moved off it since the last call (their local
        state was there until then)."""
        with self._left_lock:
            left, self._left = self._left, {}
        return left

    def nodes(self) -> dict[str, str]:
        """Executor id -> its node, for the executors keyed tasks reported from."""
        return {w.executor: w.node for w in self._where.values() if w.node}

    def held_on(self) -> dict[str, list[str]]:
        """Executor id -> the subtasks ("uid[subtask]") whose local state it holds."""
        out: dict[str, list[str]] = {}
        for (uid, subtask, _), where in sorted(self._where.items()):
            out.setdefault(where.executor, []).append(f"{uid}[{subtask}]")
        return out

    def to_json(self) -> dict[str, list[dict[str, Any]]]:
        """Per operator: subtask -> executor, host and node (and, with standby copies, the
        executor and node keeping its copy), for the control API."""
        out: dict[str, list[dict[str, Any]]] = {}
        for (uid, subtask, p), where in sorted(self._where.items()):
            entry: dict[str, Any] = {
                "subtask": subtask,
                "parallelism": p,
                "executor": where.executor,
                "host": where.host,
                "node": where.node,
            }
            standby = self.standby.get((uid, subtask, p))
            if standby is not None:
                entry["standby"] = {"executor": standby[0], "node": standby[1]}
            out.setdefault(uid, []).append(entry)
        return out


def standby_holdings(
    standby: dict[Subtask, tuple[str, str]],
    stranded: list[Subtask],
    restore: LocalRestore,
    live: dict[str, str],
) -> dict[str, Holding] | None:
    """With standby copies (``standby``: subtask -> the executor its orders named and its
    node, ``standby.py``), when every stranded subtask's standby executor lives: holdings
    that hand each subtask to it without a survey, a Spark job on every executor (measured:
    1.3 s of a 5.3 s recovery on the loaded test bed). Whether that executor finished its
    copy is not known here; a restore there catches the copy up with the files it lacks,
    from the object store (``locality/standby_copy.py``), so an unfinished copy costs download
    time, never state. None when a stranded subtask has no live standby executor: the
    driver surveys, and may wait for replacements."""
    held: dict[str, set[Copy]] = {}
    nodes: dict[str, str] = {}
    for key in stranded:
        entry = standby.get(key)
        if entry is None or entry[0] not in live:
            return None
        held.setdefault(entry[0], set()).add((*key, restore.checkpoint_id))
        nodes[entry[0]] = entry[1]
    return {
        e: Holding(e, live[e], nodes[e], frozenset(), frozenset(copies))
        for e, copies in held.items()
    }


def spread(locations: list[str], live: dict[str, str] | None) -> list[str]:
    """Subtasks with no state anywhere (a new job, a rescale) or whose state is on no live
    executor go to the live executors with the fewest subtasks, so that keyed subtasks are
    spread evenly from the first epoch on (and then stay where they are)."""
    if not live:
        return locations
    executors = sorted(live.items(), key=lambda e: (len(e[0]), e[0]))
    load = {executor_location(host, e): 0 for e, host in executors}
    for location in locations:
        if location in load:
            load[location] += 1
    out = []
    for location in locations:
        chosen = location or min(load, key=lambda x: load[x])
        if not location:
            load[chosen] += 1
        out.append(chosen)
    return out


def _holders(
    holdings: dict[str, Holding], key: Subtask, restore: LocalRestore | None
) -> list[Where]:
    """The surveyed live executors holding ``key``'s local copy of the restore checkpoint;
    if none does, those holding a standby copy of it or of an older checkpoint."""
    if restore is None or key[0] not in restore.operators:
        return []
    copy = (*key, restore.checkpoint_id)
    exact = [Where(h.executor, h.host, h.node) for h in holdings.values() if copy in h.copies]
    if exact:
        return exact
    return [  # a standby copy a restore brings up to the checkpoint (``locality/standby_copy.py``)
        Where(h.executor, h.host, h.node)
        for h in holdings.values()
        if any(c[:3] == key and c[3] <= restore.checkpoint_id for c in h.standby)
    ]


def expected_executors(sc: Any) -> int | None:
    """How many executors the application asked for (``spark.executor.instances``, or the
    N of ``local-cluster[N,...]``); None if unknown."""
    instances = sc.getConf().get("spark.executor.instances", None)
    if instances:
        return int(instances)
    m = re.match(r"local-cluster\[(\d+)", str(sc.master))
    return int(m.group(1)) if m else None


class Placer:
    """Driver side, with several executors: the locations to ask for in the next epoch,
    surveying executors and waiting for lost ones' replacements first when subtasks may
    restore (module docstring)."""

    def __init__(
        self, sc: Any, job: str, local_dir: str, wait_ms: int, standby: bool = False
    ) -> None:
        self.sc = sc
        self.tracker = PlacementTracker()
        self.inventory = Inventory(job, local_dir)
        self.wait_ms = wait_ms
        self.expected = expected_executors(sc)
        self.standby = standby  # executors gain standby copies while they run: survey again
        self.planned = False  # the first plan waits for the requested executors to register

    def for_epoch(
        self, parallelism: dict[str, int], restore: LocalRestore | None
    ) -> EpochLocations:
        live = live_executors(self.sc) if self.planned else self._registered()
        self.planned = True
        holdings: dict[str, Holding] = {}
        stranded = [
            s
            for s in self.tracker.stranded(parallelism, live)
            if restore is not None and s[0] in restore.operators
        ]
        if stranded and restore is not None:
            standby = None
            if self.standby:
                standby = standby_holdings(self.tracker.standby, stranded, restore, live)
            if standby is not None:
                log.info(
                    "resuming %s on the executors keeping their standby copies, without a survey",
                    ", ".join(f"{u}[{s}/{p}]" for u, s, p in stranded),
                )
                return replace(
                    self.tracker.plan(parallelism, live, standby, restore), resumed=tuple(stranded)
                )
            live, holdings = self._survey(stranded, restore, live)
        return self.tracker.plan(parallelism, live, holdings, restore)

    def _registered(self) -> dict[str, str]:
        """The live executors once as many as requested are listed (at most ``wait_ms``):
        the first plan spreads every subtask over them and the subtasks stay there, so
        spreading over the first listed would leave the later ones idle for the whole job
        (Spark starts jobs before every executor's block manager is listed)."""
        live = live_executors(self.sc)
        deadline = time.monotonic() + self.wait_ms / 1000
        while self._short(live):
            if time.monotonic() >= deadline:
                log.info(
                    "%d of %d requested executors registered after %.1f s: the first epoch's "
                    "subtasks are spread over those",
                    len(live),
                    self.expected,
                    self.wait_ms / 1000,
                )
                break
            time.sleep(SURVEY_POLL_S / 5)
            live = live_executors(self.sc)
        return live

    def _short(self, live: dict[str, str]) -> bool:
        """Fewer executors listed than the application requested."""
        return self.expected is not None and len(live) < self.expected

    def _survey(
        self, stranded: list[Subtask], restore: LocalRestore, live: dict[str, str]
    ) -> tuple[dict[str, str], dict[str, Holding]]:
        started = time.monotonic()
        deadline = started + self.wait_ms / 1000
        again = self.standby
        looked = 0
        while True:
            holdings = self.inventory.survey(self.sc, live, again)
            again, looked = False, looked + 1
            missing = [s for s in stranded if not _holders(holdings, s, restore)]
            if not missing or not self._short(live) or time.monotonic() >= deadline:
                break
            time.sleep(SURVEY_POLL_S)
            live = live_executors(self.sc)
        waited = time.monotonic() - started
        for h in sorted(holdings.values(), key=lambda h: h.executor):
            mine = sorted(
                f"{u}[{s}/{p}]"
                for u, s, p, c in h.copies
                if c == restore.checkpoint_id and u in restore.operators
            )
            log.info(
                "executor %s (%s%s) holds local copies of checkpoint %d for %s",
                h.executor,
                h.host,
                f", node {h.node}" if h.node else "",
                restore.checkpoint_id,
                ", ".join(mine) or "nothing",
            )
        if missing:
            log.info(
                "%d keyed subtask(s) have no local copy of checkpoint %d on the %d live "
                "executor(s) (%d requested; looked for %.1f s); they restore from the object "
                "store: %s",
                len(missing),
                restore.checkpoint_id,
                len(live),
                self.expected or 0,
                waited,
                ", ".join(f"{u}[{s}/{p}]" for u, s, p in missing[:8]),
            )
        elif looked > 1:
            log.info("replacement executors registered after %.1f s", waited)
        return live, holdings
