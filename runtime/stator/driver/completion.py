"""After an epoch: sink output waits for the checkpoint that covers it, and a checkpoint is
completed from the tasks' snapshots (the coordinator writes its metadata, last).

Completing checkpoint N of epoch E (a ``PendingCheckpoint``: ``checkpoint/coordinator.py``
numbers its states), step by step:

1. Every keyed subtask must have reported a snapshot and no upload error. Otherwise N is
   aborted (its uploads that no retained checkpoint references are deleted); epoch E stands
   and its output stays pending until a later checkpoint covers it.
2. N's metadata is assembled: subtask snapshots, source positions after E, the sink output
   pending up to E (so a restore of N can commit it again), the minimum watermark. N is
   ACKNOWLEDGED.
3. Once every upload is done (before the tasks returned, or when the asynchronous ones are
   confirmed: ``in_flight.py``), the coordinator completes N (``CheckpointCoordinator.finish``:
   metadata last, register, retain, then sinks commit every epoch up to E, then subsume).
   A storage failure while writing the metadata aborts N as in step 1. A failure of a
   sink's commit does *not* abort N (it exists: its metadata is written): it fails the
   epoch, and failing over rewinds to N, whose metadata lists the output to commit again
   (``recovery.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..api.nodes import SinkNode, SourceNode
from ..api.time import MAX_TIMESTAMP
from ..checkpoint.coordinator import CheckpointCoordinator, now_ms
from ..checkpoint.metadata import (
    CheckpointMetadata,
    OperatorSnapshot,
    PendingCommit,
    RemoteFile,
    SubtaskSnapshot,
)
from ..checkpoint.pending import PendingCheckpoint, Verdict
from ..epoch.reports import SinkReport, StateReport
from ..errors import SinkCommitError
from ..ha.fencing import guard

log = logging.getLogger("stator.checkpoint")


class PendingOutput:
    """Staged sink output per sink and epoch, until a checkpoint covering it completes."""

    def __init__(self, sinks: dict[str, SinkNode]) -> None:
        self.sinks = sinks
        self.pending: dict[str, dict[int, list[SinkReport]]] = {}
        # Told (sink uid, epoch) after each commit: the committed latency (job_metrics.py).
        self.on_commit: Callable[[str, int], None] | None = None

    def add(self, reports: list[SinkReport]) -> int:
        """Staged parts of one epoch; returns their records. A part reported twice (Spark
        re-ran a map task whose output was lost with its executor, and applies the reports
        of every successful run) is one part: the later report stands for it."""
        unique = list({(r.uid, r.epoch, r.part): r for r in reports}.values())
        for rep in unique:
            parts = self.pending.setdefault(rep.uid, {}).setdefault(rep.epoch, [])
            parts[:] = [p for p in parts if p.part != rep.part]
            parts.append(rep)
        return sum(r.records for r in unique)

    def commit_upto(self, epoch: int) -> None:
        """Make every pending epoch up to ``epoch`` visible (idempotent per sink)."""
        for uid, epochs in self.pending.items():
            sink = self.sinks[uid].sink
            for e in sorted(x for x in epochs if x <= epoch):
                parts = sorted(epochs[e], key=lambda r: r.part)
                sink.commit(uid, e, [r.descriptor for r in parts], [r.payload for r in parts])
                del epochs[e]  # only once committed: a failed commit is retried, not lost
                if self.on_commit is not None:
                    self.on_commit(uid, e)

    def as_commits(self) -> dict[str, tuple[PendingCommit, ...]]:
        """What a checkpoint taken now must commit again if it is restored."""
        return {
            uid: tuple(
                PendingCommit(e, tuple(r.descriptor for r in sorted(parts, key=lambda r: r.part)))
                for e, parts in sorted(epochs.items())
            )
            for uid, epochs in self.pending.items()
        }

    def discard_after(self, epoch: int) -> None:
        """Remove every sink's staged output of epochs after ``epoch`` (a failed job's). Not
        by a replaced driver: it would delete what its successor staged meanwhile."""
        guard(f"discarding staged output after epoch {epoch}")
        self.pending = {}
        for uid, node in self.sinks.items():
            node.sink.discard_after(uid, epoch)

    def rewind(self, epoch: int, restored: dict[str, tuple[PendingCommit, ...]]) -> None:
        """Back to ``epoch``: staged output of later epochs is discarded (it will be replayed),
        output the restored checkpoint covers but had not committed is committed again (not
        by a replaced driver: see :meth:`discard_after`)."""
        guard(f"rewinding sink output to epoch {epoch}")
        self.pending = {}
        for uid, node in self.sinks.items():
            node.sink.discard_after(uid, epoch)
            for commit in restored.get(uid, ()):
                node.sink.commit(uid, commit.epoch, list(commit.parts), [])


def acknowledge(
    pending: PendingCheckpoint,
    job: str,
    lineage: str,
    parallelism: dict[str, int],
    max_parallelism: int,
    states: list[StateReport],
    sources: dict[str, dict[str, dict[str, Any]]],
    output: PendingOutput,
    coordinator: CheckpointCoordinator,
    started: float,
) -> Verdict | None:
    """Steps 1-2 of the module docstring: ``pending`` is ACKNOWLEDGED with its draft metadata
    (its ``duration_ms`` set when it completes; ``started``: its epoch's start, monotonic),
    or aborted: then its verdict says why."""
    by_op: dict[str, dict[int, SubtaskSnapshot]] = {}
    for r in states:
        if r.snapshot is not None:
            by_op.setdefault(r.uid, {})[r.subtask] = r.snapshot
    errors = [r.checkpoint_error for r in states if r.checkpoint_error]
    got, expected = sum(len(v) for v in by_op.values()), sum(parallelism.values())
    if errors or got != expected:
        reason = errors[0] if errors else f"{got} of {expected} subtasks reported a snapshot"
        return coordinator.fail(pending, reason, files=uploaded_files(states))
    operators = {
        uid: OperatorSnapshot(uid, parallelism[uid], tuple(subs[i] for i in sorted(subs)))
        for uid, subs in by_op.items()
    }
    draft = CheckpointMetadata(
        checkpoint_id=pending.checkpoint_id,
        epoch=pending.epoch,
        job=job,
        created_ms=now_ms(),
        max_parallelism=max_parallelism,
        incremental=pending.incremental,
        operators=operators,
        sources=sources,
        sinks=output.as_commits(),
        watermark=min((r.watermark for r in states), default=MAX_TIMESTAMP),
        lineage=lineage,
    )
    pending.acknowledged(draft, uploaded_files(states), started)
    return None


def uploaded_files(states: list[StateReport]) -> list[RemoteFile]:
    return [f for r in states if r.snapshot for f in r.snapshot.files]


def commit_completed(
    meta: CheckpointMetadata, output: PendingOutput, coordinator: CheckpointCoordinator
) -> None:
    """Steps 6-7 of ``checkpoint/coordinator.py`` for a completed checkpoint: sinks commit
    what it covers, then older checkpoints are subsumed (also if a sink failed: ``meta``
    lists what it must commit again)."""
    try:
        guard(f"sink commits up to epoch {meta.epoch}")
        output.commit_upto(meta.epoch)
    except Exception as exc:
        raise SinkCommitError(
            f"checkpoint {meta.checkpoint_id} is complete but a sink could not commit "
            f"epochs up to {meta.epoch}: {exc}"
        ) from exc
    finally:
        coordinator.subsume()


def notify_sources(meta: CheckpointMetadata, sources: dict[str, SourceNode]) -> None:
    """Tell each source the positions a completed checkpoint holds (e.g. the Kafka source
    commits them to its consumer group for monitoring). A failure is logged, never fatal:
    restore reads the checkpoint, not what a source published."""
    for uid, node in sources.items():
        splits = meta.sources.get(uid)
        if not splits:
            continue
        try:
            node.source.on_checkpoint_complete({s: st["position"] for s, st in splits.items()})
        except Exception as exc:
            log.warning(
                "source '%s': publishing the positions of checkpoint %d failed: %s",
                uid,
                meta.checkpoint_id,
                exc,
            )
