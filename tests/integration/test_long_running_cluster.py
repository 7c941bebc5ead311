"""Long-running tasks (``epoch.tasks: long-running``) on three real executor JVMs
(``local-cluster``, with the task slots ``longrun.driver.session_config`` gives them): keyed
subtasks stay on their executors across epochs, the data plane crosses processes, and a lost
executor fails the run over to its checkpoint; the output equals, epoch for epoch, a
``local[2]`` run of the same job with a Spark job per epoch (``placement_job.py``)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stator import EpochResult, Job
from stator.cluster.jvm import live_executors
from stator.config import SparkConfig, load_config
from stator.longrun.driver import session_config
from stator.sinks import CollectSink
from tests.helpers import SparkSessions, executor_process
from tests.integration.placement_job import (
    PER_EPOCH,
    RECORDS,
    as_json,
    pipeline,
    reference_run,
)
from tests.integration.placement_job import job_config as placement_config
from tests.integration.region_jobs import A_EVENTS, B_EVENTS, assert_exact, two_regions


@pytest.fixture(scope="module")
def cluster(spark_sessions: SparkSessions) -> Iterator[Any]:
    cfg = session_config(SparkConfig(master="local-cluster[3,1,1024]"))
    assert cfg.master == "local-cluster[3,64,1024]"
    yield spark_sessions.get(cfg, "long-running")
    spark_sessions.stop()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[], Any]]:
    yield from reference_run(tmp_path_factory.mktemp("reference"))


def job_config(root: Path) -> Any:
    return placement_config(root, "epoch.tasks=long-running", "restart.delay_ms=0")


def test_subtasks_stay_on_their_executors_across_epochs_of_one_run(
    cluster: Any,
    reference: Callable[[], Any],
    tmp_path: Path,
) -> None:
    sink = CollectSink()
    job = Job(pipeline(sink), job_config(tmp_path), cluster)
    placed: list[dict[int, str]] = []

    def record(result: EpochResult) -> None:
        assert job.placement is not None
        placed.append({p["subtask"]: p["executor"] for p in job.placement.to_json()["count"]})

    job.on_epoch(record)
    job.run()
    assert len(placed) == RECORDS // PER_EPOCH
    assert all(p == placed[0] for p in placed), "a subtask moved"
    assert len(set(placed[0].values())) == 3, "keyed subtasks were not spread"
    (loop,) = job.loops
    assert loop.long_running is not None and loop.long_running.run is None  # stopped
    # The first run spreads the subtasks (no state yet); once their state is there, a second run
    # places them there (and names the executors that hold it) for the rest of the job.
    assert loop.long_running.launched == 2
    assert job.status.restarts == 0
    assert as_json(sink) == reference()


def test_a_lost_executor_ends_the_run_and_the_output_stays_exact(
    cluster: Any,
    reference: Callable[[], Any],
    tmp_path: Path,
) -> None:
    """Kill the executor of subtask 0 after epoch 5 (checkpoint of epoch 4): its tasks and
    connections go with it. Epoch 6 either finds the run's tasks gone (the run fails, the
    job rewinds to epoch 4) or, if Spark already removed the executor, a new placement (the
    run is stopped); either way a new run places the subtasks on the executors left."""
    sink = CollectSink()
    job = Job(pipeline(sink), job_config(tmp_path), cluster)
    sc = cluster.sparkContext
    victims: list[str] = []

    def after(result: EpochResult) -> None:
        if result.epoch == 5 and not victims:
            assert job.placement is not None
            victim = job.placement.to_json()["count"][0]["executor"]
            victims.append(victim)
            os.kill(executor_process(sc.applicationId, victim).pid, signal.SIGKILL)

    job.on_epoch(after)
    started = time.monotonic()
    job.run()
    (loop,) = job.loops
    assert loop.long_running is not None
    print(
        f"{time.monotonic() - started:.1f} s, restarts {job.status.restarts}, runs "
        f"{loop.long_running.launched}"
    )
    assert victims
    assert loop.long_running.launched >= 2
    assert victims[0] not in live_executors(sc)
    assert job.placement is not None
    now = {p["executor"] for p in job.placement.to_json()["count"]}
    assert victims[0] not in now
    assert as_json(sink) == reference()


def test_a_failed_run_in_one_region_restarts_only_that_region(cluster: Any, tmp_path: Path) -> None:
    """Two regions, a run of long-running tasks each: region in-a's source fails once (its
    task fails the run: no retry of one task), in-a fails over and relaunches; in-b's run
    goes on. Every count exact, nothing committed twice."""
    p, a_source, a_sink, b_sink = two_regions(tmp_path / "marks", 3000, 6000, fail_at=700, times=1)
    cfg = load_config(
        None,
        [
            f"checkpoint.storage=file://{tmp_path}/ck",
            f"state.local_dir={tmp_path}/state",
            "epoch.max_records=400",
            "epoch.tasks=long-running",
            "restart.strategy=fixed-delay",
            "restart.attempts=3",
            "restart.delay_ms=500",
        ],
    )
    # The failing source's class is in tests/: executors import it from this checkout.
    job = Job(p, cfg, cluster, python_path=[str(Path(__file__).parents[2])])
    assert job.regional
    status = job.run()
    assert status.state == "FINISHED"
    a, b = job.regions["in-a"].status, job.regions["in-b"].status
    assert len(a_source.failures()) == 1
    assert a.restarts == 1, a.last_error
    assert "input connection reset" in str(a.last_error), a.last_error
    assert b.restarts == 0, b.last_error
    launched = {loop.region: loop.long_running.launched for loop in job.loops if loop.long_running}
    assert launched["in-a"] > launched["in-b"], launched
    assert_exact(a_sink.results, A_EVENTS, 3000, 2)
    assert_exact(b_sink.results, B_EVENTS, 6000, 1)
