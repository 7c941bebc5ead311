"""Errors a user can act on, and the one way a command reports one. Each message names the
thing that is wrong and how to fix it."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path


class StatorError(Exception):
    """Base class: an error Stator explains (as opposed to a bug).

    ``detail`` is shown below the one-line message (e.g. the traceback of the user's code
    that raised); the message itself stays one line, so a user or a script finds it."""

    def __init__(self, *args: object, detail: str | None = None) -> None:
        super().__init__(*args)
        self.detail = detail


class ConfigError(StatorError):
    """A configuration key or value is wrong."""


class PipelineError(StatorError):
    """A pipeline cannot be loaded or its graph is invalid."""


class StorageError(StatorError):
    """Checkpoint or sink storage is unreachable, misconfigured or refused an operation."""


class StateCompatibilityError(StatorError):
    """Stored state cannot be read by the current code (kind, serializer, maxParallelism)."""


class CheckpointNotFoundError(StatorError):
    """No usable checkpoint at the given location."""


class UnknownVersionError(CheckpointNotFoundError):
    """Stored metadata of a format version this Stator does not read: refused by its
    version, never read by guesswork (there is one version of each format)."""

    def __init__(self, what: str, where: str, version: int, current: int) -> None:
        super().__init__(
            f"{what} {where} has format version {version}, this Stator reads version "
            f"{current} only: restore it with the Stator version that wrote it, or start "
            f"without it (another restore.source, or restore.source: none)"
        )
        self.version = version


class StateMismatchError(StatorError):
    """A task found its local state at another epoch than the coordinator expects.

    Raised on executors, or by the driver before an epoch whose tasks would raise it; the
    driver answers it by rewinding the job to its latest completed checkpoint (the task may
    have committed this epoch before it failed)."""


class SinkCommitError(StatorError):
    """A sink could not commit output a completed checkpoint covers. The checkpoint stands;
    the driver fails over to it, and restoring it commits the output again."""


class CheckpointsUnhealthy(StatorError):
    """Checkpoints failed more often in a row than ``checkpoint.tolerable_failures``, or none
    completed within ``checkpoint.progress_window_ms`` (``driver/checkpoint_health.py``): the
    job fails over, through the restart strategy, to its latest completed checkpoint."""


class JobFailed(StatorError):
    """The job ended because of a failure: the restart strategy gave up, or the failure is
    one that restarting cannot fix (bad configuration, incompatible state)."""


# Where Kubernetes takes a container's termination message from (the file exists only in a
# container; the operator can read it from the pod status once the driver has ended).
TERMINATION_LOG = "/dev/termination-log"


def report_error(exc: StatorError) -> None:
    """One ``stator: error:`` line a user or a script can find (the message's whitespace,
    newlines included, collapsed), and the detail (e.g. the user's traceback) below it. In a
    container, the line is also the termination message."""
    line = f"stator: error: {' '.join(str(exc).split())}"
    print(line, file=sys.stderr)
    if exc.detail:
        print(exc.detail, file=sys.stderr)
    termination_log = Path(os.environ.get("STATOR_TERMINATION_LOG", TERMINATION_LOG))
    if termination_log.is_file():  # never created here: only written where it exists
        with contextlib.suppress(OSError):
            termination_log.write_text(line[:4096])  # Kubernetes keeps at most 4096 bytes
