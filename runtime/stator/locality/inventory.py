"""What each executor holds on its disk: the job's task-local checkpoint copies, found by a
small Spark job with one task per executor.

A driver knows where keyed subtasks ran only while it lives. A new driver (after a driver
failure, a last-state upgrade or a resume), or an executor that replaced a lost one on the same
node and volume, finds local copies that no running driver has seen. Before a restore the
driver surveys every executor it has not surveyed yet (:meth:`Inventory.survey`):

1. One partition per executor, each preferring that executor process-locally (the JVM RDD of
   ``jvm.py``); executors are idle between epochs, so each task runs where it is asked to.
2. Each task lists ``<state root>/<job>/<uid>/<subtask>-of-<parallelism>/chk-<id>`` under the
   state directory of the executor it ran on (``epoch.spec.state_root``: the executor's own
   ``STATOR_STATE_DIR``, else the job's ``state.local_dir``) and reports it with that
   executor's id, host and node, and which of them are standby copies
   (``locality/standby_copy.py``). A task that landed elsewhere reports that executor: the
   answer is true, only incomplete, and the executor it missed is asked again next time.

Executor ids are never reused within a Spark application, so what an executor held when it
was surveyed stays known until it is gone; what tasks do there later the driver sees in their
reports (``placement.py``). Standby copies are the exception, made while the job runs: with
them, every live executor is surveyed again before a restore.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..cluster.jvm import executor_location, prefer_locations, task_location
from ..epoch.spec import node_name, state_root
from .local_copy import copy_ids
from .standby_copy import standby_ids

_SUBTASK_DIR = re.compile(r"(\d+)-of-(\d+)")

# (operator uid, subtask, parallelism, checkpoint id) of one local copy
Copy = tuple[str, int, int, int]


@dataclass(frozen=True)
class Holding:
    """One executor and the local checkpoint copies of the job it holds."""

    executor: str
    host: str
    node: str
    copies: frozenset[Copy]
    # Of those, the standby copies (``locality/standby_copy.py``): one of an older checkpoint
    # than the one restored can still serve it, catching up on the files added since.
    standby: frozenset[Copy] = frozenset()


class Inventory:
    """Driver side: the holdings of the executors surveyed so far."""

    def __init__(self, job: str, local_dir: str) -> None:
        self.job, self.local_dir = job, local_dir
        self.known: dict[str, Holding] = {}

    def survey(self, sc: Any, live: dict[str, str], again: bool = False) -> dict[str, Holding]:
        """Steps 1-2 of the module docstring for the ``live`` executors (id -> host) not
        surveyed yet (``again``: all of them, as standby copies are made while the job runs);
        forgets executors that are gone. Returns every live holding known."""
        self.known = {e: h for e, h in self.known.items() if live.get(e) == h.host}
        new = sorted((e, h) for e, h in live.items() if again or e not in self.known)
        if new:
            rdd = sc.parallelize(range(len(new)), len(new))
            placed = prefer_locations(sc, rdd, [executor_location(h, e) for e, h in new])
            found = placed.mapPartitions(
                functools.partial(list_copies, self.job, self.local_dir)
            ).collect()
            for executor, host, node, copies, standby in found:
                if executor and live.get(executor) == host:
                    self.known[executor] = Holding(
                        executor, host, node, frozenset(copies), frozenset(standby)
                    )
        return dict(self.known)


def list_copies(
    job: str, local_dir: str, _: Iterable[Any]
) -> Iterator[tuple[str, str, str, list[Copy], list[Copy]]]:
    """On an executor: step 2 of the module docstring."""
    executor, host = task_location()
    root = state_root(local_dir) / job
    yield (
        executor,
        host,
        node_name(),
        sorted(_copies(root, copy_ids)),
        sorted(_copies(root, standby_ids)),
    )


def _copies(root: Path, ids: Callable[[Path], list[int]]) -> Iterator[Copy]:
    if not root.is_dir():
        return
    for operator in root.iterdir():
        if not operator.is_dir():
            continue
        for subtask_dir in operator.iterdir():
            m = _SUBTASK_DIR.fullmatch(subtask_dir.name)
            if m is None or not subtask_dir.is_dir():
                continue
            for checkpoint_id in ids(subtask_dir):
                yield operator.name, int(m.group(1)), int(m.group(2)), checkpoint_id
