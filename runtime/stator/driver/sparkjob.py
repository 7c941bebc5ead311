"""One epoch as one Spark job: the pipeline graph turned into RDDs.

source tasks (one per split range) -> shuffle by target subtask -> keyed tasks (one per
subtask) -> ... -> the terminal RDDs, drained by one action. Every task reports to the driver
through one accumulator; the job's result is the list of reports.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ..api.graph import PipelineGraph
from ..api.nodes import KeyedNode, SourceNode
from ..cluster.jvm import prefer_locations
from ..epoch.reports import Report
from ..epoch.spec import EpochSpec
from ..locality.state_holders import state_on
from ..tasks.keyed import keyed_task
from ..tasks.routing import distinct_targets, epoch_producers
from ..tasks.source import drain, source_task


def run_epoch_job(
    spark: Any,
    spec: EpochSpec,
    group: str,
    description: str,
    placement: Callable[[str, int], list[str]] | None = None,
) -> list[Report]:
    """Run one epoch as Spark job group ``group``; ``placement`` (uid, parallelism ->
    preferred location per subtask), if given, places keyed tasks through the JVM RDD
    (``locality/placement.py``)."""
    from pyspark.accumulators import AccumulatorParam  # noqa: PLC0415 - pyspark is heavy

    class Reports(AccumulatorParam):  # type: ignore[type-arg]
        def zero(self, value: Any) -> list[Any]:
            return []

        def addInPlace(self, a: list[Any], b: list[Any]) -> list[Any]:
            a.extend(b)
            return a

    pipeline = spec.pipeline
    sc = spark.sparkContext
    # Only Stator cancels an epoch's job (``FutileRetryListener``: it must rewind): its tasks
    # are interrupted, or one blocked fetching a lost executor's shuffle output would hold
    # its executor's slot for the network timeout, delaying the rewound epoch as long.
    sc.setJobGroup(group, description, interruptOnCancel=True)
    acc = sc.accumulator([], Reports())
    inputs: dict[int, list[Any]] = {}
    terminals: list[Any] = []
    for uid, ranges in spec.ranges.items():
        source = next(n for n in pipeline.nodes if isinstance(n, SourceNode) and n.uid == uid)
        rdd = sc.parallelize(range(len(ranges)), len(ranges)).mapPartitionsWithIndex(
            functools.partial(source_task, spec, source.id, acc)
        )
        _connect(pipeline, source.id, rdd, inputs, terminals)
    running = epoch_producers(spec, pipeline)
    for node in pipeline.nodes:  # node ids are in topological order
        if not isinstance(node, KeyedNode) or node.id not in running:
            continue
        if node.id in inputs:
            parts = inputs[node.id]
            shuffled = (sc.union(parts) if len(parts) > 1 else parts[0]).partitionBy(
                spec.parallelism[node.uid], _identity
            )
        else:  # every split feeding it has finished, but its state is checkpointed
            shuffled = sc.parallelize([], spec.parallelism[node.uid])
        if placement is not None:
            p = spec.parallelism[node.uid]
            shuffled = prefer_locations(
                sc, shuffled, placement(node.uid, p), state_on(spec, node.uid, p)
            )
        out = shuffled.mapPartitionsWithIndex(functools.partial(keyed_task, spec, node.id, acc))
        _connect(pipeline, node.id, out, inputs, terminals)
    if terminals:
        # Counted in the JVM: PySpark's foreachPartition would count in Python and collect
        # the counts through a socket server, 13 more calls to the JVM per epoch.
        last = sc.union(terminals) if len(terminals) > 1 else terminals[0]
        last.mapPartitions(drain)._jrdd.count()
    return list(acc.value)


def _connect(
    pipeline: PipelineGraph,
    node_id: int,
    rdd: Any,
    inputs: dict[int, list[Any]],
    terminals: list[Any],
) -> None:
    """Feed ``rdd`` (a source's or keyed operator's output) to the keyed operators downstream,
    or mark it terminal (its sinks are chained into its tasks)."""
    targets = distinct_targets(pipeline, node_id)
    if not targets:
        terminals.append(rdd)
        return
    if len(targets) > 1:
        rdd = rdd.cache()  # one computation feeds several shuffles
    for target in targets:
        inputs.setdefault(target.id, []).append(
            rdd.filter(functools.partial(_is_for, target.id)).map(_strip_target)
        )


def _identity(subtask: int) -> int:
    return subtask


def _is_for(target: int, item: tuple[int, int, Any]) -> bool:
    return item[0] == target


def _strip_target(item: tuple[int, int, Any]) -> tuple[int, Any]:
    return item[1], item[2]
