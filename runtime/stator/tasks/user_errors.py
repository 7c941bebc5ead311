"""A user function that raises inside a task, made recognizable to the driver.

Spark hands the driver a task failure as Java text (a ``Py4JJavaError`` whose message holds
the Python worker's traceback somewhere among Java stack frames). So the executor wraps the
user's exception in :class:`UserFunctionError`, whose message carries a marker line with what
a user needs first (type, message, operator, key, epoch) and the user's own traceback between
two delimiter lines; ``driver/failures.py`` finds both in the text. Stator's own errors
(:class:`~stator.errors.StatorError`) pass through unwrapped: the driver classifies them
by their own names.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

from ..errors import StatorError

USER_ERROR_MARKER = "StatorUserError"
TRACEBACK_BEGIN = "--- stator: user traceback ---"
TRACEBACK_END = "--- stator: end of user traceback ---"
KEY_LIMIT = 80  # characters of a key's repr
MESSAGE_LIMIT = 300  # characters of the exception's message
_STATOR_DIR = str(Path(__file__).resolve().parents[1])


class UserFunctionError(StatorError):
    """Raised on an executor when a user function raised."""

    def __init__(self, summary: str, user_traceback: str) -> None:
        super().__init__(
            f"{USER_ERROR_MARKER}: {summary}\n{TRACEBACK_BEGIN}\n{user_traceback}\n{TRACEBACK_END}"
        )
        self.summary = summary


def summarize(exc: BaseException, operator: str, epoch: int, key: Any = None) -> str:
    """``KeyError: 'price' in operator 'totals' key 'u1' epoch 3`` (key only if known)."""
    message = " ".join(str(exc).split())
    if len(message) > MESSAGE_LIMIT:
        message = message[: MESSAGE_LIMIT - 3] + "..."
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    text += f" in operator '{operator}'"
    if key is not None:
        shown = " ".join(repr(key).split())
        text += f" key {shown[: KEY_LIMIT - 3] + '...' if len(shown) > KEY_LIMIT else shown}"
    return f"{text} epoch {epoch}"


def user_traceback(exc: BaseException) -> str:
    """The traceback from the first frame outside Stator down (the user's code, and what it
    called), with any chained exceptions."""
    tb: TracebackType | None = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_STATOR_DIR):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__)).rstrip()


@contextmanager
def user_code(operator: str, epoch: int, key: Callable[[], Any] | None = None) -> Iterator[None]:
    """Run user code of ``operator``; a non-Stator exception becomes a
    :class:`UserFunctionError` (``key`` is asked for the key being processed, if any).
    Entered once per batch, not per record: it costs nothing while nothing raises."""
    try:
        yield
    except StatorError:
        raise
    except Exception as exc:
        current = None
        if key is not None:
            try:
                current = key()
            except Exception:  # the key is a courtesy; the error that matters is exc
                current = None
        raise UserFunctionError(
            summarize(exc, operator, epoch, current), user_traceback(exc)
        ) from exc
