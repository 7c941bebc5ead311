"""A pipeline's graph: sources, stateless transforms, ``key_by``, keyed operators, sinks. The
driver and the tasks read it; users build it through ``Pipeline`` (``pipeline.py``), which adds
running it in-process.

    p = Pipeline("clicks")
    (p.source(KafkaSource(...), uid="clicks-in", timestamps=lambda r: r["ts"])
      .map(parse)
      .key_by(lambda r: r["user"])
      .process(CountClicks(), uid="count")
      .sink(FileSink("s3://bucket/out"), uid="out"))

Operators with state or output (sources, keyed operators, sinks) need a stable ``uid``: it is
how checkpoints and savepoints find their state again after the code changes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import TYPE_CHECKING, Any

from ..errors import PipelineError
from ..keygroups import check_parallelism
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

UID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


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
class PipelineGraph:
    """A job graph. ``max_parallelism`` (key-groups, fixed for the life of the state) may be
    left to the job config (``spec.maxParallelism``); the parallelism of keyed operators comes
    from the job config (``spec.replicas``) unless an operator pins its own."""

    name: str
    max_parallelism: int | None = None
    nodes: list[Node] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not UID_PATTERN.match(self.name):
            raise PipelineError(
                f"pipeline name {self.name!r} must be 1-63 letters, digits, '.', '_' or '-'"
            )
        if self.max_parallelism is not None:
            try:
                check_parallelism(1, self.max_parallelism)
            except ValueError as exc:
                raise PipelineError(f"pipeline '{self.name}': {exc}") from exc

    def _add(self, node: Node) -> Node:
        self.nodes.append(node)
        return node

    def _next_id(self) -> int:
        return len(self.nodes)

    def source(
        self,
        source: Source,
        *,
        uid: str,
        timestamps: Callable[[Any], int] | None = None,
        watermarks: BoundedOutOfOrderness | None = None,
    ) -> Stream:
        self._check_uid(uid, "source")
        node = SourceNode(
            self._next_id(),
            [],
            f"source:{uid}",
            uid,
            source,
            timestamps,
            watermarks or BoundedOutOfOrderness(0),
        )
        return Stream(self, self._add(node))

    def _check_uid(self, uid: object, what: str) -> None:
        if not isinstance(uid, str) or not UID_PATTERN.match(uid):
            raise PipelineError(
                f"{what} needs uid='...' of 1-63 letters, digits, '.', '_' or '-' "
                f"(got {uid!r}); the uid is how its state is found again after a code change"
            )
        taken = {getattr(n, "uid", None) for n in self.nodes}
        if uid in taken:
            raise PipelineError(f"uid '{uid}' is used twice in pipeline '{self.name}'")

    # ------------------------------------------------------------------ inspection

    def node(self, node_id: int) -> Node:
        return self.nodes[node_id]

    def consumers(self, node_id: int) -> list[Node]:
        return [n for n in self.nodes if node_id in n.inputs]

    def validate(self) -> None:
        """Reject graphs that cannot run, naming the problem."""
        if not any(isinstance(n, SourceNode) for n in self.nodes):
            raise PipelineError(f"pipeline '{self.name}' has no source")
        if not any(isinstance(n, SinkNode) for n in self.nodes):
            raise PipelineError(f"pipeline '{self.name}' has no sink: its output would be lost")
        for n in self.nodes:
            if not isinstance(n, SinkNode) and not self.consumers(n.id):
                raise PipelineError(
                    f"the output of '{n.name}' goes nowhere: end it with .sink(...)"
                )
            if isinstance(n, KeyedNode) and n.parallelism is not None:
                try:
                    check_parallelism(n.parallelism, self.max_parallelism or n.parallelism)
                except ValueError as exc:
                    raise PipelineError(f"operator '{n.uid}': {exc}") from exc

    def regions(self) -> list[list[str]]:
        """Failover regions: the weakly connected parts of the graph (names of their nodes).
        A failure needs to restart only the region it happened in."""
        return [[_label(self.nodes[i]) for i in part] for part in self._components()]

    def split(self) -> list[Region]:
        """The failover regions as pipelines of their own (nodes renumbered, same name and
        max parallelism), each named by its smallest source uid: stable while that source
        exists, and how its checkpoints are found again (``driver/regions.py``)."""
        found = []
        for part in self._components():
            index = {old: new for new, old in enumerate(part)}
            nodes = [
                replace(self.nodes[i], id=index[i], inputs=[index[j] for j in self.nodes[i].inputs])
                for i in part
            ]
            sub = type(self)(self.name, self.max_parallelism, nodes)
            region_id = min(n.uid for n in nodes if isinstance(n, SourceNode))
            found.append(Region(region_id, sub))
        return sorted(found, key=lambda r: r.id)

    def _components(self) -> list[list[int]]:
        """Node ids of each weakly connected part, in node order (parts by their first node)."""
        parent = list(range(len(self.nodes)))

        def find(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        for n in self.nodes:
            for j in n.inputs:
                parent[find(n.id)] = find(j)
        groups: dict[int, list[int]] = {}
        for n in self.nodes:
            groups.setdefault(find(n.id), []).append(n.id)
        return [groups[k] for k in sorted(groups, key=lambda k: groups[k][0])]

    def uids(self) -> list[str]:
        return [n.uid for n in self.nodes if isinstance(n, SourceNode | KeyedNode | SinkNode)]


@dataclass(frozen=True)
class Region:
    """A failover region: a weakly connected part of a job's graph, run on its own."""

    id: str
    pipeline: PipelineGraph

    def uids(self) -> set[str]:
        return set(self.pipeline.uids())


def _label(node: Node) -> str:
    return getattr(node, "uid", None) or node.name


class Stream:
    def __init__(self, pipeline: PipelineGraph, node: Node) -> None:
        self.pipeline, self.node = pipeline, node

    def _then(self, node: Node) -> Stream:
        return Stream(self.pipeline, self.pipeline._add(node))

    def map(self, fn: Callable[[Any], Any], *, name: str = "map") -> Stream:
        return self._then(TransformNode(self.pipeline._next_id(), [self.node.id], name, "map", fn))

    def flat_map(self, fn: Callable[[Any], Iterable[Any]], *, name: str = "flat_map") -> Stream:
        node = TransformNode(self.pipeline._next_id(), [self.node.id], name, "flat_map", fn)
        return self._then(node)

    def filter(self, fn: Callable[[Any], bool], *, name: str = "filter") -> Stream:
        node = TransformNode(self.pipeline._next_id(), [self.node.id], name, "filter", fn)
        return self._then(node)

    def key_by(self, key_fn: Callable[[Any], Any]) -> KeyedStream:
        return KeyedStream(self, key_fn)

    def connect(self, broadcast: BroadcastStream) -> NonKeyedBroadcastStreams:
        """This (non-keyed) stream with a broadcast stream, for a ``BroadcastProcessFunction``
        (connect two streams by key with ``key_by(...).connect(...)``)."""
        if not isinstance(broadcast, BroadcastStream):
            raise PipelineError(
                "connect() on a non-keyed stream takes a broadcast stream (stream.broadcast()); "
                "to connect two streams by key, key both: a.key_by(f).connect(b.key_by(g))"
            )
        if broadcast.stream.pipeline is not self.pipeline:
            raise PipelineError("connect() takes a broadcast stream of the same pipeline")
        return NonKeyedBroadcastStreams(self, broadcast)

    def process(
        self, function: ProcessFunction, *, uid: str, parallelism: int | None = None
    ) -> Stream:
        """A non-keyed process function in parallel subtasks, with operator state."""
        if not isinstance(function, ProcessFunction):
            raise PipelineError(
                "process() on a non-keyed stream needs a ProcessFunction instance, got "
                f"{type(function).__name__} (a KeyedProcessFunction needs key_by(...) first)"
            )
        self.pipeline._check_uid(uid, "operator")
        node = NonKeyedProcessNode(
            self.pipeline._next_id(),
            [self.node.id],
            f"process:{uid}",
            uid,
            _no_key,
            parallelism,
            function,
        )
        return self._then(node)

    def union(self, *others: Stream) -> Stream:
        """This stream's records and the others', as one stream (any order between them)."""
        if not others:
            raise PipelineError("union() needs at least one other stream")
        for other in others:
            if not isinstance(other, Stream) or other.pipeline is not self.pipeline:
                raise PipelineError(
                    f"union() takes streams of the same pipeline '{self.pipeline.name}', "
                    f"got {other!r}"
                )
        ids = [self.node.id, *(o.node.id for o in others)]
        return self._then(UnionNode(self.pipeline._next_id(), ids, "union"))

    def broadcast(self, *states: MapStateDescriptor) -> BroadcastStream:
        """This stream sent whole to every subtask of the operator it is connected to
        (``keyed.connect(stream.broadcast(desc))``); ``states``: the broadcast states that
        operator keeps (``ctx.get_broadcast_state(desc)``), declared here as in Flink."""
        for desc in states:
            if not isinstance(desc, MapStateDescriptor):
                raise PipelineError(
                    f"broadcast() takes the MapStateDescriptors of the broadcast state, got "
                    f"{desc!r}"
                )
        names = [d.name for d in states]
        if len(set(names)) != len(names):
            raise PipelineError(f"broadcast() names a broadcast state twice: {names}")
        return BroadcastStream(self, states)

    def side_output(self, tag: OutputTag) -> Stream:
        """What this stream's process function emitted to ``tag`` with ``ctx.output``."""
        if not isinstance(tag, OutputTag):
            raise PipelineError(f"side_output() needs an OutputTag, got {tag!r}")
        if not isinstance(self.node, OperatorNode):
            raise PipelineError(
                f"side_output('{tag.name}'): only the output of a process function "
                f"(.process(...) on a keyed or connected stream) has side outputs, "
                f"not '{self.node.name}'"
            )
        node = SideOutputNode(self.pipeline._next_id(), [self.node.id], f"side:{tag.name}", tag)
        return self._then(node)

    def sink(self, sink: Sink, *, uid: str) -> None:
        self.pipeline._check_uid(uid, "sink")
        self.pipeline._add(
            SinkNode(self.pipeline._next_id(), [self.node.id], f"sink:{uid}", uid, sink)
        )


class KeyedStream:
    def __init__(self, stream: Stream, key_fn: Callable[[Any], Any]) -> None:
        if not callable(key_fn):
            raise PipelineError(f"key_by needs a function of the record, got {key_fn!r}")
        self.stream, self.key_fn = stream, key_fn

    @property
    def _p(self) -> PipelineGraph:
        return self.stream.pipeline

    def process(
        self, function: KeyedProcessFunction, *, uid: str, parallelism: int | None = None
    ) -> Stream:
        if not isinstance(function, KeyedProcessFunction):
            raise PipelineError(
                f"process() needs a KeyedProcessFunction instance, got {type(function).__name__}"
            )
        self._p._check_uid(uid, "keyed operator")
        node = ProcessNode(
            self._p._next_id(),
            [self.stream.node.id],
            f"process:{uid}",
            uid,
            self.key_fn,
            parallelism,
            function,
        )
        return Stream(self._p, self._p._add(node))

    def reduce(
        self,
        reduce_fn: Callable[[Any, Any], Any],
        *,
        uid: str,
        value: Callable[[Any], Any] = lambda r: r,
        parallelism: int | None = None,
    ) -> Stream:
        """Running aggregate per key; emits ``(key, total)`` once per epoch per changed key."""
        self._p._check_uid(uid, "keyed operator")
        node = ReduceNode(
            self._p._next_id(),
            [self.stream.node.id],
            f"reduce:{uid}",
            uid,
            self.key_fn,
            parallelism,
            value,
            reduce_fn,
        )
        return Stream(self._p, self._p._add(node))

    def window(
        self,
        assigner: Any,
        aggregate: Any,
        *,
        uid: str,
        allowed_lateness_ms: int = 0,
        late_output: OutputTag | None = None,
        parallelism: int | None = None,
    ) -> Stream:
        """Event-time windows (stator.api.windows: Tumbling, Sliding, Session) aggregated with
        ``aggregate`` (Count, Sum, Collect or your own); emits ``Windowed`` records. Records
        too late even for ``allowed_lateness_ms`` go to ``late_output`` if given (read it with
        ``.side_output(tag)``), else they are dropped."""
        from .windows import WindowFunction  # noqa: PLC0415 - windows build on this module

        return self.process(
            WindowFunction(assigner, aggregate, allowed_lateness_ms, late_output),
            uid=uid,
            parallelism=parallelism,
        )

    def interval_join(
        self,
        other: KeyedStream,
        lower_ms: int,
        upper_ms: int,
        *,
        uid: str,
        join: Callable[[Any, Any], Any] | None = None,
        late_output: OutputTag | None = None,
        lower_exclusive: bool = False,
        upper_exclusive: bool = False,
        parallelism: int | None = None,
    ) -> Stream:
        """``join(l, r)`` (default: the pair) for each ``l`` of this stream and ``r`` of
        ``other`` with the same key and ``l.ts + lower_ms <= r.ts <= l.ts + upper_ms``
        (``<`` on an exclusive side; ``stator.api.joins``)."""
        from . import joins  # noqa: PLC0415 - joins build on this module

        return joins.interval_join(
            self,
            other,
            lower_ms,
            upper_ms,
            uid=uid,
            join=join or joins.pair,
            late_output=late_output,
            lower_exclusive=lower_exclusive,
            upper_exclusive=upper_exclusive,
            parallelism=parallelism,
        )

    def window_join(
        self,
        other: KeyedStream,
        assigner: Any,
        *,
        uid: str,
        join: Callable[[Any, Any], Any] | None = None,
        late_output: OutputTag | None = None,
        parallelism: int | None = None,
    ) -> Stream:
        """``join(l, r)`` for every pair of the same key in the same window (Tumbling,
        Sliding, Session), when the window fires (``stator.api.joins``)."""
        from . import joins  # noqa: PLC0415 - joins build on this module

        return joins.window_join(
            self,
            other,
            assigner,
            uid=uid,
            join=join or joins.pair,
            late_output=late_output,
            parallelism=parallelism,
        )

    def co_group(
        self,
        other: KeyedStream,
        assigner: Any,
        fn: Callable[[Any, Any, list[Any], list[Any]], Iterable[Any]],
        *,
        uid: str,
        late_output: OutputTag | None = None,
        parallelism: int | None = None,
    ) -> Stream:
        """``fn(key, window, lefts, rights)`` once per key and window holding a record of
        either stream (``stator.api.joins``)."""
        from . import joins  # noqa: PLC0415 - joins build on this module

        return joins.co_group(
            self,
            other,
            assigner,
            fn,
            uid=uid,
            late_output=late_output,
            parallelism=parallelism,
        )

    def connect(self, other: KeyedStream | BroadcastStream) -> Any:
        """Two keyed streams whose keys meet in one ``KeyedCoProcessFunction``, or this
        stream with a broadcast stream, for a ``KeyedBroadcastProcessFunction``."""
        if isinstance(other, BroadcastStream):
            if other.stream.pipeline is not self._p:
                raise PipelineError("connect() takes a broadcast stream of the same pipeline")
            return BroadcastConnectedStreams(self, other)
        if not isinstance(other, KeyedStream):
            raise PipelineError(
                "connect() takes a keyed stream (stream.key_by(...)) or a broadcast stream "
                f"(stream.broadcast()), got {type(other).__name__}"
            )
        if other._p is not self._p:
            raise PipelineError("connect() takes a keyed stream of the same pipeline")
        return ConnectedStreams(self, other)

    def count(self, *, uid: str, parallelism: int | None = None) -> Stream:
        """Running count per key; emits ``(key, count)`` once per epoch per changed key."""
        return self.reduce(_add, uid=uid, value=_one, parallelism=parallelism)

    def sum(
        self, value: Callable[[Any], Any], *, uid: str, parallelism: int | None = None
    ) -> Stream:
        return self.reduce(_add, uid=uid, value=value, parallelism=parallelism)


class ConnectedStreams:
    """Two keyed streams connected by key: ``.process(KeyedCoProcessFunction, uid=...)``."""

    def __init__(self, first: KeyedStream, second: KeyedStream) -> None:
        self.first, self.second = first, second

    def process(
        self, function: KeyedCoProcessFunction, *, uid: str, parallelism: int | None = None
    ) -> Stream:
        if not isinstance(function, KeyedCoProcessFunction):
            raise PipelineError(
                "process() on connected streams needs a KeyedCoProcessFunction instance, "
                f"got {type(function).__name__}"
            )
        p = self.first._p
        p._check_uid(uid, "keyed operator")
        node = CoProcessNode(
            p._next_id(),
            [self.first.stream.node.id, self.second.stream.node.id],
            f"co_process:{uid}",
            uid,
            self.first.key_fn,
            parallelism,
            self.second.key_fn,
            function,
        )
        return Stream(p, p._add(node))


class BroadcastStream:
    """A stream every subtask of the connected operator receives whole, and the broadcast
    states that operator keeps."""

    def __init__(self, stream: Stream, states: tuple[MapStateDescriptor, ...] = ()) -> None:
        self.stream, self.states = stream, states


class BroadcastConnectedStreams:
    """A keyed stream and a broadcast stream: ``.process(KeyedBroadcastProcessFunction)``."""

    def __init__(self, keyed: KeyedStream, broadcast: BroadcastStream) -> None:
        self.keyed, self.broadcast = keyed, broadcast

    def process(
        self,
        function: KeyedBroadcastProcessFunction,
        *,
        uid: str,
        parallelism: int | None = None,
    ) -> Stream:
        if not isinstance(function, KeyedBroadcastProcessFunction):
            raise PipelineError(
                "process() on a keyed stream connected with a broadcast stream needs a "
                f"KeyedBroadcastProcessFunction instance, got {type(function).__name__}"
            )
        p = self.keyed._p
        p._check_uid(uid, "keyed operator")
        node = BroadcastProcessNode(
            p._next_id(),
            [self.keyed.stream.node.id, self.broadcast.stream.node.id],
            f"broadcast_process:{uid}",
            uid,
            self.keyed.key_fn,
            parallelism,
            function,
            self.broadcast.states,
        )
        return Stream(p, p._add(node))


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


class NonKeyedBroadcastStreams:
    """A non-keyed stream and a broadcast stream: ``.process(BroadcastProcessFunction)``."""

    def __init__(self, stream: Stream, broadcast: BroadcastStream) -> None:
        self.stream, self.broadcast = stream, broadcast

    def process(
        self, function: BroadcastProcessFunction, *, uid: str, parallelism: int | None = None
    ) -> Stream:
        if not isinstance(function, BroadcastProcessFunction):
            raise PipelineError(
                "process() on a stream connected with a broadcast stream needs a "
                f"BroadcastProcessFunction instance, got {type(function).__name__}"
            )
        p = self.stream.pipeline
        p._check_uid(uid, "broadcast operator")
        node = NonKeyedBroadcastNode(
            p._next_id(),
            [self.stream.node.id, self.broadcast.stream.node.id],
            f"broadcast_process:{uid}",
            uid,
            _no_key,
            parallelism,
            function,
            self.broadcast.states,
        )
        return Stream(p, p._add(node))


def _no_key(record: Any) -> Any:
    raise AssertionError("a non-keyed input is never keyed")


def _add(a: Any, b: Any) -> Any:
    return a + b


def _one(_: Any) -> int:
    return 1
