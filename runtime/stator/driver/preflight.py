"""Everything about a job that can be checked before Spark starts, checked before Spark starts.

Starting Spark takes seconds, and a failure found inside a task goes through task retries and
the restart strategy: a mistake that no retry can fix would cost the user a minute and bury
its cause. So the CLI runs these checks first, in this order, and each one fails with one
:class:`~stator.errors.StatorError` naming the field or path and the fix:

1. Parallelism against max parallelism for every keyed operator (``parallelism.py``; the
   :class:`~stator.driver.job.Job` resolves it once, when it is built).
2. The restore source: ``none`` is refused if the job has checkpoints (unless
   ``restore.force_empty``); an explicit URI must hold a savepoint or checkpoint whose
   metadata parses and whose files are all there at their recorded sizes; the source
   (explicit, or the newest completed checkpoint for ``latest``) must be compatible with the
   pipeline: same max parallelism, no state for operators the pipeline dropped (unless
   ``restore.allow_non_restored_state``). A job's driver runs it through
   :func:`restore_target`, which adds what only a driver knows: the run it resumes when the
   named source cannot be read, and the layout of its failover regions (``layout.py``).
3. Checkpoint storage reachable and writable (a probe object, removed at once).
4. The savepoint directory, likewise (a savepoint, a stop-with-savepoint or a rescale would
   otherwise find out only when it is asked for, with the job running).

Steps 1-2 only read, and steps 3-4 run last, so a job refused here has written nothing. A
pre-started driver (``--await-handover``) runs steps 3-4 (:func:`check_storage`) before it
waits, so that its clients are built then, and step 2 once the hand-over names the source.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from ..checkpoint.metadata import CheckpointMetadata
from ..config import JobConfig
from ..errors import CheckpointNotFoundError, ConfigError, StatorError, StorageError
from ..lineage import Target, has_run, list_checkpoints, load_target
from ..savepoint.metadata import OperatorSavepoint, SavepointMetadata
from ..storage import ObjectStore, open_store
from .layout import check_covers, check_one_driver
from .parallelism import Parallelism
from .restore import check_compatible

log = logging.getLogger("stator.driver")


def preflight(
    job: str, config: JobConfig, parallelism: Parallelism, store: ObjectStore
) -> Target | None:
    """Steps 2-4 of the module docstring; returns the restore target it found (if any)."""
    target = check_restore_source(job, config, parallelism, store)
    check_storage(job, config, store)
    return target


def check_storage(job: str, config: JobConfig, store: ObjectStore) -> None:
    """Steps 3-4."""
    with _storage("checkpoint.storage", store.uri):
        store.check()
    savepoints = f"{config.savepoint.dir.rstrip('/')}/{job}"
    with _storage("savepoint.dir", savepoints):
        open_store(savepoints, config.s3).check()


@contextmanager
def _storage(key: str, uri: str) -> Iterator[None]:
    """A storage error here is about ``key``: say so."""
    try:
        yield
    except StorageError as exc:
        raise StorageError(f"{key} {uri}: {exc}. Fix {key} (and s3.* for S3)") from exc


def check_restore_source(
    job: str, config: JobConfig, parallelism: Parallelism, store: ObjectStore
) -> Target | None:
    source = config.restore.source
    if source in ("latest", "none"):
        with _storage("checkpoint.storage", store.uri):
            entries = list_checkpoints(store.uri, config.s3)
        completed = [e.metadata for e in entries if e.metadata]
        if source == "none":
            if completed and not config.restore.force_empty:
                raise ConfigError(
                    f"restore.source=none but job '{job}' has checkpoints at {store.uri}; "
                    f"restore from them (restore.source=latest) or set "
                    f"restore.force_empty=true to start a new lineage beside them"
                )
            return None
        target = Target(completed[-1], store) if completed else None
    else:
        try:
            target = load_target(source, config.s3)
        except CheckpointNotFoundError as exc:
            text = str(exc) if str(exc).startswith("restore.source") else f"restore.source: {exc}"
            raise CheckpointNotFoundError(
                f"{text}. Give a savepoint directory (see: stator savepoint list) or a chk-N "
                f"directory (see: stator checkpoints list)"
            ) from exc
        except StorageError as exc:
            raise StorageError(f"restore.source {source!r} cannot be read: {exc}") from exc
        check_files(target)
    if target is not None:
        check_compatible(
            target,
            parallelism.max_parallelism,
            set(parallelism.operators),
            config.restore.allow_non_restored_state,
        )
    return target


def restore_target(
    job: str,
    config: JobConfig,
    parallelism: Parallelism,
    store: ObjectStore,
    sources: set[str],
    whole_job: bool,
) -> Target | None:
    """Step 2 as a job's driver runs it (``whole_job``: the one driver of the job, not one
    failover region of several): a ``restore.source`` that cannot be read while the run it
    belongs to (``restore.lineage``) has checkpoints resumes those; an explicit source must
    cover every source of the pipeline (``layout.check_covers``); and resuming the job's
    own checkpoints is refused while its regions stand at other epochs
    (``layout.check_one_driver``)."""
    cfg = config.restore
    try:
        target = check_restore_source(job, config, parallelism, store)
    except StatorError:
        if not cfg.lineage or not has_run(store.uri, cfg.lineage, config.s3):
            raise
        log.warning(
            "restore.source %s cannot be read, but run %s has checkpoints: resuming them",
            cfg.source,
            cfg.lineage,
        )
        target = None
    if target is not None and cfg.source not in ("latest", "none"):
        check_covers(target, sources)
    fresh = cfg.source == "none" and cfg.force_empty
    if cfg.source in ("latest", "none") and whole_job and not fresh:
        newest = target.meta if target and isinstance(target.meta, CheckpointMetadata) else None
        check_one_driver(job, store.uri, newest, config.s3)
    return target


def _named_files(meta: CheckpointMetadata | SavepointMetadata) -> dict[str, int]:
    """Key -> size of every file a checkpoint's or savepoint's metadata names."""
    expected: dict[str, int] = {}
    for op in meta.operators.values():
        for snap in op.subtasks:  # a checkpoint's or a native savepoint's databases
            expected.update({f.key: f.size for f in snap.files if f.stored})
        if isinstance(op, OperatorSavepoint):  # a canonical savepoint's key-groups
            expected.update({str(kg["file"]): int(kg["bytes"]) for kg in op.key_groups.values()})
    return expected


def check_files(target: Target) -> None:
    """Every file the target's metadata names exists with its recorded size (a missing or
    truncated file would otherwise fail every restore attempt inside a task)."""
    expected = _named_files(target.meta)
    if not expected:
        return
    try:
        present = dict(target.store.listing())
    except StatorError as exc:
        raise CheckpointNotFoundError(
            f"restore.source {target.store.uri} cannot be listed: {exc}"
        ) from exc
    for key, size in sorted(expected.items()):
        found = present.get(key)
        if found is None:
            problem = "is missing"
        elif found != size:
            problem = f"has {found} bytes, its metadata says {size} (truncated or replaced)"
        else:
            continue
        raise CheckpointNotFoundError(
            f"restore.source: {target.describe()} cannot be restored: file "
            f"{target.store.url(key)} {problem}. Restore from another savepoint or checkpoint"
        )
