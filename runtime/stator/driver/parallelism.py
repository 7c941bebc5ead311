"""How many subtasks each keyed operator has, and how many key-groups the job's state has:
decided here, once, from the job config and the pipeline.

- ``max_parallelism``: the config's ``max_parallelism`` (the operator sets it from
  ``spec.maxParallelism``), else the pipeline's ``Pipeline(max_parallelism=...)``, else
  :data:`~stator.keygroups.DEFAULT_MAX_PARALLELISM`. Both set and different is an error:
  it decides which key-group every key belongs to, so it cannot silently be one or the other.
- an operator's parallelism: the config's ``parallelism`` (``spec.replicas``, what
  ``kubectl scale`` changes), unless the pipeline *pins* that operator with
  ``.process(..., parallelism=N)``; a pinned operator keeps N whatever the replicas.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..api.graph import PipelineGraph
from ..api.nodes import KeyedNode
from ..config import JobConfig
from ..errors import ConfigError
from ..keygroups import DEFAULT_MAX_PARALLELISM, check_parallelism


@dataclass(frozen=True)
class Parallelism:
    max_parallelism: int
    operators: dict[str, int]  # keyed operator uid -> subtasks
    pinned: frozenset[str]  # operators whose parallelism the pipeline fixes

    @property
    def total_subtasks(self) -> int:
        return sum(self.operators.values())

    def restricted(self, uids: set[str]) -> Parallelism:
        """The part of a job's parallelism for the operators ``uids`` (a failover region's)."""
        return Parallelism(
            self.max_parallelism,
            {uid: p for uid, p in self.operators.items() if uid in uids},
            self.pinned & uids,
        )


def resolve_parallelism(pipeline: PipelineGraph, config: JobConfig) -> Parallelism:
    declared, configured = pipeline.max_parallelism, config.max_parallelism
    if declared is not None and configured is not None and declared != configured:
        raise ConfigError(
            f"max_parallelism: the job config (spec.maxParallelism) says {configured}, "
            f"pipeline '{pipeline.name}' declares Pipeline(max_parallelism={declared}); they "
            f"must agree (or set it in one place only)"
        )
    max_p = configured or declared or DEFAULT_MAX_PARALLELISM
    operators: dict[str, int] = {}
    pinned: set[str] = set()
    for node in pipeline.nodes:
        if not isinstance(node, KeyedNode):
            continue
        if node.parallelism is not None:
            pinned.add(node.uid)
        p = node.parallelism if node.parallelism is not None else config.parallelism
        try:
            check_parallelism(p, max_p)
        except ValueError as exc:
            source = (
                f"operator '{node.uid}' pins parallelism={p}"
                if node.uid in pinned
                else f"parallelism (spec.replicas) is {p}"
            )
            raise ConfigError(
                f"{source}, but max_parallelism is {max_p}: {exc}. Lower the parallelism or "
                f"start a new state lineage with a larger max_parallelism"
            ) from exc
        operators[node.uid] = p
    return Parallelism(max_p, operators, frozenset(pinned))
