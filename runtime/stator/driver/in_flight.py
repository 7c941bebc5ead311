"""Checkpoints whose uploads run in the background (``checkpoint.async_upload``): the driver
keeps processing and completes each one when the store holds every upload's confirmation
(``checkpoint/uploads.py``).

An in-flight checkpoint N, step by step:

1. Its epoch ended with a snapshot from every keyed subtask (``completion.py`` steps 1-2
   assembled the metadata). N is UPLOADING and holds the files it references
   (``CheckpointCoordinator.uploading``),
   its local copies are kept (``EpochSpec.in_flight``), and the epochs after it run. The
   next checkpoint re-references the SST files N is uploading instead of sending them again
   (its base is N: with a checkpoint every epoch, basing it on the last *completed* one would
   upload most files twice).
2. Polled after every epoch, while the job is idle and while the driver waits for a slot:
   one listing of ``chk-N/``. Checkpoints complete in the order they were taken: N+1 waits
   for N, so sinks commit in epoch order and every completed checkpoint's base is retained.
3. Every subtask confirmed its upload under the token of the attempt the driver kept -> N
   completes (``completion.py`` step 3; the caller then lets sinks commit). A ``_failed``
   confirmation, or no confirmation by ``checkpoint.timeout_ms`` -> N is aborted; its files
   are deleted now and again after the deadline (uploads may still be writing them). Every
   checkpoint based on N fails with it, and its cleanup covers N's files too.
4. A failover first completes what is confirmed, then aborts the rest (their epochs are
   about to be replayed); a savepoint, a stop and the end of a bounded job wait for all.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..checkpoint.coordinator import CheckpointCoordinator
from ..checkpoint.metadata import CheckpointMetadata, checkpoint_dir
from ..checkpoint.pending import PendingCheckpoint, Upload, Verdict
from ..checkpoint.uploads import CONFIRMED, FAILED, confirmation_key
from ..epoch.reports import StateReport
from ..errors import StorageError
from ..storage import ObjectStore

log = logging.getLogger("stator.checkpoint")

POLL_S = 0.05  # between listings while the driver waits for a checkpoint
# After a checkpoint's deadline, how long an upload may still be writing a file it started.
LATE_WRITES_S = 60.0


@dataclass(frozen=True)
class Look:
    """What one look at the store says about a checkpoint's uploads: all confirmed, failed
    (``failure``: why), or neither yet."""

    confirmed: bool = False
    failure: str | None = None

    @property
    def decided(self) -> bool:
        return self.confirmed or self.failure is not None


WAITING, CONFIRMED_ALL = Look(), Look(confirmed=True)


class InFlightCheckpoints:
    def __init__(
        self, store: ObjectStore, coordinator: CheckpointCoordinator, timeout_ms: int
    ) -> None:
        self.store, self.coordinator, self.timeout_ms = store, coordinator, timeout_ms
        self._queue: list[PendingCheckpoint] = []  # UPLOADING, oldest first
        # The executors alive now, when the driver knows them (several executors): an
        # upload on a lost executor fails its checkpoint at once, not at the deadline.
        self.alive: Callable[[], Iterable[str]] | None = None
        self._failed_ids: set[int] = set()  # ids that failed: a checkpoint based on one fails too

    def __len__(self) -> int:
        return len(self._queue)

    def ids(self) -> frozenset[int]:
        return frozenset(c.checkpoint_id for c in self._queue)

    def newest(self) -> CheckpointMetadata | None:
        """The draft of the newest checkpoint in flight: the next one re-references its
        files instead of uploading them again (and fails if it fails)."""
        return self._queue[-1].draft if self._queue else None

    def add(self, pending: PendingCheckpoint, states: list[StateReport], base: int = 0) -> None:
        """Step 1: ``pending`` (ACKNOWLEDGED) becomes UPLOADING. ``states``: the keyed
        subtasks' reports, each with its upload's token; ``base``: the in-flight checkpoint
        whose files it re-references, if any."""
        cid = pending.checkpoint_id
        pending.confirmations = {
            confirmation_key(cid, r.uid, r.subtask, r.upload, CONFIRMED): Upload(
                f"operator '{r.uid}' subtask {r.subtask}", r.executor
            )
            for r in states
            if r.snapshot is not None and r.upload
        }
        self.coordinator.uploading(pending)
        on = next((c for c in self._queue if c.checkpoint_id == base), None)
        inherited = on.cleanup if on is not None else []
        pending.deadline = pending.started + self.timeout_ms / 1000
        pending.base = base if on is not None or base in self._failed_ids else 0
        pending.cleanup = pending.uploaded + inherited
        self._queue.append(pending)

    def poll(self) -> list[Verdict]:
        """Steps 2-3: the checkpoints that completed or failed, in the order taken."""
        outcomes: list[Verdict] = []
        while self._queue:
            head = self._queue[0]
            look = (
                Look(failure=f"checkpoint {head.base}, whose files it re-references, failed")
                if head.base in self._failed_ids
                else self._look(head)
            )
            if not look.decided:
                break
            self._queue.pop(0)
            outcomes.append(self._settle(head, look))
        self.coordinator.sweep()
        return outcomes

    def wait(self, until_at_most: int) -> list[Verdict]:
        """Poll until at most ``until_at_most`` checkpoints are in flight (0: drain)."""
        outcomes = self.poll()
        while len(self._queue) > until_at_most:
            time.sleep(POLL_S)
            outcomes += self.poll()
        return outcomes

    def abort_all(self, reason: str) -> list[Verdict]:
        """Step 4: complete what is confirmed; every checkpoint still in flight fails."""
        outcomes = self.poll()
        for c in self._queue:
            until = c.deadline + LATE_WRITES_S
            self._failed_ids.add(c.checkpoint_id)
            outcomes.append(self.coordinator.fail(c, reason, until, files=c.cleanup))
        self._queue = []
        return outcomes

    # ------------------------------------------------------------------ internals

    def _look(self, c: PendingCheckpoint) -> Look:
        """One listing of ``chk-N/``. An unreachable store is waited for, up to the
        deadline."""
        late = time.monotonic() > c.deadline
        try:
            listed = self.store.listing(checkpoint_dir(c.checkpoint_id) + "/")
            present = {key for key, _ in listed}
            failed = self._failed(c, present)
        except StorageError as exc:
            if late:
                return Look(failure=f"checkpoint.timeout_ms ({self.timeout_ms}) passed: {exc}")
            log.warning("checkpoint %d: cannot ask the store: %s", c.checkpoint_id, exc)
            return WAITING
        if failed:
            return Look(failure=failed)
        missing = [up for key, up in c.confirmations.items() if key not in present]
        if not missing:
            return CONFIRMED_ALL
        if late:
            return Look(
                failure=f"checkpoint.timeout_ms ({self.timeout_ms}) passed before "
                f"{len(missing)} upload(s) were confirmed, e.g. {missing[0].who}'s"
            )
        lost = self._lost(missing)
        return WAITING if lost is None else Look(failure=lost)

    def _failed(self, c: PendingCheckpoint, present: set[str]) -> str | None:
        """The reason an uploader wrote, if one failed."""
        for key, up in c.confirmations.items():
            failure = key[: -len(CONFIRMED)] + FAILED
            if failure in present:
                return f"the upload of {up.who} failed: {_read_reason(self.store, failure)}"
        return None

    def _lost(self, missing: list[Upload]) -> str | None:
        """Why an upload can no longer be confirmed: its executor is gone."""
        if self.alive is None or not any(up.executor for up in missing):
            return None
        alive = set(self.alive())
        lost = [up for up in missing if up.executor and up.executor not in alive]
        if not lost:
            return None
        return f"executor {lost[0].executor} was lost while it uploaded {lost[0].who}'s files"

    def _settle(self, c: PendingCheckpoint, look: Look) -> Verdict:
        if look.failure is not None:
            self._failed_ids.add(c.checkpoint_id)
            until = c.deadline + LATE_WRITES_S
            return self.coordinator.fail(c, look.failure, until, files=c.cleanup)
        done = self.coordinator.finish(c)
        if done.meta is None:
            self._failed_ids.add(c.checkpoint_id)
        return done


def _read_reason(store: ObjectStore, key: str) -> str:
    try:
        return store.get(key).decode(errors="replace")
    except Exception as exc:  # listed a moment ago; say what we know
        return f"(the reason could not be read: {exc})"
