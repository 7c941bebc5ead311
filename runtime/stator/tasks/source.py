"""What a source task runs on an executor: read one split range, run the stateless chain,
stage chained sinks' output, and bucket records for the keyed operators downstream."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

from ..api.nodes import SourceNode
from ..api.time import MAX_TIMESTAMP, MIN_TIMESTAMP
from ..checkpoint.coordinator import now_ms
from ..epoch.reports import Report, SplitFailure, SplitReport
from ..epoch.spec import EpochSpec
from .gc_pause import gc_paused
from .routing import Batch, Router, Shuffled
from .user_errors import USER_ERROR_MARKER, user_code


def part_name(*parts: object) -> str:
    """A sink part name: deterministic, so a replayed epoch rewrites the same objects."""
    return re.sub(r"[^A-Za-z0-9._=-]", "_", "-".join(str(p) for p in parts))


@gc_paused
def source_task(
    spec: EpochSpec,
    node_id: int,
    reports: Any,
    index: int,
    items: Iterable[Any],
    last_attempt: bool | None = None,
) -> Iterator[Shuffled]:
    """``last_attempt``: whether this is the task's last attempt (None: Spark's attempt
    number says; a long-running task counts its own, ``longrun/task.py``)."""
    attempts = spec.split_failover_attempts
    if last_attempt is None:
        last_attempt = bool(attempts) and _last_attempt(attempts)
    if not attempts or not last_attempt:
        return _read_range(spec, node_id, reports, index)
    try:
        return _read_range(spec, node_id, reports, index)
    except Exception as exc:  # the driver fails this split over; the epoch goes on
        node = spec.pipeline.node(node_id)
        assert isinstance(node, SourceNode)
        split = spec.ranges[node.uid][index].split
        error = f"{type(exc).__name__}: {exc}"
        if USER_ERROR_MARKER in error:  # as Spark words it: a user error on every attempt
            error += f"\n(the task failed {attempts} times)"
        reports.add([SplitFailure(node.uid, split, spec.epoch, error)])
        return iter(())


def _last_attempt(attempts: int) -> bool:
    from pyspark import TaskContext  # noqa: PLC0415 - only inside a task

    ctx = TaskContext.get()
    return ctx is None or ctx.attemptNumber() >= attempts - 1


def _read_range(spec: EpochSpec, node_id: int, reports: Any, index: int) -> Iterator[Shuffled]:
    started_ms = now_ms()
    node = spec.pipeline.node(node_id)
    assert isinstance(node, SourceNode)
    rng = spec.ranges[node.uid][index]
    records, rejected, available = node.source.read_available(rng, spec.planned_ms or now_ms())
    max_ts = spec.split_max_ts.get(node.uid, {}).get(rng.split, MIN_TIMESTAMP)
    batch: Batch
    if node.timestamps is not None:
        ts_fn = node.timestamps
        with user_code(node.uid, spec.epoch):  # the pipeline's timestamp function
            batch = (records, [ts_fn(r) for r in records])
    elif node.source.provides_timestamps:  # the reader returned (record, timestamp) pairs
        batch = ([r for r, _ in records], [t for _, t in records])
    else:
        batch = (records, [None] * len(records))
    if batch[1] and batch[1][0] is not None:
        max_ts = max(max_ts, *batch[1])
    # An idle split sends no watermark (None): it does not hold back the operators it feeds.
    watermark: int | None = (
        MAX_TIMESTAMP
        if rng.final
        else None
        if rng.idle and not records
        else node.watermarks.watermark(max_ts)
    )

    router = Router(
        spec.pipeline,
        spec.parallelism,
        spec.max_parallelism,
        lambda sink: sink.sink.writer(sink.uid, spec.epoch, part_name(node.uid, rng.split)),
        spec.epoch,
    )
    router.push(node.id, batch)
    out = router.downstream((node.id, rng.order), watermark, node.id, available)
    done: list[Report] = [
        SplitReport(
            node.uid,
            rng.split,
            spec.epoch,
            max_ts,
            len(records),
            rejected,
            available,
            started_ms=started_ms,
            ended_ms=now_ms(),
        )
    ]
    reports.add([*done, *router.staged(spec.epoch)])
    return iter(out)


def drain(items: Iterable[Any]) -> Iterator[Any]:
    """The last step of an epoch's Spark job: its output is in the reports, so nothing goes
    back to the driver (the job's action counts what this yields: nothing)."""
    for _ in items:
        pass
    return iter(())
