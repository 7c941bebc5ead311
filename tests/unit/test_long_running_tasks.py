"""Long-running tasks' pure parts and their sockets, without Spark: who feeds whom in an
epoch (as a per-epoch Spark job would wire it), the task slots a session gets, the token
gate, and a run whose tasks do not all start. What they compute is proven by the state
model, the fraud example and the multi-input tests on ``inprocess_longrun.py``, and on
Spark by the exactly-once tests (``epoch.tasks=long-running`` rows)."""

from __future__ import annotations

import contextlib
import socket
import struct
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from stator import Pipeline
from stator.api.nodes import KeyedNode
from stator.config import SparkConfig
from stator.errors import ConfigError
from stator.longrun import driver as longrun_driver
from stator.longrun import task as longrun_task
from stator.longrun.driver import (
    LongRunningTasks,
    Run,
    RunFailed,
    Shape,
    session_config,
    source_locations,
)
from stator.longrun.messages import Launch
from stator.longrun.wire import TOKEN_BYTES, Channel, accept, connect, listen
from stator.sinks import CollectSink
from stator.sources import list_source
from stator.tasks.routing import epoch_producers


def chained(sink: CollectSink) -> Pipeline:
    """Two sources (2 splits and 1) into a keyed count, whose output feeds a second keyed
    operator."""
    p = Pipeline("chain", max_parallelism=8)
    a = p.source(list_source(list(range(10)), splits=2), uid="a")
    b = p.source(list_source(list(range(5))), uid="b")
    counts = a.union(b).key_by(lambda v: v % 3).count(uid="first")
    counts.key_by(lambda kv: kv[1]).count(uid="second").sink(sink, uid="out")
    return p


def _spec(p: Pipeline, tmp_path: Path, ranges: dict[str, int], checkpoint: bool) -> Any:
    from stator.epoch.spec import CheckpointTask, EpochSpec
    from stator.sources.base import SplitRange
    from stator.state.options import RocksDBOptions
    from stator.storage import open_store

    return EpochSpec(
        job="chain",
        epoch=1,
        base_epoch=0,
        processing_time_ms=0,
        pipeline=p,
        parallelism={"first": 3, "second": 2},
        max_parallelism=8,
        local_dir=str(tmp_path),
        rocksdb=RocksDBOptions(),
        warm_entries=0,
        ranges={uid: [SplitRange(str(i), 0, 0, i) for i in range(n)] for uid, n in ranges.items()},
        split_max_ts={},
        checkpoint=(
            CheckpointTask(1, open_store(f"file://{tmp_path}/ck"), True, {}) if checkpoint else None
        ),
    )


def test_every_keyed_subtask_expects_a_frame_from_each_producer_of_the_epoch(
    tmp_path: Path,
) -> None:
    p = chained(CollectSink())
    ids = {n.uid: n.id for n in p.nodes if isinstance(n, KeyedNode)}
    # a's two ranges and b's one feed "first"; "first"'s 3 subtasks feed "second".
    assert epoch_producers(_spec(p, tmp_path, {"a": 2, "b": 1}, False), p) == {
        ids["first"]: 3,
        ids["second"]: 3,
    }
    # A source with no range left still feeds its keyed operator (with nothing).
    assert epoch_producers(_spec(p, tmp_path, {"a": 0, "b": 1}, False), p) == {
        ids["first"]: 1,
        ids["second"]: 3,
    }
    # No source in the epoch: the keyed operators run only to take the checkpoint.
    assert epoch_producers(_spec(p, tmp_path, {}, False), p) == {}
    assert epoch_producers(_spec(p, tmp_path, {}, True), p) == {ids["first"]: 0, ids["second"]: 3}


def test_source_tasks_prefer_the_keyed_subtasks_executors_in_turn() -> None:
    """Every task of a placed run has a preference: one without would let Spark skip the
    locality wait for the whole run (its NO_PREF level), and a keyed subtask could start on
    another executor of its host."""
    keyed = ("executor_h_1", "executor_h_0", "executor_h_1", "h2")
    assert source_locations(5, keyed) == [
        "executor_h_0",
        "executor_h_1",
        "h2",
        "executor_h_0",
        "executor_h_1",
    ]
    assert source_locations(2, ("", "")) == ["", ""]  # nothing placed: Spark places
    assert source_locations(0, keyed) == []


def test_a_session_for_long_running_tasks_gets_a_slot_per_task() -> None:
    local = session_config(SparkConfig(master="local[2]"))
    assert local.master == f"local[{longrun_driver.LOCAL_SLOTS}]"
    assert local.conf["spark.default.parallelism"] == "2"
    cluster = session_config(SparkConfig(master="local-cluster[3,1,1024]"))
    assert cluster.master == f"local-cluster[3,{longrun_driver.EXECUTOR_SLOTS},1024]"
    assert cluster.conf["spark.default.parallelism"] == "3"
    pods = session_config(
        SparkConfig(
            master="kubernetes",
            conf={"spark.executor.cores": "2", "spark.executor.instances": "3"},
        )
    )
    assert pods.master == "kubernetes"
    assert pods.conf["spark.executor.cores"] == str(longrun_driver.EXECUTOR_SLOTS)
    assert pods.conf["spark.kubernetes.executor.request.cores"] == "2"  # the pod's CPU
    assert pods.conf["spark.default.parallelism"] == "6"


def test_a_connection_without_the_runs_token_is_closed_unread() -> None:
    token = b"t" * TOKEN_BYTES
    server = listen("127.0.0.1")
    address = server.getsockname()
    intruder = socket.create_connection(address)
    intruder.sendall(b"x" * TOKEN_BYTES + b"a pickle that must never be loaded")
    assert accept(server, token, 5.0) is None
    with contextlib.suppress(ConnectionResetError):  # closed with the rest unread
        assert intruder.recv(1) == b""  # closed
    good = connect(address, token, "server")
    channel = accept(server, token, 5.0)
    assert channel is not None
    good.send({"hello": 1})
    assert channel.recv() == {"hello": 1}
    good.sock.sendall(struct.pack(">I", (1 << 30) + 1))  # a frame over the limit
    with pytest.raises(ConnectionError, match="refused"):
        channel.recv()
    for c in (good, channel):
        c.close()
    server.close()


class HalfStarted:
    """Tasks of which only the first starts (too few task slots)."""

    def __init__(self) -> None:
        self.cancelled = False

    def start(self, launch: Launch, shape: Shape, run: Run) -> None:
        self.channel: Channel = connect(launch.driver, launch.token, "driver")
        from stator.longrun.messages import Hello

        self.channel.send(Hello(0, None))

    def cancel(self, run: Run) -> None:
        self.cancelled = True
        run.ended(None)


def test_a_run_whose_tasks_do_not_all_start_fails_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(longrun_driver, "LAUNCH_TIMEOUT_S", 1.0)
    tasks = HalfStarted()
    runner = LongRunningTasks(tasks, loopback=True, driver_host="127.0.0.1")
    spec = _spec(chained(CollectSink()), tmp_path, {"a": 2, "b": 1}, False)
    with pytest.raises(RunFailed, match=r"only 1 of 8 long-running tasks started within 1 s"):
        runner.run_epoch(spec, "epoch-1", "chain epoch 1", None)
    assert tasks.cancelled and runner.run is None


@pytest.mark.parametrize(("failures", "attempts"), [(0, 3), (2, 3), (3, 3), (1, 1), (1, 0)])
def test_a_source_range_is_read_with_sparks_attempts_and_the_last_reports(
    monkeypatch: pytest.MonkeyPatch, failures: int, attempts: int
) -> None:
    """A split that fails over on its own (``split_failover_attempts``): a long-running task
    tries its range as often as Spark would try the task, and only its last attempt may
    report the failure instead of raising (``tasks/source.py``); without split failover,
    one attempt, whose failure fails the epoch."""
    calls: list[bool | None] = []

    def flaky(*args: Any, last_attempt: bool | None = None) -> Any:
        calls.append(last_attempt)
        if len(calls) <= failures:
            if last_attempt:
                return iter(["reported"])
            raise ConnectionResetError("injected")
        return iter(["read"])

    monkeypatch.setattr(longrun_task, "source_task", flaky)
    spec = SimpleNamespace(split_failover_attempts=attempts)
    if failures and not attempts:
        with pytest.raises(ConnectionResetError):
            longrun_task._read(spec, 1, longrun_task.Reports(), 0)  # type: ignore[arg-type]
        assert calls == [False]  # no split failover: nothing to report
        return
    out = list(longrun_task._read(spec, 1, longrun_task.Reports(), 0))  # type: ignore[arg-type]
    tries = max(1, attempts)
    assert calls == [i == tries - 1 for i in range(min(failures + 1, tries))]
    assert out == (["reported"] if failures >= tries else ["read"])


def test_a_local_session_with_too_few_slots_is_refused_before_launching(
    tmp_path: Path,
) -> None:
    tasks = HalfStarted()
    runner = LongRunningTasks(tasks, loopback=True, driver_host="127.0.0.1")
    runner.slots = 2  # local[2], as a session built without session_config has
    spec = _spec(chained(CollectSink()), tmp_path, {"a": 2, "b": 1}, False)
    with pytest.raises(ConfigError, match=r"needs 8 task slots at once .* has 2: let the job"):
        runner.run_epoch(spec, "epoch-1", "chain epoch 1", None)
    assert runner.launched == 0 and runner.run is None and not tasks.cancelled
