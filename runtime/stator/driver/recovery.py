"""Where the job's state stands, how a job starts from a checkpoint or savepoint, and how it
recovers from a failed epoch.

Starting:

1. The coordinator reads every checkpoint of this job, keeps the retained ones and deletes
   files no retained checkpoint references (``checkpoint/coordinator.py``).
2. The restore source is chosen: ``restore.source`` = ``latest`` (the newest completed
   checkpoint, if any), ``none`` (refused if checkpoints exist, unless ``force_empty``), or a
   checkpoint/savepoint URI.
3. The job rewinds to it: compatibility is checked (maxParallelism, operators that are gone),
   sources take its positions, sinks discard staged output after its epoch and commit again
   what it covers. Tasks restore their state lazily, in the first epoch, from the
   :class:`Position`'s target.

Failing over after a failed epoch:

1. Classify (``failures.py``): a failure no restart can fix (a bad configuration,
   incompatible state, a savepoint that cannot be restored, a user function that raised on
   every attempt of its task) ends the job at once (:class:`~stator.errors.JobFailed`), after
   removing the staged sink output of the epochs the next run will replay; a checkpoint that
   cannot be restored is dropped in favour of the previous retained one; anything else
   (a lost executor, a network or storage error) is retried.
2. Ask the restart strategy for a delay; it may give up (:class:`JobFailed`, staged output
   removed as in 1).
3. Wait, then rewind to the latest completed checkpoint of the job's lineage (or the
   initial restore source, if the job has none yet). Checkpoints of another lineage kept
   beside the job (it started from a savepoint, empty on purpose, or from an older
   checkpoint of its own: those newer than it) are never rewound to. Once the job has a
   checkpoint, it never goes back to its initial source: if every retained checkpoint failed
   to restore, the job fails (that replay would commit output again). If rewinding itself
   fails (storage unreachable), go back to 2.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from ..checkpoint.coordinator import CheckpointCoordinator
from ..checkpoint.metadata import CheckpointMetadata
from ..config import JobConfig
from ..errors import CheckpointsUnhealthy, ConfigError, JobFailed, StatorError
from ..keygroups import SubtaskId
from ..lineage import Target, load_target
from ..storage import ObjectStore
from .checkpoint_base import own_checkpoint
from .completion import PendingOutput
from .failures import Failure, Kind, classify, short_error
from .parallelism import Parallelism
from .planning import EpochPlanner
from .restart import RestartStrategy
from .restore import check_compatible
from .status import JobStatus

log = logging.getLogger("stator.driver")


@dataclass
class Position:
    """The last epoch every keyed subtask committed, and the snapshot that state descends
    from: the restore source of a subtask whose local state is not at ``epoch``, and (if it
    is one of this job's checkpoints at the same parallelism) the base of incremental
    uploads. ``target`` None: the state started empty."""

    epoch: int = 0
    target: Target | None = None
    # The first epoch after a restore checks that the code declares every restored state.
    verify_states: bool = False
    # (uid, subtask) -> the database commit of its state at ``epoch`` (``EpochSpec.commits``).
    commits: dict[SubtaskId, str] = field(default_factory=dict)


class Recovery:
    def __init__(
        self,
        job: str,
        config: JobConfig,
        store: ObjectStore,
        coordinator: CheckpointCoordinator,
        parallelism: Parallelism,
        planner: EpochPlanner,
        output: PendingOutput,
        status: JobStatus,
    ) -> None:
        self.job, self.config, self.store = job, config, store
        self.coordinator, self.parallelism = coordinator, parallelism
        self.planner, self.output, self.status = planner, output, status
        self.restart = RestartStrategy(config.restart)
        self.label = f"job '{job}'"  # a region of a job says so (``regions.py``)
        self.position = Position()
        self._initial: Target | None = None
        self._failure: Failure | None = None  # the last failure, until an epoch completes
        # A checkpoint of this job's lineage was restored or completed: if every retained one
        # then fails to restore, the job fails rather than start over from its initial source.
        self._checkpointed = False
        self.lineage = ""  # recorded in this run's checkpoints (start())
        self.restarting = False  # waiting out a restart delay or rewinding

    def start(self, loaded: Target | None = None) -> None:
        """Steps 1-3 of starting (module docstring). ``loaded``: the target of an explicit
        ``restore.source`` as preflight read it (not read again); with ``latest``, what a
        failover region without checkpoints of its own restores (``regions.py``)."""
        source = self.config.restore.source
        lineage = self.config.restore.lineage
        explicit, unreadable = None, None
        if source not in ("latest", "none"):
            try:
                explicit = loaded or load_target(source, self.config.s3)
            except StatorError as exc:  # not needed if the run resumes its own checkpoints
                if not lineage:
                    raise
                unreadable = exc
        same_store = explicit is not None and explicit.store.uri == self.store.uri
        own = explicit.meta if explicit and same_store else None
        report = self.coordinator.recover(own if isinstance(own, CheckpointMetadata) else None)
        if report.deleted_files:
            log.info("removed %d unreferenced checkpoint files", report.deleted_files)
        target = Target(report.restored, self.store) if report.restored else None
        if source == "latest" and loaded is not None and _newer(loaded, target):
            target = loaded  # a region: the job's checkpoint, newer than any of its own
        own_run = [m for m in self.coordinator.completed if lineage and m.lineage == lineage]
        if own_run:  # a restarted run resumes itself, whatever it started from
            target = Target(own_run[-1], self.store)
        elif unreadable is not None:
            raise unreadable
        elif source == "none":
            if self.coordinator.completed and not self.config.restore.force_empty:
                raise ConfigError(
                    f"restore.source=none but job '{self.job}' has checkpoints at "
                    f"{self.store.uri}; restore from them (restore.source=latest) or set "
                    f"restore.force_empty=true to start a new lineage beside them"
                )
            target = None
        elif explicit is not None:
            target = explicit
        self._initial = target
        self.coordinator.stale = self._other_lineages(target, explicit, own_run)
        # A checkpoint of its own the job continues: once it has one, it never goes back to
        # where it began. And what this run's checkpoints record: the name it was given,
        # else the lineage of that checkpoint.
        retained = {m.checkpoint_id for m in self.coordinator.completed}
        own = own_checkpoint(target, self.store)
        continued = own if own is not None and own.checkpoint_id in retained else None
        self._checkpointed = continued is not None
        self.lineage = lineage or (continued.lineage if continued else "")
        self.rewind(target)
        if target is not None:
            log.info("%s restores from %s", self.label, target.describe())

    def _other_lineages(
        self,
        target: Target | None,
        explicit: Target | None,
        own_run: list[CheckpointMetadata],
    ) -> set[int]:
        """The retained checkpoints that are not this run's to rewind or fall back to. A run
        resuming itself: other runs' newer ones always, older ones unless it began from
        ``latest`` (then they are its past). A start from elsewhere (a savepoint, another
        layout's checkpoint) or empty on purpose: all of them. A start from an older checkpoint
        of its own: those newer than it."""
        completed = self.coordinator.completed
        began = self.config.restore.source
        if own_run:
            newest, lineage = own_run[-1].checkpoint_id, own_run[-1].lineage
            return {
                m.checkpoint_id
                for m in completed
                if m.lineage != lineage and (began != "latest" or m.checkpoint_id > newest)
            }
        foreign = target is not None and target.store.uri != self.store.uri
        if foreign or began == "none":
            return {m.checkpoint_id for m in completed}
        if explicit is not None and isinstance(explicit.meta, CheckpointMetadata):
            chosen = explicit.meta.checkpoint_id
            return {m.checkpoint_id for m in completed if m.checkpoint_id > chosen}
        return set()

    def rewind(self, target: Target | None) -> None:
        """Sources, sinks and the epoch back to ``target`` (None: the beginning)."""
        if target is not None:
            check_compatible(
                target,
                self.parallelism.max_parallelism,
                set(self.parallelism.operators),
                self.config.restore.allow_non_restored_state,
            )
        self.planner.rewind(target.meta.sources if target else None)
        epoch = target.epoch if target else 0
        commits = target.commits(self.parallelism.operators) if target else {}
        self.position = Position(epoch, target, target is not None, commits)
        self.status.epoch = epoch
        pending = (
            target.meta.sinks if target and isinstance(target.meta, CheckpointMetadata) else {}
        )
        self.output.rewind(epoch, pending)

    def advance(self, epoch: int, commits: dict[SubtaskId, str]) -> None:
        """Every keyed subtask committed ``epoch``: ``commits`` are their database commits."""
        self.position.epoch = epoch
        self.position.commits.update(commits)

    def take_verify_states(self) -> bool:
        """Whether the next epoch checks the restored states (once, after a restore)."""
        verify, self.position.verify_states = self.position.verify_states, False
        return verify

    def checkpoint_completed(self, meta: CheckpointMetadata) -> None:
        self.position.target = Target(meta, self.store)
        self._checkpointed = True

    def failover(self, exc: Exception) -> None:
        """Steps 1-3 of failing over (module docstring)."""
        target = self.position.target
        failure = classify(exc, target, self._failure)
        self._failure = failure
        self.status.last_error = failure.summary
        if failure.user_traceback:
            log.error("%s\n%s", failure.summary, failure.user_traceback)
        if failure.kind is Kind.FATAL:
            self.discard_staged()
            raise JobFailed(f"{self.label} failed: {failure.summary} ({failure.reason})") from exc
        if (
            failure.kind is Kind.FALL_BACK
            and target
            and isinstance(target.meta, CheckpointMetadata)
        ):
            fallback = self.coordinator.fall_back(target.meta, failure.summary)
            log.warning(
                "%s cannot be restored; next: %s",
                target.describe(),
                fallback.checkpoint_id if fallback else "the initial state",
            )
        elif isinstance(exc, CheckpointsUnhealthy):
            log.warning("%s fails over: %s", self.label, failure.summary)
        else:
            log.warning(
                "%s: epoch %d failed: %s", self.label, self.position.epoch + 1, failure.summary
            )
        self.restarting = self.status.restarting = True
        try:
            self._restart(exc)
        finally:
            self.restarting = self.status.restarting = False

    def _restart(self, exc: Exception) -> None:
        """Steps 2-3 of failing over."""
        while True:
            delay = self.restart.next_delay_ms()
            if delay is None:
                self.discard_staged()
                raise JobFailed(
                    f"{self.label} failed and the restart strategy "
                    f"'{self.config.restart.strategy}' gave up ({self.restart.why}): "
                    f"{self.status.last_error}"
                ) from exc
            latest = self.coordinator.latest
            if latest is None and self._checkpointed:
                # Every retained checkpoint failed to restore: the initial source (empty state,
                # a savepoint) would replay epochs whose output checkpoints committed.
                self.discard_staged()
                raise JobFailed(
                    f"{self.label} failed: no retained checkpoint can be restored (the last: "
                    f"{self.status.last_error}); it does not start over from where it began "
                    f"(a savepoint, empty state), which would replay committed output. Restore "
                    f"a savepoint or a checkpoint of your choice (restore.source)"
                ) from exc
            self.status.restarts += 1
            log.info("%s restarts in %d ms (%s)", self.label, delay, self.restart.why)
            time.sleep(delay / 1000)
            try:
                latest = self.coordinator.latest
                self.rewind(Target(latest, self.store) if latest is not None else self._initial)
                return
            except Exception as again:
                self.status.last_error = short_error(f"{type(again).__name__}: {again}")
                log.warning("restoring after a failure failed: %s", self.status.last_error)

    def epoch_completed(self) -> None:
        """An epoch went through: a later failure is not "the same failure again"."""
        self._failure = None

    def discard_staged(self) -> None:
        """The job ends: staged sink output after the epoch the next run resumes from is
        removed (the next run replays those epochs; output a completed checkpoint covers
        stays, to be committed when it is restored)."""
        latest = self.coordinator.latest
        epoch = latest.epoch if latest else (self._initial.epoch if self._initial else 0)
        try:
            self.output.discard_after(epoch)
        except Exception as exc:  # the job is failing anyway: say so, keep the cause
            log.warning("could not remove staged output after epoch %d: %s", epoch, exc)


def _newer(loaded: Target, own: Target | None) -> bool:
    """``loaded`` (a checkpoint elsewhere) is newer than this job's own latest."""
    if own is None:
        return True
    return loaded.store.uri != own.store.uri and loaded.meta.created_ms > own.meta.created_ms
