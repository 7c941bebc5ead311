"""A rescale, on the executor: a new subtask's state out of the old subtasks' snapshots.

The rescale flow, end to end (Flink's: key-groups are the unit of redistribution):

1. Operator: a change of ``replicas`` is an ``OpKind.RESCALE`` (``spec.classify``, recorded
   in ``status.operation``); its flow takes a savepoint (canonical, so that any parallelism
   can read it), stops the old driver and starts one at the new parallelism restoring it
   (``flows.py``). If the savepoint fails, the flow continues from the latest checkpoint
   (rescaled the same way), as an upgrade does.
2. Driver: ``driver/parallelism.py`` decides the new keyed parallelism once (never above
   ``max_parallelism``, which fixes the key-groups); ``driver/restore.py`` plans each
   operator's restore: same parallelism (each subtask's snapshot), another parallelism
   (``RestoreTask.rescale``: every old subtask's snapshot and key-group range), or a
   canonical savepoint (its key-group files).
3. Executor: each new subtask owns a contiguous range of key-groups
   (``keygroups.range_for_subtask``) and reads, here, only the old subtasks whose ranges
   overlap it, copying the rows of its own key-groups (``rescale_into``); a canonical
   savepoint is read key-group file by key-group file (``restore.restore_into``). The
   restored watermark is the smallest of the old subtasks read. Non-keyed state
   (``state/operator_state.py``) is not in key-groups: each old subtask's is inline in the
   metadata, and the new subtask takes its share of all of them (``install_operator_share``).

A failure at 3 fails the task like any restore (``restore.py``): the driver retries, or
falls back to an older checkpoint; nothing of the source is changed.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from ..api.time import MAX_TIMESTAMP, MIN_TIMESTAMP
from ..checkpoint.transfer import download_snapshot
from ..epoch.spec import EpochSpec, RestoreTask
from ..keygroups import KeyGroupRange
from ..savepoint.transfer import database_rows, import_rows, state_catalog
from ..state import operator_state as opstate
from ..state.backend import KeyedBackend


def rescale_into(
    restore: RestoreTask,
    spec: EpochSpec,
    uid: str,
    key_groups: KeyGroupRange,
    path: Path,
    target: KeyedBackend,
) -> tuple[int, int]:
    """Copy the owned key-groups out of each old subtask's snapshot that overlaps them.
    Returns the restored watermark and the bytes downloaded."""
    sources = [
        s for s in restore.rescale[uid] if KeyGroupRange(*s.key_groups).intersect(key_groups)
    ]
    catalog: dict[str, dict[str, Any]] = {}
    watermark = MAX_TIMESTAMP
    staged = []
    read = 0
    for old in sources:
        where = path.parent / f".rescale-{old.index}"
        read += download_snapshot(restore.store, old.files, where)
        staged.append((old, where))
        with KeyedBackend(
            where, spec.rocksdb, KeyGroupRange(*old.key_groups), spec.max_parallelism, uid
        ) as probe:
            catalog.update(state_catalog(probe.registry))
            watermark = min(watermark, probe.watermark)
    names = sorted(catalog)
    try:
        import_rows(
            target,
            catalog,
            (
                batch
                for old, where in staged
                for batch in database_rows(
                    where, KeyGroupRange(*old.key_groups).intersect(key_groups), names
                )
            ),
        )
    finally:
        for _, where in staged:
            shutil.rmtree(where, ignore_errors=True)
    return (watermark if sources else MIN_TIMESTAMP), read


def install_operator_share(
    target: KeyedBackend, blobs: list[str], parallelism: int, subtask: int
) -> None:
    """Give ``target`` (restored, its registry the old subtasks') subtask ``subtask``'s share
    of the old subtasks' non-keyed state (``blobs``: each old subtask's, in subtask order, as
    the metadata carries them): ``operator_state.redistribute``."""
    kinds = {
        name: opstate.OperatorStateKind(meta["kind"])
        for name, meta in target.registry.items()
        if meta["kind"] in opstate.OPERATOR_KINDS
    }
    if not kinds:
        return
    where = f"of operator '{target.operator_uid}'"
    old = [opstate.decode(opstate.from_text(b, where), where) for b in blobs]
    target.install_operator_state(opstate.redistribute(old, parallelism, subtask, kinds))
