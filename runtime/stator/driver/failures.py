"""What a failed epoch means: retry it, fall back to an older checkpoint, or end the job now.

A restart helps only when the cause can go away (a lost executor, a network error, a storage
timeout): those go through the restart strategy. Restarting a failure that will happen again
only delays the error and buries its cause, so these end the job at once:

- :class:`~stator.errors.ConfigError`, :class:`~stator.errors.PipelineError`, and a
  ``StateCompatibilityError`` (raised on the driver, or found in a task's failure text);
- a savepoint that cannot be restored (every attempt reads the same bytes; a savepoint whose
  storage could not be read is retried). A *checkpoint* that cannot be restored instead falls
  back to the previous retained checkpoint;
- a user function that raised (``tasks/user_errors.py``) on every one of Spark's attempts of
  its task, or, when Spark does not retry tasks (``spark.task_attempts=1``), raised the same
  error in two attempts of the epoch in a row.

Everything a user reads comes out of :func:`classify` as one line (``Failure.summary``): the
user's exception with operator, key and epoch rather than the ``Py4JJavaError`` around it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from ..errors import CheckpointsUnhealthy, ConfigError, PipelineError, StateCompatibilityError
from ..lineage import Target
from ..locality.restore import RESTORE_ERROR_MARKER
from ..tasks.user_errors import TRACEBACK_BEGIN, TRACEBACK_END, USER_ERROR_MARKER

_ATTEMPTS = re.compile(r"failed (\d+) times")
_PYTHON_TRACEBACK = "PythonException: Traceback (most recent call last):"


class Kind(Enum):
    RETRY = "retry"  # through the restart strategy
    FALL_BACK = "fall-back"  # the checkpoint cannot be restored: the one before it
    FATAL = "fatal"  # end the job now


@dataclass(frozen=True)
class Failure:
    kind: Kind
    summary: str  # one line: the CLI's error, status.last_error
    reason: str = ""  # why a FATAL failure is not retried, and what to do
    user_traceback: str | None = None  # the user's code, for the driver log


def classify(exc: BaseException, target: Target | None, previous: Failure | None) -> Failure:
    """``target``: what the failed epoch's state descends from; ``previous``: the failure
    before this one, if the job has not completed an epoch since."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, ConfigError | PipelineError | StateCompatibilityError):
        return Failure(Kind.FATAL, short_error(text), "a restart cannot fix it")
    if isinstance(exc, CheckpointsUnhealthy):  # its own words: the cause it quotes is not it
        return Failure(Kind.RETRY, _one_line(str(exc), 600))
    return classify_text(text, target, previous)


def classify_text(text: str, target: Target | None, previous: Failure | None) -> Failure:
    """:func:`classify` for a failure known by its text (a task's report of one)."""
    summary = short_error(text)
    if "StateCompatibilityError" in text:
        return Failure(Kind.FATAL, summary, "a restart cannot fix it")
    if RESTORE_ERROR_MARKER in text and target is not None:
        return _restore_failure(text, summary, target)
    if USER_ERROR_MARKER in text:
        return _user_failure(text, summary, previous)
    return Failure(Kind.RETRY, summary)


def _restore_failure(text: str, summary: str, target: Target) -> Failure:
    if not target.is_savepoint:
        return Failure(Kind.FALL_BACK, summary)
    # A savepoint's bytes do not change: unreadable now, unreadable on every retry. Unless
    # its storage could not be read (a StorageError caused it): that may pass, so retry.
    if "StorageError: " in text:
        return Failure(Kind.RETRY, summary)
    return Failure(
        Kind.FATAL,
        summary,
        f"{target.describe()} cannot be restored; restore from another savepoint or "
        f"checkpoint (restore.source)",
    )


def _user_failure(text: str, summary: str, previous: Failure | None) -> Failure:
    trace = _user_traceback(text)
    attempts = _spark_attempts(text)
    if attempts is not None and attempts > 1:
        reason = f"it raised on all {attempts} attempts of its task"
    elif previous is not None and previous.summary == summary:
        reason = "it raised again when the epoch was retried"
    else:
        return Failure(Kind.RETRY, summary, user_traceback=trace)
    return Failure(
        Kind.FATAL,
        summary,
        f"{reason}, so it is not retried; fix the function or its input and run again: "
        f"the job resumes from its latest checkpoint",
        trace,
    )


def short_error(text: str, limit: int = 600) -> str:
    """One line that says what failed, out of a (possibly Py4J-wrapped) error: the user's
    summary, else a Stator error's first line, else the Python exception a worker raised,
    else the start of the text."""
    idx = text.find(USER_ERROR_MARKER + ": ")
    if idx >= 0:
        return _one_line(text[idx + len(USER_ERROR_MARKER) + 2 :].split("\n", 1)[0], limit)
    # As the exception's own line prints them (a traceback's source lines, e.g.
    # "raise StateCompatibilityError(", must not match).
    for marker in (
        RESTORE_ERROR_MARKER + "[",
        "StateMismatchError: ",
        "StateCompatibilityError: ",
        "StorageError: ",
    ):
        idx = text.find(marker)
        if idx >= 0:
            return _one_line(text[idx:].split("\n", 1)[0], limit)
    worker = _worker_exception(text)
    return _one_line(worker or text, limit)


def _worker_exception(text: str) -> str | None:
    """The exception line of the first Python traceback a worker sent (the last line of it
    that is not indented), e.g. ``ConnectionError: ...``."""
    idx = text.find(_PYTHON_TRACEBACK)
    if idx < 0:
        return None
    block = text[idx + len(_PYTHON_TRACEBACK) :].split("\n\tat ", 1)[0]
    lines = [line for line in block.splitlines() if line and not line[0].isspace()]
    return lines[-1] if lines else None


def _one_line(text: str, limit: int) -> str:
    return " ".join(text.split())[:limit]


def _user_traceback(text: str) -> str | None:
    start = text.find(TRACEBACK_BEGIN)
    end = text.find(TRACEBACK_END, start)
    if start < 0 or end < 0:
        return None
    return text[start + len(TRACEBACK_BEGIN) : end].strip("\n")


def _spark_attempts(text: str) -> int | None:
    """How many times Spark ran the failed task ("Task 0 in stage 3.0 failed 4 times")."""
    match = _ATTEMPTS.search(text)
    return int(match.group(1)) if match else None
