"""What the driver and its long-running tasks say to each other, and which task sends what
to whom in an epoch (the same data flow as ``driver/sparkjob.py`` builds out of RDDs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..api.graph import PipelineGraph
from ..api.nodes import KeyedNode, SourceNode
from ..epoch.reports import Report
from ..epoch.spec import EpochSpec
from ..tasks.routing import keyed_targets

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


def distinct_targets(pipeline: PipelineGraph, node_id: int) -> list[KeyedNode]:
    """The keyed operators ``node_id``'s output feeds (through stateless nodes), once each."""
    return list({t.id: t for t, _ in keyed_targets(pipeline, node_id)}.values())


def producers(spec: EpochSpec, pipeline: PipelineGraph) -> dict[int, int]:
    """Keyed node id -> how many :class:`Data` frames each of its subtasks gets this epoch,
    for the keyed operators that run in it (as ``sparkjob.run_epoch_job`` decides: fed by a
    source or keyed operator of the epoch, or checkpointed)."""
    counts: dict[int, int] = {}
    for uid, ranges in spec.ranges.items():
        source = next(n for n in pipeline.nodes if isinstance(n, SourceNode) and n.uid == uid)
        for target in distinct_targets(pipeline, source.id):
            counts[target.id] = counts.get(target.id, 0) + len(ranges)
    snapshots = spec.checkpoint is not None or spec.savepoint is not None
    running: dict[int, int] = {}
    for node in pipeline.nodes:  # topological order
        if not isinstance(node, KeyedNode):
            continue
        if node.id in counts:
            running[node.id] = counts[node.id]
        elif snapshots:
            running[node.id] = 0
        else:
            continue
        for target in distinct_targets(pipeline, node.id):
            counts[target.id] = counts.get(target.id, 0) + spec.parallelism[node.uid]
    return running


def without_pipeline(spec: EpochSpec) -> EpochSpec:
    """``spec`` for the wire: its pipeline (the user's code, the largest part) left out."""
    from dataclasses import replace  # noqa: PLC0415

    none: Any = None
    return replace(spec, pipeline=none)
