"""What a keyed task runs on an executor: one subtask of a keyed operator for one epoch.

1. Sort the incoming batches by their order key, so a replayed epoch processes the same
   records in the same order.
2. Open the subtask's local state at the epoch the driver expects, restoring it if it is
   not there (``locality/restore.py``).
3. Run the operator, fire timers (then one clock read: the processing latency of the
   epoch's records, per batch: ``epoch/availability.py``), stage chained sinks' output.
4. Commit the epoch's state changes atomically (after staging: a failed commit re-stages the
   same parts on retry; the reverse order could lose them).
5. If asked: write the savepoint part (canonical key-group files, or the database's files:
   ``savepoint/native.py``), then take the checkpoint part (a failed upload
   declines the checkpoint, not the epoch; with ``checkpoint.async_upload`` the upload runs
   after the task returns, ``checkpoint/uploads.py``).
6. Hand this executor's standby copies to its uploader (``standby_copy.py``), if any, and
   report, with the task's busy time (``driver/job_metrics.py``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

from ..api.nodes import KeyedNode, OperatorNode, ReduceNode
from ..api.time import MIN_TIMESTAMP
from ..checkpoint.coordinator import now_ms
from ..cluster.jvm import task_location
from ..epoch.availability import Availability, at, attribute, summarize
from ..epoch.histogram import Histogram
from ..epoch.reports import Report, SavepointPart, StateReport
from ..epoch.spec import EpochSpec, node_name
from ..errors import StateCompatibilityError
from ..keygroups import range_for_subtask
from ..locality.restore import open_state
from ..locality.snapshot import take_snapshot
from ..locality.standby_copy import hand_over
from ..savepoint.metadata import NATIVE
from ..savepoint.native import export_database
from ..savepoint.transfer import export_key_groups, state_catalog
from ..state.backend import KeptOpen, KeyedBackend
from ..state.operator_state import to_text
from .gc_pause import gc_paused
from .operators import ProcessRunner, ReduceRunner
from .routing import Header, Router, Shuffled, unpack
from .source import part_name
from .user_errors import user_code


@gc_paused
def keyed_task(
    spec: EpochSpec,
    node_id: int,
    reports: Any,
    subtask: int,
    items: Iterable[tuple[int, bytes]],
    kept: KeptOpen | None = None,
) -> Iterator[Shuffled]:
    """``kept``: where a long-running task keeps its database open between epochs
    (``state/backend.py`` ``KeptOpen``)."""
    started_ns, started_ms = time.perf_counter_ns(), now_ms()
    node = spec.pipeline.node(node_id)
    assert isinstance(node, KeyedNode)
    p = spec.parallelism[node.uid]
    key_groups = range_for_subtask(subtask, p, spec.max_parallelism)
    headers = sorted((unpack(h) for _, h in items), key=lambda h: (h[0], h[2]))
    # Idle source splits send None: they do not hold the watermark back; with every input
    # idle the subtask keeps its watermark (MIN_TIMESTAMP here cannot lower it).
    new_watermark = min((h[1] for h in headers if h[1] is not None), default=MIN_TIMESTAMP)
    batches = [(h[2], h[3]) for h in headers]
    records_in = sum(len(b[1]) for _, b in batches)  # values: broadcast input has no keys
    input_ms = now_ms()

    backend, restored = open_state(spec, node.uid, subtask, key_groups, kept)
    executor, host = task_location()
    try:
        runner: ProcessRunner | ReduceRunner | None = None

        def current_key() -> Any:
            return runner.current_key() if runner is not None else None

        # The user's open(), process_element(), on_timer() or reduce function.
        with user_code(node.uid, spec.epoch, current_key):
            if isinstance(node, OperatorNode):
                runner = ProcessRunner(node, backend, subtask, p, spec.processing_time_ms)
            else:
                assert isinstance(node, ReduceNode)
                runner = ReduceRunner(node, backend)
            if spec.verify_states:
                _verify_declared(spec, node.uid, backend)
            output = runner.run(batches, new_watermark)
        processed_ms = now_ms()
        latency, available = processing_latency(headers, processed_ms, spec.planned_ms)
        watermark = max(backend.watermark, new_watermark)
        router = Router(
            spec.pipeline,
            spec.parallelism,
            spec.max_parallelism,
            lambda sink: sink.sink.writer(sink.uid, spec.epoch, part_name(node.uid, subtask)),
            spec.epoch,
        )
        router.push(node.id, output)
        router.push_side(node.id, runner.side_outputs)
        out = router.downstream((node.id, subtask), watermark, node.id, available)
        staged = router.staged(spec.epoch)
        backend.commit(spec.epoch, watermark)
        # Failing here fails the savepoint, through the epoch.
        savepoint = _savepoint_part(spec, node.uid, subtask, backend)
        snapshot, error, upload = None, None, ""
        if spec.checkpoint is not None:
            try:
                snapshot, upload = take_snapshot(spec, node.uid, subtask, key_groups, backend)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
        tally = hand_over(spec)
        state = StateReport(
            node.uid,
            subtask,
            spec.epoch,
            watermark,
            records_in,
            len(output[0]),
            snapshot,
            error,
            savepoint,
            restored,
            executor,
            host,
            node_name(),
            upload,
            backend.commit_token,
            tally,
            busy_ns=max(0, time.perf_counter_ns() - started_ns - restored.duration_ms * 1_000_000),
            latency=latency,
            started_ms=started_ms,
            input_ms=input_ms,
            processed_ms=processed_ms,
            ended_ms=now_ms(),
        )
        done: list[Report] = [state, *staged]
        reports.add(done)
    finally:
        backend.close()
    return iter(out)


def processing_latency(
    headers: list[Header], processed_ms: int, planned_ms: int
) -> tuple[Histogram, Availability]:
    """The latency of the subtask's records from available to processed (``processed_ms``:
    one clock read once its function ran over all of them), per batch
    (``epoch/availability.py``), and the availability of what it sends on: of what it took in;
    output without input (timers) counts from when the epoch was planned."""
    latency = Histogram()
    taken: list[tuple[int, int]] = []
    for h in headers:
        for at_ms, n in attribute(h[4], len(h[3][1])):
            latency.observe(processed_ms - at_ms, n)
            taken.append((at_ms, n))
    return latency, summarize(taken) or at(planned_ms or processed_ms, 1)


def _savepoint_part(
    spec: EpochSpec, uid: str, subtask: int, backend: KeyedBackend
) -> SavepointPart | None:
    """Step 5's savepoint part, if the epoch takes one: the canonical key-group files, or the
    database's files (native)."""
    sp = spec.savepoint
    if sp is None:
        return None
    catalog = state_catalog(backend.registry)
    if sp.format_type == NATIVE:
        work = spec.state_dir(uid, subtask)
        p = spec.parallelism[uid]
        return SavepointPart(
            {}, catalog, export_database(backend, sp.store, subtask, p, spec.epoch, work)
        )
    keyed = export_key_groups(backend, sp.store, uid, sp.compression)
    return SavepointPart(keyed, catalog, operator_state=to_text(backend.operator_blob))


def _verify_declared(spec: EpochSpec, uid: str, backend: KeyedBackend) -> None:
    """After a restore: every restored state must be declared by the code (in ``open``)."""
    missing = backend.undeclared_states()
    if not missing:
        return
    if not spec.allow_non_restored_state:
        raise StateCompatibilityError(
            f"operator '{uid}' restored state {missing} that the code no longer declares; "
            f"declare it in open(), or set restore.allow_non_restored_state=true to drop it"
        )
    backend.drop_states(missing)
