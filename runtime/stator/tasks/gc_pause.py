"""Python's cyclic garbage collector, paused while a task runs.

A task holds hundreds of thousands of live container objects until it ends: the records
(tuples), their columns, state values, output pairs. CPython starts a collection every few
hundred container allocations, and the older generations' collections traverse every live
container, so a task's collections grow with its batch: profiled on the keyed count, they
took a third of a keyed task's time. Records and state values form no reference cycles, so
collecting during a task frees nothing the task's end would not free anyway.

The task's output is still alive when the function returns: PySpark pickles it for the
shuffle afterwards. Switched back on at that point, the collector's first young collection
traversed all of it (profiled: 15% of the Python workers' time in the keyed count, at the
first allocation after the source task returned). So in Spark's Python workers the daemon
(``tasks/pydaemon.py``) asks for the collector back only when the whole PySpark task has
ended (:func:`resume_after_each_task`), when the output is freed; PySpark's daemon then
collects once before the worker's next task. Elsewhere (a task run directly, a test) it is
switched back on when the task returns or raises, so cycles a user function created are
collected then, as before.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


class _Pause:
    """This process's pause: who switched the collector off, and when it comes back."""

    __slots__ = ("at_task_end", "frozen", "paused")

    def __init__(self) -> None:
        self.at_task_end = False  # set in Spark's Python workers: resume once the task ended
        self.paused = False  # switched off here and not switched back on yet
        self.frozen = False  # this worker's long-lived objects are out of the collector's view


_PAUSE = _Pause()


def gc_paused(task: Callable[P, R]) -> Callable[P, R]:
    """Run ``task`` with the cyclic collector off (reference counting still frees memory)."""

    @functools.wraps(task)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        if not gc.isenabled():  # nested, paused already, or switched off by someone else
            return task(*args, **kwargs)
        gc.disable()
        _PAUSE.paused = True
        try:
            return task(*args, **kwargs)
        finally:
            if not _PAUSE.at_task_end:
                resume()

    return run


def resume() -> None:
    """Switch the collector back on if a task paused it (never one someone else paused)."""
    if _PAUSE.paused:
        _PAUSE.paused = False
        gc.enable()


def resume_after_each_task(worker_main: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap PySpark's per-task worker entry so a paused collector resumes when it returns.

    PySpark's daemon collects after every task of a reused worker, and a full collection
    traverses every live container: the modules, classes and functions of PySpark, Stator
    and the pipeline (profiled: 4% of the keyed count's worker time, ~20 ms a task). Those
    are all loaded by a worker's first task and live as long as it, so after that task they
    are collected once and frozen (``gc.freeze``): later collections look only at what later
    tasks leave behind."""
    _PAUSE.at_task_end = True

    @functools.wraps(worker_main)
    def run_task(*args: Any, **kwargs: Any) -> Any:
        try:
            return worker_main(*args, **kwargs)
        finally:
            task_ended()

    return run_task


def task_ended() -> None:
    """A task's end: the collector back on; the worker's long-lived objects collected and
    frozen once. A long-running task (``longrun/task.py``), which never ends, calls it
    after each epoch, once the epoch's output is sent and freed."""
    resume()
    if not _PAUSE.frozen:
        _PAUSE.frozen = True
        gc.collect()
        gc.freeze()
