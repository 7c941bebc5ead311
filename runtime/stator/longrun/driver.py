"""The driver's side of long-running tasks: one Spark job whose tasks stay up across epochs,
fed one epoch at a time over sockets, instead of one Spark job per epoch.

A run, step by step:

1. Launch (on the first epoch, and whenever the epoch's shape changes: another parallelism,
   more source ranges than slots, keyed subtasks placed elsewhere): listen, submit one Spark
   job of one task per source range slot and per keyed subtask (keyed ones placed as a
   per-epoch job's, ``locality/placement.py``), and wait until every task said hello. A
   task that does not start within ``LAUNCH_TIMEOUT_S`` (too few task slots) ends the run.
2. Run an epoch: send its spec to every task; wait for every task's Done. Its reports are
   what a per-epoch job's accumulator would hold, so the epoch loop goes on as ever.
3. Any failure (a task's Failed, a lost connection, the Spark job ending, a cancel by
   ``FutileRetryListener``) ends the run (its Spark job cancelled) and raises: the region
   fails over as for a failed epoch, and the next epoch launches a new run.
4. Stop: tell every task and wait for the job to end (cancelled after ``STOP_TIMEOUT_S``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import pickle
import re
import selectors
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from ..api.nodes import KeyedNode, SourceNode
from ..cluster.jvm import prefer_locations
from ..config import SparkConfig
from ..epoch.reports import Report
from ..epoch.spec import EpochSpec
from ..errors import ConfigError, StatorError
from ..locality.state_holders import state_on
from .messages import (
    KEYED,
    SOURCE,
    Done,
    Failed,
    Hello,
    Launch,
    Peers,
    RunEpoch,
    Stop,
    TaskRole,
    without_pipeline,
)
from .task import long_running_task
from .wire import TOKEN_BYTES, Channel, ChannelClosed, accept, listen, own_address

log = logging.getLogger("stator.driver")

LAUNCH_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
POLL_S = 0.5  # how often a waiting epoch looks whether the run's Spark job still runs


class RunFailed(StatorError):
    """A long-running task failed or was lost: the region fails over."""


@dataclass(frozen=True)
class Shape:
    """What a run's tasks are fixed to: source range slots per source, keyed parallelism,
    and where keyed subtasks run (preferred and state-holding locations)."""

    sources: tuple[tuple[str, int], ...]  # (uid, slots)
    keyed: tuple[tuple[str, int], ...]  # (uid, parallelism)
    locations: tuple[str, ...]
    state_on: tuple[str, ...]

    def serves(self, wanted: Shape) -> bool:
        slots = dict(self.sources)
        return (
            self.keyed == wanted.keyed
            and self.locations == wanted.locations
            and self.state_on == wanted.state_on
            and all(slots.get(uid, -1) >= n for uid, n in wanted.sources)
        )


Placement = Callable[[str, int], list[str]]


def shape_of(spec: EpochSpec, placement: Placement | None) -> Shape:
    """The run an epoch needs: its source ranges, keyed parallelism, and where the keyed
    subtasks go (the placement spreads subtasks without state over the executors)."""
    keyed = [n for n in spec.pipeline.nodes if isinstance(n, KeyedNode)]
    locations: list[str] = []
    state: list[str] = []
    if placement is not None:
        for node in keyed:
            p = spec.parallelism[node.uid]
            locations += placement(node.uid, p)
            state += state_on(spec, node.uid, p)
    return Shape(
        tuple((uid, len(ranges)) for uid, ranges in spec.ranges.items()),
        tuple((n.uid, spec.parallelism[n.uid]) for n in keyed),
        tuple(locations),
        tuple(state),
    )


class Tasks(Protocol):
    """How a run's tasks are started and cancelled: a Spark job (:class:`SparkTasks`), or
    threads in a test."""

    def start(self, launch: Launch, shape: Shape, run: Run) -> None:
        """Start one task per role; call ``run.ended(error)`` once they all ended."""

    def cancel(self, run: Run) -> None:
        """End the tasks now."""


class SparkTasks:
    """A run's tasks as one Spark job of one task per role, keyed subtasks placed as a
    per-epoch job's keyed tasks are."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark

    def start(self, launch: Launch, shape: Shape, run: Run) -> None:
        sc = self.spark.sparkContext
        roles = launch.roles
        rdd = sc.parallelize(range(len(roles)), len(roles)).mapPartitionsWithIndex(
            functools.partial(long_running_task, launch)
        )
        if shape.locations:
            sources = sum(1 for r in roles if r.kind == SOURCE)
            rdd = prefer_locations(
                sc,
                rdd,
                source_locations(sources, shape.locations) + list(shape.locations),
                [""] * sources + list(shape.state_on),
            )
        pool = sc.getLocalProperty("spark.scheduler.pool")  # the region's (regions.py)

        def job() -> None:
            error: BaseException | None = None
            try:
                if pool:
                    sc.setLocalProperty("spark.scheduler.pool", pool)
                sc.setJobGroup(run.group, f"{run.description}: long-running tasks", True)
                rdd._jrdd.count()
            except BaseException as exc:  # reported to the waiting epoch
                error = exc
            run.ended(error)

        threading.Thread(target=job, name="stator-long-running", daemon=True).start()

    def cancel(self, run: Run) -> None:
        self.spark.sparkContext.cancelJobGroup(run.group)


def source_locations(count: int, keyed: tuple[str, ...]) -> list[str]:
    """Where a run's ``count`` source tasks go: round robin over the locations of its keyed
    subtasks. A task without a preference would give the whole job Spark's NO_PREF locality
    level, which skips the locality wait: any executor then takes tasks that prefer another
    executor on its host. ``local-cluster`` executors all share one host, and a keyed subtask
    whose executor was briefly without free slots started on another (and stayed there)."""
    targets = sorted({location for location in keyed if location})
    return [targets[i % len(targets)] if targets else "" for i in range(count)]


class LongRunningTasks:
    """The epoch runner of ``epoch.tasks: long-running``, for one region's epoch loop."""

    def __init__(self, tasks: Tasks, loopback: bool, driver_host: str) -> None:
        self.tasks, self.loopback, self.driver_host = tasks, loopback, driver_host
        self.run: Run | None = None
        self.launched = 0  # runs started (a failure or a changed shape starts another)
        self.slots = 0  # the session's task slots where known in advance (local mode)

    @classmethod
    def on_spark(cls, spark: Any) -> LongRunningTasks:
        sc = spark.sparkContext
        master = str(sc.master)
        loopback = master.startswith("local")
        host = "127.0.0.1" if loopback else sc.getConf().get("spark.driver.host", "")
        runner = cls(SparkTasks(spark), loopback, host or own_address())
        local = re.fullmatch(r"local\[(\d+)(?:,\s*\d+)?\]", master)
        if local:  # known before launching: a run that needs more never starts
            runner.slots = int(local.group(1))
        return runner

    def run_epoch(
        self, spec: EpochSpec, group: str, description: str, placement: Placement | None
    ) -> list[Report]:
        shape = shape_of(spec, placement)
        if self.run is not None and not self.run.shape.serves(shape):
            log.info("long-running tasks relaunched: %s -> %s", self.run.shape, shape)
            self.stop()
        try:
            if self.run is None:
                self.run = Run.start(self, spec, shape, f"{group}-tasks", description)
                self.launched += 1
            return self.run.epoch(spec)
        except BaseException:
            self.abort()
            raise

    def stop(self) -> None:
        """Step 4: end the run, if any (the job stops, or its shape changes)."""
        run, self.run = self.run, None
        if run is not None:
            run.stop()

    def abort(self) -> None:
        """Step 3: end the run now."""
        run, self.run = self.run, None
        if run is not None:
            run.cancel()


class Run:
    def __init__(
        self,
        tasks: Tasks,
        launch: Launch,
        shape: Shape,
        group: str,
        description: str,
        server: socket.socket,
    ) -> None:
        self.tasks, self.launch, self.shape = tasks, launch, shape
        self.group, self.description, self.server = group, description, server
        self.channels: dict[int, Channel] = {}
        self.job_error: BaseException | None = None
        self.job_done = threading.Event()

    def ended(self, error: BaseException | None) -> None:
        """The tasks all ended (``error``: why the Spark job failed, if it did)."""
        self.job_error = error
        self.job_done.set()

    @classmethod
    def start(
        cls, runner: LongRunningTasks, spec: EpochSpec, shape: Shape, group: str, description: str
    ) -> Run:
        """Step 1."""
        roles = _roles(spec, shape)
        if runner.slots and len(roles) > runner.slots:
            raise ConfigError(
                f"epoch.tasks=long-running needs {len(roles)} task slots at once (one per "
                f"source range and keyed subtask), the Spark session has {runner.slots}: let "
                f"the job create its session, or create it from "
                f"stator.longrun.driver.session_config(spark_config)"
            )
        server = listen("127.0.0.1" if runner.loopback else "0.0.0.0")  # noqa: S104 - token-gated
        launch = Launch(
            uuid.uuid4().hex,
            (runner.driver_host, server.getsockname()[1]),
            os.urandom(TOKEN_BYTES),
            tuple(roles),
            spec.pipeline,
            runner.loopback,
        )
        run = cls(runner.tasks, launch, shape, group, description, server)
        runner.tasks.start(launch, shape, run)
        try:
            run._gather()
        except BaseException:
            run.cancel()
            raise
        return run

    def _gather(self) -> None:
        """Step 1's wait for every task's hello, then where keyed subtasks listen."""
        roles = self.launch.roles
        deadline = time.monotonic() + LAUNCH_TIMEOUT_S
        addresses: dict[tuple[int, int], tuple[str, int]] = {}
        self.server.settimeout(POLL_S)
        while len(self.channels) < len(roles):
            self._job_alive("while its tasks started")
            if time.monotonic() > deadline:
                raise RunFailed(
                    f"only {len(self.channels)} of {len(roles)} long-running tasks started "
                    f"within {LAUNCH_TIMEOUT_S:.0f} s: epoch.tasks=long-running needs a task "
                    f"slot per source split and per keyed subtask at once (executor cores); "
                    f"give the executors more cores or use epoch.tasks=per-epoch"
                )
            try:
                channel = accept(self.server, self.launch.token, LAUNCH_TIMEOUT_S)
            except TimeoutError:
                continue
            if channel is None:
                continue
            hello = channel.recv()
            if not isinstance(hello, Hello) or not 0 <= hello.index < len(roles):
                channel.close()
                continue
            self.channels[hello.index] = channel
            role = roles[hello.index]
            if role.kind == KEYED and hello.address is not None:
                addresses[(role.node_id, role.index)] = hello.address
        peers = Peers(addresses)
        for channel in self.channels.values():
            channel.send(peers)

    def epoch(self, spec: EpochSpec) -> list[Report]:
        """Step 2."""
        body = pickle.dumps(RunEpoch(without_pipeline(spec)), protocol=pickle.HIGHEST_PROTOCOL)
        for channel in self.channels.values():
            channel.send_pickled(body)
        waiting = set(self.channels)
        reports: list[Report] = []
        with selectors.DefaultSelector() as selector:
            for index, channel in self.channels.items():
                selector.register(channel.sock, selectors.EVENT_READ, index)
            while waiting:
                ready = selector.select(POLL_S)
                if not ready:
                    self._job_alive(f"in epoch {spec.epoch}")
                for key, _ in ready:
                    index = key.data
                    answer = self._answer(index, spec.epoch)
                    if isinstance(answer, Failed):
                        raise RunFailed(
                            f"long-running task {_describe(self.launch.roles[index])} failed "
                            f"in epoch {spec.epoch}:\n{answer.error}"
                        )
                    if isinstance(answer, Done) and answer.epoch == spec.epoch:
                        reports.extend(answer.reports)
                        waiting.discard(index)
                        selector.unregister(self.channels[index].sock)
        return reports

    def _answer(self, index: int, epoch: int) -> Any:
        try:
            return self.channels[index].recv()
        except (ChannelClosed, OSError) as exc:
            raise RunFailed(
                f"long-running task {_describe(self.launch.roles[index])} was lost in epoch "
                f"{epoch}: {exc}"
            ) from exc

    def _job_alive(self, when: str) -> None:
        if self.job_done.is_set():
            raise RunFailed(
                f"the long-running tasks' Spark job ended {when}: {self.job_error or 'no error'}"
            )

    def stop(self) -> None:
        """Step 4."""
        for channel in self.channels.values():
            with contextlib.suppress(OSError):
                channel.send(Stop())
        if not self.job_done.wait(STOP_TIMEOUT_S):
            log.warning("long-running tasks did not stop within %.0f s: cancelled", STOP_TIMEOUT_S)
            self.cancel()
        self._close()

    def cancel(self) -> None:
        """Step 3: the tasks ended (a Spark job cancelled, its tasks interrupted), every
        connection closed."""
        self.tasks.cancel(self)
        self._close()
        self.job_done.wait(STOP_TIMEOUT_S)

    def _close(self) -> None:
        for channel in self.channels.values():
            channel.close()
        with contextlib.suppress(OSError):
            self.server.close()


def _roles(spec: EpochSpec, shape: Shape) -> list[TaskRole]:
    nodes = spec.pipeline.nodes
    roles: list[TaskRole] = []
    for uid, slots in shape.sources:
        node = next(n for n in nodes if isinstance(n, SourceNode) and n.uid == uid)
        roles += [TaskRole(SOURCE, node.id, uid, i) for i in range(slots)]
    for uid, p in shape.keyed:
        keyed = next(n for n in nodes if isinstance(n, KeyedNode) and n.uid == uid)
        roles += [TaskRole(KEYED, keyed.id, uid, i) for i in range(p)]
    return roles


def _describe(role: TaskRole) -> str:
    what = "range slot" if role.kind == SOURCE else "subtask"
    return f"{role.kind} '{role.uid}' {what} {role.index}"


# Task slots for long-running tasks: they wait on sockets most of the time, so a slot per
# core would only cap how many may run, not how much CPU they use.
LOCAL_SLOTS = 256  # local[N]
EXECUTOR_SLOTS = 64  # per executor (local-cluster, executor pods)


def session_config(cfg: SparkConfig) -> SparkConfig:
    """``cfg`` for a session that runs long-running tasks: a task slot for every task.

    - ``local[N]``: ``local[LOCAL_SLOTS]``;
    - ``local-cluster[E,C,M]``: ``EXECUTOR_SLOTS`` cores per executor;
    - executor pods: ``spark.executor.cores`` (slots) is raised to ``EXECUTOR_SLOTS`` while
      the pod still asks for its cores (``spark.kubernetes.executor.request.cores``).
    What the cores were stays the default parallelism of the session's other Spark jobs and
    the threads a worker's native libraries use."""
    master, conf = cfg.master.strip(), dict(cfg.conf)
    local = re.fullmatch(r"local(?:\[(\*|\d+)\])?", master)
    if local:
        cores = local.group(1) or "1"
        n = (os.cpu_count() or 1) if cores == "*" else int(cores)
        conf.setdefault("spark.default.parallelism", str(n))
        return replace(cfg, master=f"local[{max(n, LOCAL_SLOTS)}]", conf=conf)
    cluster = re.fullmatch(r"local-cluster\[(\d+),\s*(\d+),\s*(\d+)\]", master)
    if cluster:
        executors, cores, memory = (int(g) for g in cluster.groups())
        conf.setdefault("spark.default.parallelism", str(executors * cores))
        slots = max(cores, EXECUTOR_SLOTS)
        return replace(cfg, master=f"local-cluster[{executors},{slots},{memory}]", conf=conf)
    cores = conf.get("spark.executor.cores", "1")
    conf.setdefault("spark.kubernetes.executor.request.cores", cores)
    conf.setdefault("spark.executorEnv.OMP_NUM_THREADS", cores)
    instances = conf.get("spark.executor.instances")
    if instances:
        conf.setdefault("spark.default.parallelism", str(int(instances) * int(cores)))
    conf["spark.executor.cores"] = str(max(int(cores), EXECUTOR_SLOTS))
    return replace(cfg, conf=conf)
