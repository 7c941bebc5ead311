"""What the driver and its long-running tasks say to each other."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..api.graph import PipelineGraph
from ..epoch.reports import Report
from ..epoch.spec import EpochSpec

SOURCE, KEYED = "source", "keyed"


@dataclass(frozen=True)
class TaskRole:
    """One long-running task: a source's range slot (``index``: its place in the epoch's
    list of ranges for that source) or a keyed operator's subtask (``index``)."""

    kind: str
    node_id: int
    uid: str
    index: int


@dataclass(frozen=True)
class Launch:
    """Everything a task of one run gets in its Spark closure (pickled once per run)."""

    run_id: str
    driver: tuple[str, int]
    token: bytes
    roles: tuple[TaskRole, ...]
    pipeline: PipelineGraph
    # Tasks on this machine (local mode): keyed tasks listen on the loopback address.
    loopback: bool


@dataclass(frozen=True)
class Hello:
    """A task is up: its index and, for a keyed task, where upstream tasks send its input."""

    index: int
    address: tuple[str, int] | None


@dataclass(frozen=True)
class Peers:
    """Where every keyed subtask listens: (node id, subtask) -> address."""

    addresses: dict[tuple[int, int], tuple[str, int]]


@dataclass(frozen=True)
class RunEpoch:
    """Run one epoch. The spec travels without its pipeline (each task has it from its
    :class:`Launch`)."""

    spec: EpochSpec


@dataclass(frozen=True)
class Stop:
    """End the task: the run is over (a stop, a changed shape, the end of the job)."""


@dataclass(frozen=True)
class Done:
    """A task's part of an epoch is done: its reports (what the accumulator carries in a
    per-epoch Spark job)."""

    epoch: int
    index: int
    reports: list[Report]


@dataclass(frozen=True)
class Failed:
    """A task's part of an epoch raised: the error as text (its own line first, then its
    traceback), so the driver classifies it as it classifies a failed Spark task
    (``driver/failures.py``) and the one line a user reads names it."""

    epoch: int
    index: int
    error: str


@dataclass(frozen=True)
class Data:
    """One producer task's input for one keyed subtask in one epoch, possibly empty: every
    producer sends one to every subtask it feeds, so the subtask knows when it has all."""

    epoch: int
    node_id: int
    subtask: int
    items: list[tuple[int, bytes]]


def without_pipeline(spec: EpochSpec) -> EpochSpec:
    """``spec`` for the wire: its pipeline (the user's code, the largest part) left out."""
    none: Any = None
    return replace(spec, pipeline=none)
