"""State-aware placement on three real executor JVMs (``local-cluster[3,1,1024]``, no
Kubernetes): after the first epoch every keyed task runs on the executor that ran its subtask
before, and the output equals, epoch for epoch, a ``local[2]`` run of the same job (run in a
subprocess: one process has one SparkContext).

The three executors share this machine's disk, so a task that ran elsewhere would still find
its state; this test checks placement itself (the placement metric), not isolation."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stator import EpochResult, Job, Pipeline
from stator.cluster.jvm import ensure_jar, live_executors
from stator.config import SparkConfig
from stator.control.metrics import render_metrics
from stator.sinks import CollectSink
from stator.sources import GeneratorSource, KeyedEvents
from tests.helpers import SparkSessions, executor_process
from tests.integration.placement_job import (
    PARALLELISM,
    PER_EPOCH,
    RECORDS,
    as_json,
    job_config,
    pipeline,
    reference_run,
)


@pytest.fixture(scope="module")
def cluster(spark_sessions: SparkSessions) -> Iterator[Any]:
    started = time.monotonic()
    session = spark_sessions.get(SparkConfig(master="local-cluster[3,1,1024]"), "placement")
    print(f"local-cluster session in {time.monotonic() - started:.1f} s")
    yield session
    spark_sessions.stop()  # three executor JVMs: give their memory back


def test_the_jar_is_built_once_and_cached() -> None:
    jar = ensure_jar()
    assert jar.exists() and jar.stat().st_size > 0
    assert ensure_jar() == jar  # same sources and Spark: reused


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[], Any]]:
    """The local[2] run, started at once beside the cluster tests; its output on demand."""
    yield from reference_run(tmp_path_factory.mktemp("reference"))


def test_keyed_tasks_stay_on_their_executors(
    cluster: Any, reference: Callable[[], Any], tmp_path: Path
) -> None:
    sink = CollectSink()
    job = Job(pipeline(sink), job_config(tmp_path / "cluster"), cluster)
    per_epoch: list[tuple[int, int, int, float]] = []

    def record(result: EpochResult) -> None:
        last = job.status.last_placement
        assert last is not None
        per_epoch.append((result.epoch, last.local, last.total, result.duration_s))

    job.on_epoch(record)
    job.run()
    for epoch, local, total, duration in per_epoch:
        print(f"epoch {epoch}: {local}/{total} keyed tasks local, {duration:.1f} s")
    assert len(per_epoch) == RECORDS // PER_EPOCH >= 10
    assert all((local, total) == (PARALLELISM, PARALLELISM) for _, local, total, _ in per_epoch)
    assert job.status.restarts == 0
    assert job.placement is not None
    executors = {s["executor"] for s in job.placement.to_json()["count"]}
    print(f"subtasks ran on executors {sorted(executors)}")
    metrics = render_metrics(job)[0].decode()
    n = len(per_epoch)
    assert f'stator_keyed_tasks_total{{job="placed"}} {float(n * PARALLELISM)}' in metrics
    expected_local = float(n * PARALLELISM)
    assert f'stator_keyed_tasks_local_total{{job="placed"}} {expected_local}' in metrics

    assert as_json(sink) == reference()


def test_a_lost_executor_s_subtasks_move_without_waiting(
    cluster: Any, reference: Callable[[], Any], tmp_path: Path
) -> None:
    """Kill the executor of subtask 0 between epochs 4 and 5: epoch 5 runs that subtask on
    another executor at once (its preference is dropped, not waited out for 30 s), later
    epochs stay on their new executors, and the output is still exact. (All executors share
    this disk, so the moved subtask finds its state there: it counts as local. Restoring
    elsewhere is tested with executor pods on separate nodes, tests/e2e/test_executors.py.)"""
    sink = CollectSink()
    job = Job(pipeline(sink), job_config(tmp_path / "cluster"), cluster)
    sc = cluster.sparkContext
    per_epoch: dict[int, tuple[int, int, float]] = {}
    moved: list[int] = []  # subtasks that ran on the killed executor
    victims: list[str] = []

    def after(result: EpochResult) -> None:
        last = job.status.last_placement
        assert last is not None
        per_epoch[result.epoch] = (last.local, last.total, result.duration_s)
        if result.epoch == 4:
            assert job.placement is not None
            placed = job.placement.to_json()["count"]
            victim = placed[0]["executor"]
            victims.append(victim)
            moved.extend(p["subtask"] for p in placed if p["executor"] == victim)
            os.kill(executor_process(sc.applicationId, victim).pid, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while victim in live_executors(sc) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert victim not in live_executors(sc)

    job.on_epoch(after)
    job.run()
    for epoch, (local, total, duration) in sorted(per_epoch.items()):
        print(f"epoch {epoch}: {local}/{total} keyed tasks local, {duration:.1f} s")
    assert moved
    assert per_epoch[5][2] < 30  # spark.locality.wait.process was not waited out
    assert all(per_epoch[e][:2] == (PARALLELISM, PARALLELISM) for e in range(5, 13))
    assert job.placement is not None
    now = {p["subtask"]: p["executor"] for p in job.placement.to_json()["count"]}
    assert all(now[s] != victims[0] for s in moved)
    assert job.status.restarts == 0
    assert as_json(sink) == reference()


def test_a_new_driver_finds_the_local_copies_and_restores_from_them(
    cluster: Any, reference: Callable[[], Any], tmp_path: Path
) -> None:
    """The first driver stops after epoch 6 (its latest checkpoint is of epoch 4) and takes
    its memory of where subtasks ran with it. A new driver on the same executors surveys
    them before its first epoch: every keyed subtask restores from an executor's local copy
    (no byte of keyed state from the object store), and the output of both runs is the
    reference's, epoch for epoch."""
    cfg = job_config(tmp_path / "cluster")
    first_sink, second_sink = CollectSink(), CollectSink()
    first = Job(pipeline(first_sink), cfg, cluster)
    first.on_epoch(lambda result: first.stop() if result.epoch == 6 else None)
    first.run()
    assert first.status.last_checkpoint is not None
    assert first.status.last_checkpoint.epoch == 4

    second = Job(pipeline(second_sink), cfg, cluster)
    restored: list[tuple[int, int]] = []

    def first_epoch(result: EpochResult) -> None:
        if not restored:
            restored.append((second.status.restores.local, second.status.restores.remote))

    second.on_epoch(first_epoch)
    second.run()
    st = second.status
    assert restored == [(PARALLELISM, 0)], st.last_restores
    assert st.restores.remote_bytes == 0 and st.restores.local_bytes > 0
    assert st.last_placement is not None
    assert {r["source"] for r in st.last_restores.values()} == {"local"}
    # The second run commits epochs 1-4 again from the checkpoint, but a CollectSink's
    # payloads lived in the first driver's memory: those epochs are the first run's.
    assert sorted(first_sink.by_epoch) == [1, 2, 3, 4]
    merged = {**second_sink.by_epoch, **first_sink.by_epoch}
    assert json.loads(json.dumps({str(k): v for k, v in sorted(merged.items())})) == reference()


def test_a_lost_executor_names_the_regions_whose_state_it_held(
    cluster: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two failover regions: A's three subtasks spread over the three executors, B's one
    subtask on one of them. Killing an executor that held A's state but not B's is reported
    for region A alone, and both outputs are exact."""

    sinks = {"a": CollectSink(), "b": CollectSink()}
    p = Pipeline("placed-regions", max_parallelism=24)
    for name, p_op in (("a", None), ("b", 1)):
        (
            p.source(
                GeneratorSource(KeyedEvents(30, seed=len(name)), count=RECORDS, splits=2),
                uid=f"in-{name}",
            )
            .key_by(lambda e: e[0])
            .count(uid=f"count-{name}", parallelism=p_op)
            .sink(sinks[name], uid=f"out-{name}")
        )
    job = Job(p, job_config(tmp_path / "cluster"), cluster)
    assert job.regional
    sc = cluster.sparkContext
    victims: list[str] = []

    def after(result: EpochResult) -> None:
        a, b = job.regions["in-a"].placement, job.regions["in-b"].placement
        if result.region != "in-a" or result.epoch != 4 or a is None or b is None:
            return
        held_by_b = set(b.held_on())
        victim = next(e for e in sorted(a.held_on()) if e not in held_by_b)
        victims.append(victim)
        os.kill(executor_process(sc.applicationId, victim).pid, signal.SIGKILL)

    job.on_epoch(after)
    with caplog.at_level("WARNING", logger="stator.driver"):
        job.run()
    assert victims
    views = {v["id"]: v for v in job.region_views()}
    assert views["in-a"]["lost_executors"] == victims and views["in-b"]["lost_executors"] == []
    said = [r.getMessage() for r in caplog.records if "was lost holding" in r.getMessage()]
    assert len(said) == 1 and f"executor {victims[0]} " in said[0], said
    assert "region 'in-a': count-a[" in said[0] and "in-b" not in said[0]
    for name in ("a", "b"):
        totals: dict[str, list[int]] = {}
        for key, n in sinks[name].results:
            totals.setdefault(key, []).append(n)
        assert all(t == sorted(set(t)) for t in totals.values()), name
        expected: dict[str, int] = {}
        for e in KeyedEvents(30, seed=len(name)).make(0, RECORDS, 1):
            expected[e[0]] = expected.get(e[0], 0) + 1
        assert {k: t[-1] for k, t in totals.items()} == expected, name


@pytest.mark.parametrize("error", ["mismatch", "other"])
def test_a_task_that_cannot_have_its_state_fails_its_job_without_retries(
    cluster: Any, tmp_path: Path, error: str
) -> None:
    """A StateMismatchError means the job must rewind, and every attempt of the task fails
    the same way: the job fails at the first attempt (``FutileRetryListener``) with the
    task's error line, which the driver classifies as a failure to retry the job from its
    checkpoint. Any other error still gets Spark's attempts (4)."""
    from py4j.protocol import Py4JJavaError

    from stator.cluster.jvm import fail_futile_retries, load_helper
    from stator.driver.failures import Kind, classify

    sc = cluster.sparkContext
    assert load_helper(sc)
    fail_futile_retries(sc)
    fail_futile_retries(sc)  # once per SparkContext: a second call adds no second listener
    marks_dir = str(tmp_path)

    def task(index: int, rows: Any) -> Any:  # by value: executors cannot import tests/
        """Raises on every attempt; a retry first waits 2 s (time to be cancelled), then
        leaves its mark."""
        from pyspark import TaskContext

        from stator.errors import StateMismatchError

        attempt = TaskContext.get().attemptNumber()
        if attempt:
            time.sleep(2)
        Path(marks_dir, f"attempt-{attempt}").touch()
        if error == "mismatch":
            raise StateMismatchError(f"operator 'count' subtask {index}: the job must rewind")
        raise RuntimeError(f"subtask {index}: a failure a retry may not see again")

    started = time.monotonic()
    with pytest.raises(Py4JJavaError) as failed:
        sc.parallelize([1], 1).mapPartitionsWithIndex(task).collect()
    took = time.monotonic() - started
    marks = sorted(p.name for p in tmp_path.iterdir())
    failure = classify(failed.value, None, None)
    print(f"{error}: attempts {marks} in {took:.1f} s; {failure.summary[:160]}")
    assert failure.kind is Kind.RETRY
    if error == "mismatch":
        assert marks == ["attempt-0"]
        assert failure.summary.startswith("StateMismatchError: operator 'count' subtask 0: ")
        assert "cannot succeed" in str(failed.value)
    else:
        assert marks == [f"attempt-{n}" for n in range(4)]
        assert "cannot succeed" not in str(failed.value)


def test_a_first_attempt_sent_to_a_gone_executor_knows_it(cluster: Any) -> None:
    """The JVM RDD tells a first attempt that runs away from the executor the driver sent it
    to whether that executor is gone (lost after the epoch was planned): such a task refuses
    to read its state from the object store, as a retry does. A task that runs where it was
    sent, or was sent anywhere, is not told so."""
    from stator.cluster.jvm import load_helper, prefer_locations

    sc = cluster.sparkContext
    assert load_helper(sc)
    live = live_executors(sc)
    executor, host = sorted(live.items())[0]
    gone = str(max(int(e) for e in live) + 100)  # never registered
    locations = [f"executor_{host}_{executor}", f"executor_{host}_{gone}", ""]
    rdd = prefer_locations(sc, sc.parallelize(range(3), 3), locations)

    def probe(index: int, rows: Any) -> Any:
        from stator.cluster.jvm import task_is_retry, task_location, task_sent_to_gone

        yield index, task_location()[0], task_sent_to_gone(), task_is_retry()

    got = sorted(rdd.mapPartitionsWithIndex(probe).collect())
    print(got)
    assert got[0] == (0, executor, False, False)
    assert got[1][0] == 1 and got[1][1] in live and got[1][2:] == (True, False)
    assert got[2][0] == 2 and got[2][2:] == (False, False)


def test_executors_that_are_not_pods_are_not_watched(cluster: Any) -> None:
    """The driver's pod watch (``stator.jvm.LostPodWatcher``) starts only where executors are
    Kubernetes pods (tests/e2e/test_executors.py shows what it does there); elsewhere it
    declines, and jobs run as before."""
    from stator.cluster.jvm import load_helper, watch_lost_pods

    sc = cluster.sparkContext
    assert load_helper(sc)
    assert watch_lost_pods(sc) is False
    assert sc.parallelize(range(4), 2).sum() == 6
