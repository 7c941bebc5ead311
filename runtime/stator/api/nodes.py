"""The nodes of a pipeline's graph: what the driver plans and the tasks run. Users build them
through the streams of ``streams.py``; the graph that holds them is ``graph.py``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from ..state.descriptors import MapStateDescriptor
from .functions import (
    BroadcastProcessFunction,
    KeyedBroadcastProcessFunction,
    KeyedCoProcessFunction,
    KeyedProcessFunction,
    OutputTag,
    ProcessFunction,
)
from .time import BoundedOutOfOrderness

if TYPE_CHECKING:
    from ..sinks.base import Sink
    from ..sources.base import Source


@dataclass
class Node:
    id: int
    inputs: list[int]
    name: str


@dataclass
class SourceNode(Node):
    uid: str
    source: Source
    timestamps: Callable[[Any], int] | None
    watermarks: BoundedOutOfOrderness


@dataclass
class TransformNode(Node):
    kind: str  # map | flat_map | filter
    fn: Callable[[Any], Any]


@dataclass
class UnionNode(Node):
    """The records of all its inputs, as one stream (no shuffle: a pass-through in each task)."""


@dataclass
class SideOutputNode(Node):
    """The records its one input (a process operator) emitted with ``ctx.output(tag, ...)``."""

    tag: OutputTag


class Route(Enum):
    """How the records of one input reach an operator's subtasks."""

    KEYED = "keyed"  # by the key's key-group
    BROADCAST = "broadcast"  # every record to every subtask
    FORWARD = "forward"  # each upstream task's records to one subtask (non-keyed input)


@dataclass
class KeyedNode(Node):
    """``key_by`` plus the keyed operator after it: the edge into this node is a shuffle."""

    uid: str
    key_fn: Callable[[Any], Any]
    # Pinned subtasks: None follows the job config's parallelism (spec.replicas, kubectl scale);
    # a number fixes this operator's parallelism whatever the replicas.
    parallelism: int | None

    def key_for(self, side: int) -> Callable[[Any], Any]:
        """The key function of input ``side`` (its position in ``inputs``), if keyed."""
        return self.key_fn

    def route(self, side: int) -> Route:
        return Route.KEYED


@dataclass
class ProcessNode(KeyedNode):
    function: KeyedProcessFunction


@dataclass
class CoProcessNode(KeyedNode):
    """Two keyed inputs connected by key into one ``KeyedCoProcessFunction``: input 0 keyed by
    ``key_fn``, input 1 by ``key_fn2``. An input fed twice (a self-join) appears twice in
    ``inputs``."""

    key_fn2: Callable[[Any], Any]
    function: KeyedCoProcessFunction

    def key_for(self, side: int) -> Callable[[Any], Any]:
        return self.key_fn if side == 0 else self.key_fn2


@dataclass
class BroadcastProcessNode(KeyedNode):
    """A keyed input (0) connected with a broadcast input (1), into one
    ``KeyedBroadcastProcessFunction``."""

    function: KeyedBroadcastProcessFunction
    # The broadcast states, declared by ``stream.broadcast(*descriptors)`` as in Flink.
    states: tuple[MapStateDescriptor, ...] = ()

    def route(self, side: int) -> Route:
        return Route.KEYED if side == 0 else Route.BROADCAST


@dataclass
class NonKeyedBroadcastNode(KeyedNode):
    """A non-keyed input (0) connected with a broadcast input (1), into one
    ``BroadcastProcessFunction``: each upstream task's records go to one subtask (no key,
    no keyed state, no timers); the subtasks hold the broadcast state."""

    function: BroadcastProcessFunction
    states: tuple[MapStateDescriptor, ...] = ()

    def route(self, side: int) -> Route:
        return Route.FORWARD if side == 0 else Route.BROADCAST


@dataclass
class ReduceNode(KeyedNode):
    """Keyed running aggregate: ``value_fn`` maps a record to its contribution, ``reduce_fn``
    (associative) combines contributions. Contributions are pre-combined per key before the
    shuffle and applied to state once per key per epoch; each epoch emits ``(key, total)`` for
    every key it changed."""

    value_fn: Callable[[Any], Any]
    reduce_fn: Callable[[Any, Any], Any]


@dataclass
class SinkNode(Node):
    uid: str
    sink: Sink


@dataclass
class NonKeyedProcessNode(KeyedNode):
    """A non-keyed ``ProcessFunction``: each upstream task's records go to one subtask; its
    subtasks hold operator state."""

    function: ProcessFunction

    def route(self, side: int) -> Route:
        return Route.FORWARD


# The operators that run a user's process function in a keyed task, with a subtask's state.
OperatorNode = (
    ProcessNode | CoProcessNode | BroadcastProcessNode | NonKeyedBroadcastNode | NonKeyedProcessNode
)


def _add(a: Any, b: Any) -> Any:
    return a + b


def _one(_: Any) -> int:
    return 1
