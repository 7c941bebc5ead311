"""A job of two failover regions without Spark, shared by the region and control-API tests:
``b-in`` (stateless) and ``a-in`` (keyed), with file-system checkpoints under a test's path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stator import Pipeline
from stator.checkpoint.metadata import CheckpointMetadata
from stator.config import JobConfig, load_config
from stator.driver.job import Job
from stator.driver.status import JobState
from stator.epoch.reports import StandbyTally
from stator.locality.placement import EpochPlacement
from stator.sinks import CollectSink
from stator.sources.generator import list_source


def two_parts(name: str = "two") -> Pipeline:
    """Two failover regions: ``b-in`` (stateless) and ``a-in`` (keyed)."""
    p = Pipeline(name)
    p.source(list_source([1, 2]), uid="b-in").map(str).sink(CollectSink(), uid="b-out")
    (
        p.source(list_source([1, 2]), uid="a-in")
        .key_by(lambda r: r)
        .count(uid="a-count")
        .sink(CollectSink(), uid="a-out")
    )
    return p


def config(tmp_path: Path, *more: str) -> JobConfig:
    """Checkpoints, local state and savepoints under ``tmp_path``; ``more``: key=value."""
    return load_config(
        None,
        [
            f"checkpoint.storage=file://{tmp_path}/ck",
            f"state.local_dir={tmp_path}/state",
            f"savepoint.dir=file://{tmp_path}/sp",
            *more,
        ],
    )


class Placed:
    """A placement tracker's answer: two subtasks of ``a-count``, one with a standby copy."""

    def to_json(self) -> dict[str, list[dict[str, Any]]]:
        where = {"parallelism": 2, "executor": "1", "host": "10.0.0.1", "node": "n1"}
        return {
            "a-count": [
                {**where, "subtask": 0, "standby": {"executor": "2", "node": "n2"}},
                {**where, "subtask": 1},
            ]
        }


def running_job(tmp_path: Path) -> Job:
    """A job of one region (no Spark) whose status has every part the API shows."""
    job = Job(two_parts(), config(tmp_path, "failover.strategy=full"))
    assert not job.regional
    st = job.status
    st.state, st.epoch, st.records_in, st.checkpoints = JobState.RUNNING, 7, 100, 2
    st.last_checkpoint = CheckpointMetadata(
        checkpoint_id=2,
        epoch=6,
        job="two",
        created_ms=1_700_000_000_000,
        max_parallelism=128,
        incremental=True,
        operators={},
        sources={},
        sinks={},
        watermark=0,
        duration_ms=12,
    )
    job.history.completed(st.last_checkpoint)
    job.history.failed(3, 7, "disk full")
    st.last_restores[("a-count", 0)] = {
        "operator": "a-count",
        "subtask": 0,
        "epoch": 5,
        "checkpoint_id": 1,
        "savepoint": False,
        "source": "local",
        "local_bytes": 10,
        "remote_bytes": 0,
        "duration_ms": 3,
        "fallback": None,
        "executor": "1",
        "host": "10.0.0.1",
        "node": "n1",
    }
    st.restores.add("local", 10, 0)
    st.last_placement = EpochPlacement(local=1, total=2)
    st.keyed_tasks_local, st.keyed_tasks_total = 1, 2
    st.standby_copies.note(StandbyTally("u1", copies=1, bytes=50))
    st.startup.driver_started_ms = 1_700_000_000_000
    job.placement = Placed()  # type: ignore[assignment]
    return job
