"""The checkpoint coordinator (driver side): completes, retains, subsumes and recovers
checkpoints in object storage.

Layout under the job's checkpoint root::

    shared/<uid>/<uuid>-<file>.sst     SST files shared between checkpoints (reference-counted)
    chk-<id>/<uid>/<subtask>/<file>    files private to one checkpoint (manifest, full-mode SSTs)
    chk-<id>/_metadata                 written last: without it the checkpoint does not exist

Checkpoint N is one :class:`~stator.checkpoint.pending.PendingCheckpoint` from its trigger
to its verdict, owned here (:attr:`CheckpointCoordinator.pending`). Step by step, with what a
failure at each step leaves behind:

1. TRIGGERED (:meth:`trigger`): the epoch loop plans an epoch that takes N and gives N's id
   to its tasks. Tasks commit epoch E locally, hard-link a snapshot and upload the files the
   previous completed checkpoint lacks: before they return, or asynchronously
   (``uploads.py``). A failure of the epoch -> the job fails over and N is forgotten
   (:meth:`forget_triggered`); files it uploaded are collected by :meth:`recover`.
2. ACKNOWLEDGED (``driver/completion.py``): every keyed subtask reported a snapshot and no
   upload error; N's draft metadata is assembled. A task that failed to upload declines N;
   the epoch itself stands. -> N is ABORTED (:meth:`fail`): its uploaded files that no
   retained checkpoint references are deleted; processing continues and the next
   checkpoint uploads again.
3. UPLOADING (asynchronous uploads only, ``driver/in_flight.py``): N holds the files it
   references (:meth:`uploading`) and the driver waits for every upload's confirmation. A
   failed or missing confirmation -> N is ABORTED as in 2, its files deleted again after its
   deadline (uploads may still be running: :meth:`sweep`); checkpoints based on N fail too.
4. COMPLETED (:meth:`finish`): write ``chk-N/_metadata``, one atomic object. A failure here
   aborts N as in 2. A crash of the driver before this step leaves files without metadata:
   :meth:`recover` deletes them.
5. Register N's shared files in the registry and append N to the retained list (memory only).
6. Sinks commit the epochs N covers (the caller, ``driver/completion.py``; idempotent;
   N's metadata lists them, so a crash or a failed commit here is repaired by committing
   again when N is restored).
7. Subsume checkpoints beyond ``retained``: delete an old checkpoint's metadata *first* (it
   stops existing), then its private files and the shared files no retained checkpoint needs.
   A crash in between leaves only unreferenced files, which :meth:`recover` deletes.
   With an owner (``ownership.py``), the root is confirmed still this job's first.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace

from ..errors import CheckpointNotFoundError, StorageError
from ..ha.fencing import TAKEOVER_ID_GAP, guard, took_over
from ..storage import ObjectStore
from .metadata import (
    METADATA_NAME,
    CheckpointMetadata,
    RemoteFile,
    checkpoint_dir,
    metadata_key,
    parse_checkpoint_dir,
)
from .ownership import NO_OWNER, Ownership
from .pending import CheckpointState, PendingCheckpoint, Verdict
from .registry import SharedStateRegistry

log = logging.getLogger("stator.checkpoint")


@dataclass
class RecoveryReport:
    """What :meth:`CheckpointCoordinator.recover` found and did."""

    restored: CheckpointMetadata | None = None
    skipped: list[str] = field(default_factory=list)  # why newer checkpoints were not used
    deleted_files: int = 0


class CheckpointCoordinator:
    def __init__(
        self, store: ObjectStore, retained: int = 3, ownership: Ownership = NO_OWNER
    ) -> None:
        if retained < 1:
            raise ValueError("checkpoint.retained must be >= 1")
        self.store, self.retained = store, retained
        self.ownership = ownership
        self.completed: list[CheckpointMetadata] = []  # retained, oldest first
        self.registry = SharedStateRegistry()
        self.next_id = 1
        # Failed checkpoints whose uploads may still write: (until, id, their files).
        self._late: list[tuple[float, int, list[RemoteFile]]] = []
        self._id_floor = 0  # no id below it: ids skipped after a lease takeover
        # Retained checkpoints of another lineage than the running job's (it started from a
        # savepoint, empty on purpose, or from an older checkpoint of its own): never the
        # latest nor a fall-back, and subsumed first.
        self.stale: set[int] = set()
        # Checkpoints triggered and not yet completed or aborted, by id (steps 1-3).
        self.pending: dict[int, PendingCheckpoint] = {}

    # ------------------------------------------------------------------ ids and handles

    def new_checkpoint_id(self) -> int:
        checkpoint_id = self.next_id
        self.next_id += 1
        return checkpoint_id

    @property
    def latest(self) -> CheckpointMetadata | None:
        """The newest retained checkpoint of the running job's lineage."""
        return next(
            (m for m in reversed(self.completed) if m.checkpoint_id not in self.stale), None
        )

    # ------------------------------------------------------------------ pending checkpoints

    def trigger(self, epoch: int, incremental: bool) -> PendingCheckpoint:
        """Step 1 of the module docstring: a new checkpoint, taken by ``epoch``."""
        pending = PendingCheckpoint(self.new_checkpoint_id(), epoch, incremental)
        self.pending[pending.checkpoint_id] = pending
        return pending

    def forget_triggered(self) -> None:
        """The epoch that was to take a triggered checkpoint failed (step 1)."""
        for cid, p in list(self.pending.items()):
            if p.state is CheckpointState.TRIGGERED:
                del self.pending[cid]

    def uploading(self, pending: PendingCheckpoint) -> None:
        """Step 3: a checkpoint whose uploads are in flight holds its files like a retained
        one, so that subsuming an older checkpoint never deletes a file it references."""
        assert pending.draft is not None
        pending.move(CheckpointState.UPLOADING)
        self.registry.register(pending.checkpoint_id, pending.draft.shared_keys())

    def finish(self, pending: PendingCheckpoint) -> Verdict:
        """Steps 4-5, once every upload is done: the completed checkpoint, or why it failed
        (then it is aborted). The caller records it, then has sinks commit (step 6) and calls
        :meth:`subsume` (step 7)."""
        assert pending.draft is not None
        duration = int((time.monotonic() - pending.started) * 1000)
        meta = replace(pending.draft, duration_ms=duration)
        try:
            self.complete(meta)
        except StorageError as exc:
            return self.fail(pending, str(exc), files=pending.uploaded)
        pending.move(CheckpointState.COMPLETED)
        return self._decide(pending, Verdict(pending.checkpoint_id, pending.epoch, meta))

    def fail(
        self,
        pending: PendingCheckpoint,
        reason: str,
        uploads_until: float = 0.0,
        files: list[RemoteFile] | None = None,
    ) -> Verdict:
        """Abort ``pending`` (steps 2-4): forget it and delete what only it uploaded
        (``files``, default its cleanup list or its uploads; see :meth:`abort`)."""
        if files is None:
            files = pending.cleanup or pending.uploaded
        self.abort(pending.checkpoint_id, files, reason, uploads_until)
        pending.move(CheckpointState.ABORTED)
        return self._decide(pending, Verdict(pending.checkpoint_id, pending.epoch, None, reason))

    def _decide(self, pending: PendingCheckpoint, verdict: Verdict) -> Verdict:
        pending.verdict = verdict
        self.pending.pop(pending.checkpoint_id, None)
        return verdict

    # ------------------------------------------------------------------ completing

    def complete(self, meta: CheckpointMetadata) -> None:
        """Steps 4-5 of the module docstring. Raises StorageError if step 4 fails (then the
        caller aborts the checkpoint). The caller then has sinks commit (step 6) and calls
        :meth:`subsume` (step 7), also when a sink fails to commit."""
        # 4. The metadata object, last of everything N consists of; only while this driver
        #    surely holds the job's lease (a replaced driver exits here instead).
        guard(f"checkpoint {meta.checkpoint_id}")
        self.store.put(metadata_key(meta.checkpoint_id), meta.to_json())
        # 5. Register and retain.
        self.registry.register(meta.checkpoint_id, meta.shared_keys())
        self.completed.append(meta)
        log.info(
            "checkpoint %d complete: epoch %d, %d bytes (%d uploaded) in %d ms",
            meta.checkpoint_id,
            meta.epoch,
            meta.state_bytes,
            meta.incremental_bytes,
            meta.duration_ms,
        )

    def subsume(self) -> None:
        """Step 7: drop checkpoints beyond ``retained``: another lineage's first, then the
        oldest."""
        if len(self.completed) > self.retained:
            try:
                self.ownership.confirm(self.store)  # raises NotOwner: the root was adopted
            except StorageError as exc:  # unsure whose root it is: delete nothing this time
                log.warning("not subsuming checkpoints now: %s", exc)
                return
        while len(self.completed) > self.retained:
            at = next((i for i, m in enumerate(self.completed) if m.checkpoint_id in self.stale), 0)
            self._discard(self.completed.pop(at))

    def _discard(self, old: CheckpointMetadata) -> None:
        try:
            self.store.delete([metadata_key(old.checkpoint_id)])
            unreferenced = self.registry.release(old.checkpoint_id)
            private = [k for k, _ in self.store.listing(checkpoint_dir(old.checkpoint_id) + "/")]
            self.store.delete(unreferenced + private)
        except StorageError as exc:  # leftovers are collected by the next recover()
            log.warning("could not fully delete checkpoint %d: %s", old.checkpoint_id, exc)

    def abort(
        self,
        checkpoint_id: int,
        uploaded: list[RemoteFile],
        reason: str,
        uploads_until: float = 0.0,
    ) -> None:
        """Forget a checkpoint that did not complete, and delete what only it uploaded.
        ``uploads_until`` (monotonic time): its uploads may still be running until then, so
        :meth:`sweep` deletes their files again after it."""
        log.warning("checkpoint %d failed: %s", checkpoint_id, reason)
        self.registry.release(checkpoint_id)
        self._delete_unreferenced(checkpoint_id, uploaded)
        if uploads_until:
            self._late.append((uploads_until, checkpoint_id, uploaded))

    def sweep(self, now: float | None = None) -> None:
        """Delete files that uploads of failed checkpoints wrote after the failure, once
        they cannot write any more (``now``: monotonic time, for tests)."""
        now = time.monotonic() if now is None else now
        due = [late for late in self._late if late[0] <= now]
        self._late = [late for late in self._late if late[0] > now]
        for _, checkpoint_id, uploaded in due:
            self._delete_unreferenced(checkpoint_id, uploaded)

    def _delete_unreferenced(self, checkpoint_id: int, uploaded: list[RemoteFile]) -> None:
        garbage = [f.key for f in uploaded if f.shared and not self.registry.referenced(f.key)]
        try:
            private = [k for k, _ in self.store.listing(checkpoint_dir(checkpoint_id) + "/")]
            self.store.delete(garbage + private)
        except StorageError as exc:  # collected by the next recover()
            log.warning("could not clean up failed checkpoint %d: %s", checkpoint_id, exc)

    # ------------------------------------------------------------------ recovery

    def recover(self, explicit: CheckpointMetadata | None = None) -> RecoveryReport:
        """Rebuild the coordinator from storage after a (re)start.

        Reads every checkpoint's metadata, retains the newest valid ones, rebuilds the shared
        registry from them, deletes files no retained checkpoint references (failed or
        half-subsumed checkpoints), and picks the newest checkpoint whose files are all
        present. A corrupt or incomplete checkpoint is skipped with a reason, never used; a
        store that fails to return a listed metadata object (after the client's retries) fails
        the recovery instead: skipping it would restore an older checkpoint and replay epochs
        whose output is already committed.
        """
        report = RecoveryReport()
        self.ownership.claim(self.store)  # before anything here is deleted
        listing = dict(self.store.listing())
        ids = sorted({i for i in (parse_checkpoint_dir(k.split("/", 1)[0]) for k in listing) if i})
        self.next_id = (max(ids) + 1) if ids else 1
        if took_over() and not self._id_floor:  # an old driver's late uploads cannot collide
            self._id_floor = self.next_id + TAKEOVER_ID_GAP
        self.next_id = max(self.next_id, self._id_floor)
        valid: list[CheckpointMetadata] = []
        unusable: dict[str, set[str]] = {}  # kept for inspection, never deleted here
        for cid in sorted(ids, reverse=True):
            key = metadata_key(cid)
            if key not in listing:
                continue  # never completed: its files are garbage
            try:
                raw = self.store.get(key)
            except StorageError as exc:
                raise StorageError(
                    f"cannot read checkpoint {cid}'s metadata, listed in {self.store.uri}: "
                    f"{exc}; the job does not start from an older checkpoint instead (retry "
                    f"once the store answers)"
                ) from exc
            try:
                meta = CheckpointMetadata.from_json(raw, self.store.url(key))
            except CheckpointNotFoundError as exc:
                report.skipped.append(f"checkpoint {cid}: {exc}")
                if not valid:
                    unusable[checkpoint_dir(cid)] = set()
                continue
            missing = [f.key for f in meta.files() if listing.get(f.key) != f.size]
            if missing:
                if not valid:
                    unusable[checkpoint_dir(cid)] = meta.shared_keys()
                report.skipped.append(
                    f"checkpoint {cid}: {len(missing)} file(s) missing or truncated, "
                    f"e.g. {self.store.url(missing[0])}"
                )
                continue
            valid.append(meta)
            if len(valid) == self.retained:
                break
        for reason in report.skipped:
            log.warning("not restoring from %s", reason)
        self.completed = sorted(valid, key=lambda m: m.checkpoint_id)
        self.registry = SharedStateRegistry.rebuild(
            {m.checkpoint_id: m.shared_keys() for m in self.completed}
        )
        keep = set(self.registry.keys()).union(*unusable.values())
        keep_dirs = {checkpoint_dir(m.checkpoint_id) for m in self.completed} | set(unusable)
        if explicit is not None:
            keep |= {f.key for f in explicit.files()}
            keep_dirs.add(checkpoint_dir(explicit.checkpoint_id))
        # A checkpoint whose metadata cannot be read may reference any shared file: then keep
        # all of them (garbage is collected by a later recovery, never a needed file).
        unknown_refs = any(not refs for refs in unusable.values())
        garbage = [
            k
            for k in listing
            if (k.startswith("shared/") and k not in keep and not unknown_refs)
            or (parse_checkpoint_dir(k.split("/", 1)[0]) and k.split("/", 1)[0] not in keep_dirs)
        ]
        if garbage:
            self.store.delete(garbage)
            report.deleted_files = len(garbage)
        report.restored = explicit or self.latest
        return report

    def fall_back(self, failed: CheckpointMetadata, reason: str) -> CheckpointMetadata | None:
        """Restoring ``failed`` broke (e.g. a corrupt file): forget it, return the one before
        (of the same lineage)."""
        log.warning(
            "restore from checkpoint %d failed (%s); falling back", failed.checkpoint_id, reason
        )
        self.completed = [m for m in self.completed if m.checkpoint_id != failed.checkpoint_id]
        self.registry = SharedStateRegistry.rebuild(
            {m.checkpoint_id: m.shared_keys() for m in self.completed}
        )
        return self.latest


def load_checkpoint(store: ObjectStore, path: str = "") -> CheckpointMetadata:
    """Metadata of the checkpoint at ``path`` (a chk-N directory or its _metadata) in ``store``."""
    key = path.rstrip("/")
    if not key.endswith(METADATA_NAME):
        key = f"{key}/{METADATA_NAME}" if key else METADATA_NAME
    try:
        data = store.get(key)
    except StorageError as exc:
        raise CheckpointNotFoundError(
            f"no checkpoint at {store.url(key)}: {exc}. Pass a chk-N directory that has a "
            f"_metadata file (see: stator checkpoints list)"
        ) from exc
    return CheckpointMetadata.from_json(data, store.url(key))


def now_ms() -> int:
    return int(time.time() * 1000)
