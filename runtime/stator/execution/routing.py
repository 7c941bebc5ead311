"""Pushing batches through the stateless part of the graph inside one task: transforms are
applied to whole batches, sinks are chained into the task, and records bound for a keyed
operator are keyed, assigned a key-group and bucketed per target subtask (pre-combined per
key for reduce operators, so the shuffle carries one entry per key)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..api.pipeline import KeyedNode, Pipeline, ReduceNode, SinkNode, TransformNode, _add, _one
from ..keygroups import encode_key, key_group
from ..sinks.base import SinkWriter

Batch = list[tuple[Any, int]]  # (value, timestamp)
Entry = tuple[bytes, int, Any, int]  # (key bytes, key-group, value, timestamp)


class Router:
    """Routes the output of one node (a source or keyed operator) within a task."""

    def __init__(
        self,
        pipeline: Pipeline,
        parallelism: dict[str, int],
        open_writer: Any,  # Callable[[SinkNode], SinkWriter]
    ) -> None:
        self.pipeline, self.parallelism, self.open_writer = pipeline, parallelism, open_writer
        self.consumers = {n.id: pipeline.consumers(n.id) for n in pipeline.nodes}
        self.writers: dict[int, SinkWriter] = {}
        # keyed node id -> subtask -> entries; reduce nodes: key bytes -> [acc, ts]
        self.shuffle: dict[int, dict[int, list[Entry]]] = {}
        self.combined: dict[int, dict[bytes, list[Any]]] = {}
        self.records_out = 0

    def push(self, node_id: int, batch: Batch) -> None:
        for consumer in self.consumers[node_id]:
            if isinstance(consumer, TransformNode):
                self.push(consumer.id, _apply(consumer, batch))
            elif isinstance(consumer, SinkNode):
                writer = self.writers.get(consumer.id)
                if writer is None:
                    writer = self.writers[consumer.id] = self.open_writer(consumer)
                writer.write([v for v, _ in batch])
                self.records_out += len(batch)
            elif isinstance(consumer, ReduceNode):
                self._combine(consumer, batch)
            elif isinstance(consumer, KeyedNode):
                self._bucket(consumer, batch)

    def keyed_targets(self, node_id: int) -> list[KeyedNode]:
        """Keyed operators reachable from ``node_id`` through stateless transforms."""
        found: list[KeyedNode] = []
        for consumer in self.consumers[node_id]:
            if isinstance(consumer, TransformNode):
                found.extend(self.keyed_targets(consumer.id))
            elif isinstance(consumer, KeyedNode):
                found.append(consumer)
        return found

    def _bucket(self, node: KeyedNode, batch: Batch) -> None:
        mp, p = self.pipeline.max_parallelism, self.parallelism[node.uid]
        buckets = self.shuffle.setdefault(node.id, {})
        key_fn = node.key_fn
        for value, ts in batch:
            kb = encode_key(key_fn(value))
            kg = key_group(kb, mp)
            sub = kg * p // mp
            bucket = buckets.get(sub)
            if bucket is None:
                bucket = buckets[sub] = []
            bucket.append((kb, kg, value, ts))

    def _combine(self, node: ReduceNode, batch: Batch) -> None:
        """Pre-combine per key. The timestamp of a combined entry is that of the key's last
        contribution in input order."""
        acc = self.combined.setdefault(node.id, {})
        key_fn = node.key_fn
        kbs = [encode_key(key_fn(v)) for v, _ in batch]
        last_ts = dict(zip(kbs, [t for _, t in batch], strict=True))
        if node.value_fn is _one and node.reduce_fn is _add:  # count: C-speed counting
            for kb, n in Counter(kbs).items():
                cur = acc.get(kb)
                if cur is None:
                    acc[kb] = [n, last_ts[kb]]
                else:
                    cur[0] += n
                    cur[1] = last_ts[kb]
            return
        value_fn, reduce_fn = node.value_fn, node.reduce_fn
        for kb, (v, _) in zip(kbs, batch, strict=True):
            c = value_fn(v)
            cur = acc.get(kb)
            if cur is None:
                acc[kb] = [c, None]
            else:
                cur[0] = reduce_fn(cur[0], c)
        for kb, ts in last_ts.items():
            acc[kb][1] = ts

    def shuffle_output(self) -> dict[int, dict[int, list[Entry]]]:
        """Entries per keyed node per subtask (reduce nodes' pre-combined entries included)."""
        mp = self.pipeline.max_parallelism
        for node_id, acc in self.combined.items():
            node = self.pipeline.node(node_id)
            assert isinstance(node, KeyedNode)
            p = self.parallelism[node.uid]
            buckets = self.shuffle.setdefault(node_id, {})
            for kb, (value, ts) in acc.items():
                kg = key_group(kb, mp)
                buckets.setdefault(kg * p // mp, []).append((kb, kg, value, ts))
        self.combined.clear()
        return self.shuffle


def _apply(node: TransformNode, batch: Batch) -> Batch:
    fn = node.fn
    if node.kind == "map":
        return [(fn(v), t) for v, t in batch]
    if node.kind == "filter":
        return [(v, t) for v, t in batch if fn(v)]
    if node.kind == "flat_map":
        return [(o, t) for v, t in batch for o in fn(v)]
    raise ValueError(f"unknown transform {node.kind}")
