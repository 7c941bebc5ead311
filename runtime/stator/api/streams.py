"""The streams users chain to build a pipeline: ``Stream`` (map, filter, union, process,
sinks, side outputs), ``KeyedStream`` (keyed operators, windows, joins, connect), and the
connected and broadcast streams of two-input operators. Each call adds a node (``nodes.py``)
to the graph (``graph.py``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..errors import PipelineError
from ..state.descriptors import MapStateDescriptor
from .functions import (
    BroadcastProcessFunction,
    KeyedBroadcastProcessFunction,
    KeyedCoProcessFunction,
    KeyedProcessFunction,
    OutputTag,
    ProcessFunction,
)
from .nodes import (
    BroadcastProcessNode,
    CoProcessNode,
    Node,
    NonKeyedBroadcastNode,
    NonKeyedProcessNode,
    OperatorNode,
    ProcessNode,
    ReduceNode,
    SideOutputNode,
    SinkNode,
    TransformNode,
    UnionNode,
    _add,
    _one,
)

if TYPE_CHECKING:
    from ..sinks.base import Sink
    from .graph import PipelineGraph


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
