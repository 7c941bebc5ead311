"""Pushing batches through the stateless part of the graph inside one task.

Batches are columnar (a list of values and a list of timestamps), so transforms are list
comprehensions and no per-record tuples are built. Sinks are chained into the task. Records
bound for a keyed operator get their kkey (key-group | length | encoded key) and are bucketed
per target subtask; for reduce operators they are first combined per key, so the shuffle
carries one entry per key and map task.
"""

from __future__ import annotations

import pickle
from collections import Counter
from itertools import compress
from typing import Any

from .. import pickling
from ..api.functions import OutputTag
from ..api.graph import PipelineGraph
from ..api.nodes import (
    KeyedNode,
    ReduceNode,
    Route,
    SideOutputNode,
    SinkNode,
    SourceNode,
    TransformNode,
    UnionNode,
    _add,
    _one,
)
from ..epoch.availability import Availability
from ..epoch.reports import SinkReport
from ..epoch.spec import EpochSpec
from ..keygroups import encode_keys, stable_hash
from ..sinks.base import SinkWriter
from ..state.layout import HEADER, MAX_KEY_BYTES
from .user_errors import user_code

Batch = tuple[list[Any], list[Any]]  # (values, timestamps)
Columns = tuple[list[bytes], list[Any], list[Any]]  # (kkeys, values, timestamps)
# What a task sends one keyed subtask for one of its inputs: (order key, watermark, input,
# columns, availability). The order key (node id, split order or subtask) fixes the order in
# which the subtask processes its inputs; the input is the position in the keyed node's
# ``inputs``. The watermark is None from an idle source split (``driver/idleness.py``). The
# availability summarizes when the sending task's records became available
# (``epoch/availability.py``).
Header = tuple[tuple[int, int], int | None, int, Columns, Availability]
Target = tuple[KeyedNode, int]  # a keyed node and which of its inputs
Shuffled = tuple[int, int, bytes]  # (keyed node id, target subtask, packed header)


# kkeys of recently seen keys, per maxParallelism: keys recur across epochs, and a dict hit is
# several times cheaper than hashing again. Bounded: cleared when it grows past the limit.
_KKEY_MEMO: dict[int, dict[bytes, bytes]] = {}
MEMO_LIMIT = 2_000_000


def _kkey(kb: bytes, mp: int) -> bytes:
    memo = _KKEY_MEMO.get(mp)
    if memo is None:
        memo = _KKEY_MEMO[mp] = {}
    kk = memo.get(kb)
    if kk is None:
        if len(kb) > MAX_KEY_BYTES:
            raise ValueError(f"a key may encode to at most {MAX_KEY_BYTES} bytes, got {len(kb)}")
        if len(memo) >= MEMO_LIMIT:
            memo.clear()
        kk = memo[kb] = HEADER.pack(stable_hash(kb) % mp, len(kb)) + kb
    return kk


class Router:
    """Routes the output of one node (a source or keyed operator) within a task."""

    def __init__(
        self,
        pipeline: PipelineGraph,
        parallelism: dict[str, int],
        max_parallelism: int,
        open_writer: Any,
        epoch: int,
    ) -> None:
        self.pipeline, self.parallelism, self.open_writer = pipeline, parallelism, open_writer
        self.epoch = epoch  # named in the error of a user function that raises
        self.max_parallelism = max_parallelism
        self.consumers = {n.id: pipeline.consumers(n.id) for n in pipeline.nodes}
        self.writers: dict[int, SinkWriter] = {}
        # (keyed node, input) -> subtask -> columns
        self.shuffle: dict[tuple[int, int], dict[int, Columns]] = {}
        # (node, input) -> the columns of a forward (non-keyed) input, for one subtask
        self.forward: dict[tuple[int, int], Columns] = {}
        self.combined: dict[int, dict[bytes, list[Any]]] = {}  # reduce node -> kb -> [acc, ts]
        self.counted: dict[int, tuple[Counter[bytes], dict[bytes, Any]]] = {}  # count fast path
        self.records_out = 0

    def push(self, node_id: int, batch: Batch) -> None:
        """Send a node's (main) output on to each consumer, once per input it feeds (a stream
        connected or unioned with itself feeds two)."""
        for consumer in self.consumers[node_id]:
            for side, source in enumerate(consumer.inputs):
                if source == node_id:
                    self._feed(consumer, side, batch)

    def push_side(self, node_id: int, side_outputs: dict[OutputTag, Batch]) -> None:
        """Send what a process function emitted with ``ctx.output`` to the streams that read
        its side outputs."""
        for consumer in self.consumers[node_id]:
            if isinstance(consumer, SideOutputNode) and consumer.tag in side_outputs:
                self.push(consumer.id, side_outputs[consumer.tag])

    def _feed(self, consumer: Any, side: int, batch: Batch) -> None:
        if isinstance(consumer, TransformNode):
            with user_code(consumer.name, self.epoch):
                out = _apply(consumer, batch)
            self.push(consumer.id, out)
        elif isinstance(consumer, UnionNode):
            self.push(consumer.id, batch)
        elif isinstance(consumer, SideOutputNode):
            return  # fed by push_side, not by the main output
        elif isinstance(consumer, SinkNode):
            writer = self.writers.get(consumer.id)
            if writer is None:
                writer = self.writers[consumer.id] = self.open_writer(consumer)
            writer.write(batch[0])
            self.records_out += len(batch[0])
        elif isinstance(consumer, ReduceNode):
            with user_code(consumer.uid, self.epoch):  # its key and value functions
                self._combine(consumer, batch)
        elif isinstance(consumer, KeyedNode):
            with user_code(consumer.uid, self.epoch):  # its key function
                self._bucket(consumer, side, batch)

    def staged(self, epoch: int) -> list[SinkReport]:
        """Stage every chained sink's output of this task (one part per sink)."""
        reports = []
        for node_id, writer in sorted(self.writers.items()):
            node = self.pipeline.node(node_id)
            assert isinstance(node, SinkNode)
            descriptor, payload = writer.finish()
            reports.append(SinkReport(node.uid, epoch, descriptor, payload))
        return reports

    def downstream(
        self,
        origin: tuple[int, int],
        watermark: int | None,
        node_id: int,
        available: Availability = (),
    ) -> list[Shuffled]:
        """One (possibly empty) batch for every subtask of every keyed operator fed by
        ``node_id``: an empty batch still carries this task's watermark, which the subtask
        needs to advance its own; each carries ``available``, of this task's records."""
        buckets = self.shuffle_output()
        out = []
        for target, side in keyed_targets(self.pipeline, node_id):
            per_sub = buckets.get((target.id, side), {})
            p = self.parallelism[target.uid]
            forward = self.forward.get((target.id, side))
            if forward is not None:  # this task's share goes to one subtask, spread by origin
                per_sub = {(origin[0] * 31 + origin[1]) % p: forward}
            for sub in range(p):
                header = (origin, watermark, side, per_sub.get(sub, ([], [], [])), available)
                out.append((target.id, sub, pack(header)))
        return out

    def _buckets(self, node: KeyedNode, side: int) -> dict[int, Columns]:
        buckets = self.shuffle.get((node.id, side))
        if buckets is None:
            p = self.parallelism[node.uid]
            buckets = self.shuffle[(node.id, side)] = {s: ([], [], []) for s in range(p)}
        return buckets

    def _bucket(self, node: KeyedNode, side: int, batch: Batch) -> None:
        """Key and route each record (comprehensions: a Python loop per record showed); a
        broadcast input's records go to every subtask, without keys."""
        mp = self.max_parallelism
        values, stamps = batch
        route = node.route(side)
        if route is Route.BROADCAST:
            for cols in self._buckets(node, side).values():
                cols[1].extend(values)
                cols[2].extend(stamps)
            return
        if route is Route.FORWARD:  # to one subtask, picked when the task's origin is known
            cols = self.forward.setdefault((node.id, side), ([], [], []))
            cols[1].extend(values)
            cols[2].extend(stamps)
            return
        kbs = encode_keys(list(map(node.key_for(side), values)))
        known = _KKEY_MEMO.get(mp, {}).get
        self._spread(node.id, side, [known(kb) or _kkey(kb, mp) for kb in kbs], values, stamps)

    def _combine(self, node: ReduceNode, batch: Batch) -> None:
        """Pre-combine per key; an entry's timestamp is its key's last one in input order."""
        acc = self.combined.setdefault(node.id, {})
        key_fn = node.key_fn
        values, stamps = batch
        kbs = encode_keys(list(map(key_fn, values)))
        last_ts = dict(zip(kbs, stamps, strict=True))
        if node.value_fn is _one and node.reduce_fn is _add:  # count: C-speed counting
            earlier = self.counted.pop(node.id, None)
            if earlier is None and not acc:  # the usual case: one batch per task
                self.counted[node.id] = (Counter(kbs), last_ts)
                return
            for counts, stamps_of in ((earlier or (Counter(), {})), (Counter(kbs), last_ts)):
                for kb, n in counts.items():
                    cur = acc.get(kb)
                    if cur is None:
                        acc[kb] = [n, stamps_of[kb]]
                    else:
                        cur[0] += n
                        cur[1] = stamps_of[kb]
            return
        value_fn, reduce_fn = node.value_fn, node.reduce_fn
        for kb, v in zip(kbs, values, strict=True):
            c = value_fn(v)
            cur = acc.get(kb)
            if cur is None:
                acc[kb] = [c, None]
            else:
                cur[0] = reduce_fn(cur[0], c)
        for kb, ts in last_ts.items():
            acc[kb][1] = ts

    def shuffle_output(self) -> dict[tuple[int, int], dict[int, Columns]]:
        """Columns per keyed node per subtask (with reduce nodes' combined entries)."""
        mp = self.max_parallelism
        known = _KKEY_MEMO.get(mp, {}).get
        for node_id, (counts, last_ts) in self.counted.items():
            kbs = list(counts)
            self._spread(
                node_id,
                0,
                [known(kb) or _kkey(kb, mp) for kb in kbs],
                list(counts.values()),
                [last_ts[kb] for kb in kbs],
            )
        self.counted.clear()
        for node_id, acc in self.combined.items():
            if acc:
                kbs = list(acc)
                entries = list(acc.values())
                self._spread(
                    node_id,
                    0,
                    [_kkey(kb, mp) for kb in kbs],
                    [e[0] for e in entries],
                    [e[1] for e in entries],
                )
        self.combined.clear()
        return self.shuffle

    def _spread(
        self, node_id: int, side: int, kks: list[bytes], vals: list[Any], tss: list[Any]
    ) -> None:
        """Append columns to each target subtask's bucket."""
        node = self.pipeline.node(node_id)
        assert isinstance(node, KeyedNode)
        mp, p = self.max_parallelism, self.parallelism[node.uid]
        buckets = self._buckets(node, side)
        subs = [((kk[0] << 8) | kk[1]) * p // mp for kk in kks]
        if p <= 8:  # a mask per subtask and C-speed selection beat one Python loop
            for sub, cols in buckets.items():
                mask = [s == sub for s in subs]
                cols[0].extend(compress(kks, mask))
                cols[1].extend(compress(vals, mask))
                cols[2].extend(compress(tss, mask))
            return
        for kk, v, t, sub in zip(kks, vals, tss, subs, strict=True):
            cols = buckets[sub]
            cols[0].append(kk)
            cols[1].append(v)
            cols[2].append(t)


def keyed_targets(pipeline: PipelineGraph, node_id: int) -> list[Target]:
    """Keyed operators (and which of their inputs) fed by ``node_id``'s output, main or
    side, through stateless nodes: each gets a header from every task of ``node_id``, empty
    or not, because it carries the task's watermark."""
    found: dict[tuple[int, int], Target] = {}
    for consumer in pipeline.consumers(node_id):
        if isinstance(consumer, KeyedNode):
            for side, src in enumerate(consumer.inputs):
                if src == node_id:
                    found[(consumer.id, side)] = (consumer, side)
        elif not isinstance(consumer, SinkNode):
            for target, side in keyed_targets(pipeline, consumer.id):
                found[(target.id, side)] = (target, side)
    return list(found.values())


def pack(header: Header) -> bytes:
    """A header as the shuffle carries it: pickled here, without the memo PySpark's own
    pickling keeps (``pickling.py``: profiled, the memo was a tenth of the keyed count's
    worker time), so PySpark only copies the bytes. By value, as PySpark pickles records."""
    return pickling.dumps(header, by_value=True)


def unpack(blob: bytes) -> Header:
    header: Header = pickle.loads(blob)  # noqa: S301 - written by this job's own tasks
    return header


def _apply(node: TransformNode, batch: Batch) -> Batch:
    fn = node.fn
    values, stamps = batch
    if node.kind == "map":
        return [fn(v) for v in values], stamps
    if node.kind == "filter":
        keep = [bool(fn(v)) for v in values]
        return (
            [v for v, k in zip(values, keep, strict=True) if k],
            [t for t, k in zip(stamps, keep, strict=True) if k],
        )
    if node.kind == "flat_map":
        out_v: list[Any] = []
        out_t: list[Any] = []
        for v, t in zip(values, stamps, strict=True):
            produced = list(fn(v))
            out_v.extend(produced)
            out_t.extend([t] * len(produced))
        return out_v, out_t
    raise ValueError(f"unknown transform {node.kind}")


def distinct_targets(pipeline: PipelineGraph, node_id: int) -> list[KeyedNode]:
    """The keyed operators ``node_id``'s output feeds (through stateless nodes), once each."""
    return list({t.id: t for t, _ in keyed_targets(pipeline, node_id)}.values())


def epoch_producers(spec: EpochSpec, pipeline: PipelineGraph) -> dict[int, int]:
    """The keyed operators that run in an epoch (fed by a source or keyed operator of the
    epoch, or checkpointed), each with how many tasks feed each of its subtasks: the
    epoch's data flow, as a Spark job per epoch wires it (``driver/sparkjob.py``) and a
    long-running keyed task waits for it (``longrun/task.py``)."""
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
