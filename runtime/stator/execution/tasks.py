"""The code Spark runs on executors for one epoch: source tasks (read a split range, run the
stateless chain, stage sink output, bucket records for the shuffle) and keyed tasks (restore
or open the subtask's state, run the operator, stage sink output, commit the epoch, take the
task's part of a checkpoint). Every task reports to the driver through an accumulator."""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ..api.pipeline import KeyedNode, ProcessNode, ReduceNode, SinkNode, SourceNode
from ..api.time import MAX_TIMESTAMP, MIN_TIMESTAMP
from ..checkpoint.metadata import SubtaskSnapshot
from ..checkpoint.transfer import download_snapshot, upload_snapshot
from ..errors import StateCompatibilityError, StateMismatchError, StatorError
from ..keygroups import KeyGroupRange, range_for_subtask
from ..savepoint.transfer import (
    database_entries,
    export_key_groups,
    import_entries,
    savepoint_entries,
    state_catalog,
)
from ..state.backend import KeyedBackend
from .keyed import ProcessRunner, ReduceRunner
from .routing import Batch, Columns, Router
from .spec import EpochSpec, RestoreTask

RESTORE_ERROR_MARKER = "StatorRestoreError"
Header = tuple[tuple[int, int], int, Columns]  # (order key, watermark, kkeys/values/stamps)


class RestoreError(StatorError):
    """A checkpoint could not be materialized (missing, truncated or corrupt files)."""

    def __init__(self, checkpoint_id: int, detail: str) -> None:
        super().__init__(f"{RESTORE_ERROR_MARKER}[{checkpoint_id}]: {detail}")
        self.checkpoint_id = checkpoint_id


def _part_name(*parts: object) -> str:
    return re.sub(r"[^A-Za-z0-9._=-]", "_", "-".join(str(p) for p in parts))


def _finish_sinks(router: Router, spec: EpochSpec) -> list[dict[str, Any]]:
    reports = []
    for node_id, writer in sorted(router.writers.items()):
        node = spec.pipeline.node(node_id)
        assert isinstance(node, SinkNode)
        descriptor, payload = writer.finish()
        reports.append(
            {
                "kind": "sink",
                "uid": node.uid,
                "epoch": spec.epoch,
                "descriptor": descriptor,
                "payload": payload,
            }
        )
    return reports


def _downstream(
    router: Router,
    spec: EpochSpec,
    origin: tuple[int, int],
    watermark: int,
    targets: list[KeyedNode],
) -> list[tuple[int, int, Header]]:
    """One (possibly empty) batch for every subtask of every keyed target: an empty batch
    still carries this task's watermark, which the target needs to advance its own."""
    buckets = router.shuffle_output()
    out = []
    for target in targets:
        per_sub = buckets.get(target.id, {})
        for sub in range(spec.parallelism[target.uid]):
            out.append((target.id, sub, (origin, watermark, per_sub.get(sub, ([], [], [])))))
    return out


def source_task(
    spec: EpochSpec, node_id: int, reports: Any, index: int, _: Iterable[Any]
) -> Iterator[tuple[int, int, Header]]:
    node = spec.pipeline.node(node_id)
    assert isinstance(node, SourceNode)
    rng = spec.ranges[node.uid][index]
    t0 = time.perf_counter()
    records = node.source.read(rng)
    t_read = time.perf_counter()
    max_ts = spec.split_max_ts.get(node.uid, {}).get(rng.split, MIN_TIMESTAMP)
    batch: Batch
    if node.timestamps is not None:
        ts_fn = node.timestamps
        batch = (records, [ts_fn(r) for r in records])
    elif node.source.provides_timestamps:  # the reader returned (record, timestamp) pairs
        batch = ([r for r, _ in records], [t for _, t in records])
    else:
        batch = (records, [None] * len(records))
    if batch[1] and batch[1][0] is not None:
        max_ts = max(max_ts, *batch[1])
    watermark = MAX_TIMESTAMP if rng.final else node.watermarks.watermark(max_ts)

    router = Router(
        spec.pipeline,
        spec.parallelism,
        lambda sink: sink.sink.writer(sink.uid, spec.epoch, _part_name(node.uid, rng.split)),
    )
    router.push(node.id, batch)
    out = _downstream(router, spec, (node.id, rng.order), watermark, router.keyed_targets(node.id))
    sink_reports = _finish_sinks(router, spec)
    t_end = time.perf_counter()
    reports.add(
        [
            {
                "kind": "split",
                "uid": node.uid,
                "split": rng.split,
                "epoch": spec.epoch,
                "max_ts": max_ts,
                "records": len(records),
                "timings": {"read": t_read - t0, "route": t_end - t_read},
            },
            *sink_reports,
        ]
    )
    return iter(out)


def keyed_task(
    spec: EpochSpec, node_id: int, reports: Any, subtask: int, items: Iterable[tuple[int, Header]]
) -> Iterator[tuple[int, int, Header]]:
    node = spec.pipeline.node(node_id)
    assert isinstance(node, KeyedNode)
    p = spec.parallelism[node.uid]
    key_groups = range_for_subtask(subtask, p, spec.max_parallelism)
    t0 = time.perf_counter()
    headers = sorted((h for _, h in items), key=lambda h: h[0])
    new_watermark = min((h[1] for h in headers), default=MIN_TIMESTAMP)
    batches = [h[2] for h in headers]
    records_in = sum(len(b[0]) for b in batches)

    t_fetch = time.perf_counter()
    backend = prepare_backend(spec, node.uid, subtask, key_groups)
    t_open = time.perf_counter()
    try:
        runner: ProcessRunner | ReduceRunner
        if isinstance(node, ProcessNode):
            runner = ProcessRunner(node, backend, subtask, p, spec.processing_time_ms)
        else:
            assert isinstance(node, ReduceNode)
            runner = ReduceRunner(node, backend)
        if spec.verify_states:
            _verify_declared(spec, node.uid, backend)
        output = runner.run(batches, new_watermark)
        t_run = time.perf_counter()
        watermark = max(backend.watermark, new_watermark)
        router = Router(
            spec.pipeline,
            spec.parallelism,
            lambda sink: sink.sink.writer(sink.uid, spec.epoch, _part_name(node.uid, subtask)),
        )
        router.push(node.id, output)
        out = _downstream(
            router, spec, (node.id, subtask), watermark, router.keyed_targets(node.id)
        )
        # Sink output is staged before the state commits: if the commit fails, the retried
        # task stages the same parts again; the reverse order could lose them.
        sink_reports = _finish_sinks(router, spec)
        t_route = time.perf_counter()
        backend.commit(spec.epoch, watermark)
        t_commit = time.perf_counter()
        savepoint = None
        if spec.savepoint is not None:  # failing here fails the savepoint, through the epoch
            sp = spec.savepoint
            savepoint = {
                "key_groups": export_key_groups(backend, sp.store, f"{node.uid}", sp.compression),
                "states": state_catalog(backend.registry),
            }
        snapshot, error = None, None
        if spec.checkpoint is not None:
            try:
                snapshot = take_snapshot(spec, node.uid, subtask, key_groups, backend)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
        reports.add(
            [
                {
                    "kind": "state",
                    "uid": node.uid,
                    "subtask": subtask,
                    "epoch": spec.epoch,
                    "snapshot": snapshot,
                    "checkpoint_error": error,
                    "records_in": records_in,
                    "records_out": len(output[0]),
                    "watermark": watermark,
                    "savepoint": savepoint,
                    "warm": backend.warm_hit,
                    "timings": {
                        "fetch": t_fetch - t0,
                        "open": t_open - t_fetch,
                        "run": t_run - t_open,
                        "route": t_route - t_run,
                        "commit": t_commit - t_route,
                        "snapshot": time.perf_counter() - t_commit,
                    },
                },
                *sink_reports,
            ]
        )
    finally:
        backend.close()
    return iter(out)


def prepare_backend(
    spec: EpochSpec, uid: str, subtask: int, key_groups: KeyGroupRange
) -> KeyedBackend:
    """Open the subtask's local state if it is at the expected epoch; otherwise restore it
    (from a checkpoint, a rescaled checkpoint or a savepoint, as the driver says), start a new
    operator empty, or fail so that the driver fails over."""
    path = spec.state_dir(uid, subtask) / "db"
    backend = KeyedBackend(
        path, spec.rocksdb, key_groups, spec.max_parallelism, uid, spec.warm_entries
    )
    local_epoch = None
    if path.exists():
        backend.open()
        local_epoch = backend.epoch
        if local_epoch == spec.base_epoch:
            return backend
        backend.close()
    restore = spec.restore
    if restore is None or not restore.covers(uid):
        if spec.base_epoch == 0 or restore is not None:  # a new job, or an operator added
            shutil.rmtree(path, ignore_errors=True)
            backend.open()
            if spec.base_epoch:
                backend.commit(spec.base_epoch, MIN_TIMESTAMP)
            return backend
        raise StateMismatchError(
            f"operator '{uid}' subtask {subtask}: local state is at epoch {local_epoch}, the "
            f"job expects epoch {spec.base_epoch} and no checkpoint of that epoch was given"
        )
    try:
        restore_into(restore, spec, uid, subtask, key_groups, path)
        backend.open()
    except Exception as exc:
        backend.close()
        raise RestoreError(
            restore.checkpoint_id, f"operator '{uid}' subtask {subtask}: {exc}"
        ) from exc
    if backend.epoch != spec.base_epoch:
        backend.close()
        raise RestoreError(
            restore.checkpoint_id,
            f"restored state is at epoch {backend.epoch}, the job expects {spec.base_epoch}",
        )
    return backend


def restore_into(
    restore: RestoreTask,
    spec: EpochSpec,
    uid: str,
    subtask: int,
    key_groups: KeyGroupRange,
    path: Path,
) -> None:
    """Materialize the subtask's restored state in ``path`` (replacing what is there)."""
    snapshot = restore.snapshots.get((uid, subtask))
    if snapshot is not None:
        if tuple(snapshot.key_groups) != (key_groups.start, key_groups.end):
            raise StateMismatchError(
                f"the checkpoint holds key-groups {snapshot.key_groups}, "
                f"subtask {subtask} owns {key_groups}"
            )
        download_snapshot(restore.store, snapshot.files, path)
        return
    shutil.rmtree(path, ignore_errors=True)
    target = KeyedBackend(path, spec.rocksdb, key_groups, spec.max_parallelism, uid).open()
    try:
        if restore.savepoint is not None:
            op = restore.savepoint.operators[uid]
            names = sorted(op.states)
            import_entries(
                target,
                names,
                op.states,
                savepoint_entries(restore.store, op.key_groups, key_groups),
            )
            watermark = op.watermark
        else:
            watermark = _rescale_from(restore, spec, uid, key_groups, path, target)
        target.commit(spec.base_epoch, watermark)
    finally:
        target.close()


def _rescale_from(
    restore: RestoreTask,
    spec: EpochSpec,
    uid: str,
    key_groups: KeyGroupRange,
    path: Path,
    target: KeyedBackend,
) -> int:
    """Copy the owned key-groups out of each old subtask's snapshot that overlaps them."""
    sources = [
        s for s in restore.rescale[uid] if KeyGroupRange(*s.key_groups).intersect(key_groups)
    ]
    catalog: dict[str, dict[str, Any]] = {}
    watermark = MAX_TIMESTAMP
    staged = []
    for old in sources:
        where = path.parent / f".rescale-{old.index}"
        download_snapshot(restore.store, old.files, where)
        staged.append((old, where))
        with KeyedBackend(
            where, spec.rocksdb, KeyGroupRange(*old.key_groups), spec.max_parallelism, uid
        ) as probe:
            catalog.update(state_catalog(probe.registry))
            watermark = min(watermark, probe.watermark)
    names = sorted(catalog)
    try:
        import_entries(
            target,
            names,
            catalog,
            (
                entry
                for old, where in staged
                for entry in database_entries(
                    where, KeyGroupRange(*old.key_groups).intersect(key_groups), names
                )
            ),
        )
    finally:
        for _, where in staged:
            shutil.rmtree(where, ignore_errors=True)
    return watermark if sources else MIN_TIMESTAMP


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


def take_snapshot(
    spec: EpochSpec, uid: str, subtask: int, key_groups: KeyGroupRange, backend: KeyedBackend
) -> SubtaskSnapshot:
    """Synchronous part (flush + hard links), then the upload of what is new."""
    ck = spec.checkpoint
    assert ck is not None
    base = spec.state_dir(uid, subtask)
    local = base / f"chk-{ck.checkpoint_id}"
    files = backend.snapshot_to(local)
    remote, uploaded = upload_snapshot(
        ck.store,
        ck.checkpoint_id,
        uid,
        subtask,
        local,
        files,
        ck.previous.get((uid, subtask), {}),
        ck.incremental,
    )
    for old in base.glob("chk-*"):  # keep only the newest local snapshot
        if old != local:
            shutil.rmtree(old, ignore_errors=True)
    return SubtaskSnapshot(
        subtask,
        spec.parallelism[uid],
        (key_groups.start, key_groups.end),
        spec.epoch,
        tuple(remote),
        uploaded,
    )


def drain(items: Iterable[Any]) -> None:
    for _ in items:
        pass
