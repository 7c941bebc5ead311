"""State-aware placement of keyed tasks: run each keyed subtask on the executor that holds its
local state (its RocksDB and the local copy of its latest checkpoint).

PySpark cannot set preferred locations, so the driver wraps each keyed stage's shuffled RDD
in a small JVM RDD (``jvm.py``) that prefers, per subtask:

1. the executor that ran the subtask last (``executor_<host>_<id>``, Spark's process-local
   location), while that executor lives (the block manager master lists it);
2. that executor's host when the executor is gone and the host has another executor (a
   node-local preference: the node's disk may hold the state);
3. anywhere, when the host has no executor left (the task then restores from the object
   store).

Tasks learn their executor id and host from the task's local properties that the JVM RDD
sets (``task_location``) and report them; the driver remembers them (``PlacementTracker``)
and counts, per epoch, how many keyed tasks ran where their state is.

Only masters with several executors use this (``local-cluster[...]`` and ``k8s://``);
``local[*]`` has one executor and keeps the plain path, with no wrapping at all.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..epoch.reports import StateReport

# Task local properties set by stator.jvm.PreferredLocationsRDD.compute (same names there).
EXECUTOR_ID_PROPERTY = "stator.executor.id"
EXECUTOR_HOST_PROPERTY = "stator.executor.host"
PLACEMENT_MASTERS = ("local-cluster", "k8s://")


def uses_placement(master: str) -> bool:
    """Whether a Spark master runs several executors, so that placement matters."""
    return master.strip().startswith(PLACEMENT_MASTERS)


def task_location() -> tuple[str, str]:
    """In a keyed task: (executor id, host) as the JVM RDD recorded them; ("", "") when the
    stage is not wrapped (``local[*]``) or outside Spark."""
    try:
        from pyspark import TaskContext  # noqa: PLC0415 - executors have pyspark loaded
    except ImportError:  # pragma: no cover - tasks always run under pyspark
        return "", ""
    ctx: Any = TaskContext.get()
    if ctx is None:
        return "", ""
    executor = ctx.getLocalProperty(EXECUTOR_ID_PROPERTY) or ""
    host = ctx.getLocalProperty(EXECUTOR_HOST_PROPERTY) or ""
    return str(executor), str(host)


@dataclass(frozen=True)
class Where:
    """An executor, as Spark names it."""

    executor: str
    host: str

    @property
    def location(self) -> str:
        return f"executor_{self.host}_{self.executor}"


@dataclass(frozen=True)
class EpochPlacement:
    """Of ``total`` keyed tasks that reported an executor, ``local`` ran on the executor that
    ran the same subtask (same operator, index and parallelism) before."""

    local: int
    total: int


class PlacementTracker:
    """Driver side: where each keyed subtask last ran, and where to ask for it next.

    Kept across failovers (a rewound job still finds its local copies on the same executors)
    and keyed by parallelism too, so a rescaled operator starts without preferences."""

    def __init__(self) -> None:
        self._where: dict[tuple[str, int, int], Where] = {}

    def locations(
        self, uid: str, parallelism: int, live: dict[str, str] | None = None
    ) -> list[str]:
        """Preferred locations of the operator's subtasks, by index ("" for anywhere).
        ``live`` (executor id -> host, if known): an executor that is gone is replaced by its
        host while the host has another executor, else by no preference at all, so that a
        task never waits out the locality delay for an executor that cannot come back."""
        hosts = set(live.values()) if live is not None else set()
        out = []
        for subtask in range(parallelism):
            where = self._where.get((uid, subtask, parallelism))
            if where is None:
                out.append("")
            elif live is None or live.get(where.executor) == where.host:
                out.append(where.location)
            elif where.host in hosts:
                out.append(where.host)
            else:
                out.append("")
        return out

    def record(self, states: Iterable[StateReport], parallelism: dict[str, int]) -> EpochPlacement:
        """Remember where an epoch's keyed tasks ran; count those that ran where they had."""
        local = total = 0
        for s in states:
            if not s.executor:
                continue
            key = (s.uid, s.subtask, parallelism.get(s.uid, 0))
            now = Where(s.executor, s.host)
            total += 1
            local += self._where.get(key) == now
            self._where[key] = now
        return EpochPlacement(local, total)

    def to_json(self) -> dict[str, list[dict[str, Any]]]:
        """Per operator: subtask -> executor and host, for the control API."""
        out: dict[str, list[dict[str, Any]]] = {}
        for (uid, subtask, p), where in sorted(self._where.items()):
            out.setdefault(uid, []).append(
                {
                    "subtask": subtask,
                    "parallelism": p,
                    "executor": where.executor,
                    "host": where.host,
                }
            )
        return out
