"""A pipeline's graph: sources, stateless transforms, ``key_by``, keyed operators, sinks (the
nodes: ``nodes.py``). The driver and the tasks read it; users build it through ``Pipeline``
(``pipeline.py``, which adds running it in-process) and its streams (``streams.py``).

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
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..errors import PipelineError
from ..keygroups import check_parallelism
from .nodes import KeyedNode, Node, SinkNode, SourceNode
from .streams import Stream
from .time import BoundedOutOfOrderness

if TYPE_CHECKING:
    from ..sources.base import Source

UID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


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
