"""What a long-running task runs on an executor: one source range slot or one keyed
subtask, epoch after epoch, until the driver stops the run.

1. Say hello: connect to the driver (with the run's token); a keyed task first listens for
   its input and says where. Then learn where every keyed subtask listens.
2. For each epoch the driver sends: run the same per-epoch code as a task of a per-epoch
   Spark job (``tasks/source.py``, ``tasks/keyed.py``): a source task reads its range, a
   keyed task first waits for a frame from every producer of the epoch (``inbox.py``) and
   keeps its database open from one epoch to the next (``state/backend.py`` ``KeptOpen``).
   Output for keyed operators downstream goes straight to their subtasks, one frame each,
   empty or not.
3. Report: the task's reports to the driver (Done). If the epoch's work raised, say so with
   the traceback (Failed) and fail the Spark task: the driver ends the run and fails over,
   as for any failed epoch; Spark's retry of the task returns at once.
"""

from __future__ import annotations

import queue
import threading
import traceback
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any

from ..epoch.reports import Report
from ..epoch.spec import EpochSpec
from ..state.backend import KeptOpen
from ..tasks.gc_pause import task_ended
from ..tasks.keyed import keyed_task
from ..tasks.routing import Shuffled, distinct_targets, epoch_producers
from ..tasks.source import source_task
from .inbox import Inbox
from .messages import (
    KEYED,
    Data,
    Done,
    Failed,
    Hello,
    Launch,
    Peers,
    RunEpoch,
    Stop,
    TaskRole,
)
from .wire import Channel, ChannelClosed, connect, listen, own_address


class Reports:
    """What a per-epoch task adds to its job's accumulator, kept for the Done frame."""

    def __init__(self) -> None:
        self.items: list[Report] = []

    def add(self, reports: list[Report]) -> None:
        self.items.extend(reports)


def long_running_task(launch: Launch, index: int, _items: Iterable[Any]) -> Iterator[Any]:
    from pyspark import TaskContext  # noqa: PLC0415 - only inside a task

    ctx: Any = TaskContext.get()
    if ctx is not None and ctx.attemptNumber() > 0:
        return iter(())  # the driver ended the run when this task failed: nothing to do
    TaskLoop(launch, index).run()
    return iter(())


class TaskLoop:
    def __init__(self, launch: Launch, index: int) -> None:
        self.launch, self.index = launch, index
        self.role: TaskRole = launch.roles[index]
        self.peers: dict[tuple[int, int], tuple[str, int]] = {}
        self.out: dict[tuple[str, int], Channel] = {}
        self.inbox: Inbox | None = None
        self.control: queue.Queue[Any] = queue.Queue()
        self.kept = KeptOpen()  # a keyed task's database, open from one epoch to the next

    def run(self) -> None:
        launch, driver = self.launch, None
        try:
            address = self._listen()  # step 1
            driver = connect(launch.driver, launch.token, "the driver")
            driver.send(Hello(self.index, address))
            threading.Thread(
                target=self._read_driver, args=(driver,), name="stator-control", daemon=True
            ).start()
            peers = self.control.get()
            if not isinstance(peers, Peers):
                return  # the driver ended the run before it began
            self.peers = peers.addresses
            while True:
                message = self.control.get()
                if not isinstance(message, RunEpoch):
                    return  # Stop, or the driver is gone
                spec = replace(message.spec, pipeline=launch.pipeline)
                try:
                    reports = self._epoch(spec)  # step 2
                except BaseException as exc:  # step 3: what failed first, then where
                    error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
                    driver.send(Failed(spec.epoch, self.index, error))
                    raise
                driver.send(Done(spec.epoch, self.index, reports))
                task_ended()
        finally:  # the Python worker is reused: nothing of the run may outlive it
            self.kept.close()
            if driver is not None:
                driver.close()
            if self.inbox is not None:
                self.inbox.close()
            for channel in self.out.values():
                channel.close()

    def _listen(self) -> tuple[str, int] | None:
        """A keyed task's inbox: where upstream tasks send its input (None for a source)."""
        if self.role.kind != KEYED:
            return None
        loopback = self.launch.loopback
        server = listen("127.0.0.1" if loopback else "0.0.0.0")  # noqa: S104 - token-gated
        self.inbox = Inbox(server, self.launch.token)
        return ("127.0.0.1" if loopback else own_address(), server.getsockname()[1])

    def _read_driver(self, driver: Channel) -> None:
        while True:
            try:
                message = driver.recv()
            except (ChannelClosed, OSError) as exc:
                message = Stop()
                if self.inbox is not None:
                    self.inbox.abort(f"the driver closed the run: {exc}")
            self.control.put(message)
            if isinstance(message, Stop):
                return

    def _epoch(self, spec: EpochSpec) -> list[Report]:
        role, reports = self.role, Reports()
        if role.kind == KEYED:
            assert self.inbox is not None
            expected = epoch_producers(spec, spec.pipeline).get(role.node_id)
            if expected is None:
                return []  # not in this epoch (as a per-epoch job would not run it)
            items = self.inbox.take(spec.epoch, expected)
            out = keyed_task(spec, role.node_id, reports, role.index, items, self.kept)
        else:
            if role.index >= len(spec.ranges.get(role.uid, ())):
                return []  # no range for this slot: the keyed tasks expect no frame from it
            out = _read(spec, role.node_id, reports, role.index)
        self._send(spec, role.node_id, out)
        return reports.items

    def _send(self, spec: EpochSpec, node_id: int, out: Iterator[Shuffled]) -> None:
        """Route ``node_id``'s output to every subtask of the keyed operators it feeds, one
        frame each (empty ones too: they complete the subtask's input); output of a node
        that feeds none is already in its sinks."""
        targets = distinct_targets(spec.pipeline, node_id)
        buckets: dict[tuple[int, int], list[tuple[int, bytes]]] = {}
        for target_id, subtask, payload in out:
            buckets.setdefault((target_id, subtask), []).append((subtask, payload))
        for target in targets:
            for subtask in range(spec.parallelism[target.uid]):
                items = buckets.get((target.id, subtask), [])
                self._channel((target.id, subtask)).send(
                    Data(spec.epoch, target.id, subtask, items)
                )

    def _channel(self, key: tuple[int, int]) -> Channel:
        address = self.peers[key]
        channel = self.out.get(address)
        if channel is None:
            channel = self.out[address] = connect(address, self.launch.token, f"subtask {key}")
        return channel


def _read(spec: EpochSpec, node_id: int, reports: Reports, index: int) -> Iterator[Shuffled]:
    """A source task's epoch, with Spark's attempts of a task when its split fails over on
    its own (``EpochSpec.split_failover_attempts``): the last one reports the failure."""
    attempts = max(1, spec.split_failover_attempts)
    for attempt in range(attempts):
        last = attempt == attempts - 1
        try:
            return source_task(
                spec,
                node_id,
                reports,
                index,
                (),
                last_attempt=last and spec.split_failover_attempts > 0,
            )
        except Exception:
            if last:
                raise
    raise AssertionError("unreachable")
