"""Failover regions without Spark: how a graph splits, what each region restores from a
snapshot of the whole job, how a savepoint's parts merge, which checkpoints ``latest`` resumes
from when the layout changed (``driver/layout.py``), and the job's state out of its regions'."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from stator import Job, JobState, Pipeline
from stator.checkpoint.metadata import (
    CheckpointMetadata,
    OperatorSnapshot,
    PendingCommit,
    metadata_key,
)
from stator.driver.savepoints import merge_parts
from stator.errors import ConfigError
from stator.lineage import Target
from stator.savepoint.metadata import OperatorSavepoint, SavepointMetadata
from stator.sinks import CollectSink
from stator.sources.generator import list_source
from stator.storage import open_store
from tests.unit.two_regions import config, two_parts


def test_split_renumbers_each_region_and_names_it_by_its_smallest_source_uid() -> None:
    p = two_parts()
    regions = p.split()
    assert [r.id for r in regions] == ["a-in", "b-in"]
    a, b = (r.pipeline for r in regions)
    assert [(n.id, n.inputs, n.name) for n in a.nodes] == [
        (0, [], "source:a-in"),
        (1, [0], "reduce:a-count"),
        (2, [1], "sink:a-out"),
    ]
    assert [(n.id, n.inputs) for n in b.nodes] == [(0, []), (1, [0]), (2, [1])]
    assert regions[0].uids() == {"a-in", "a-count", "a-out"}
    for r in regions:
        r.pipeline.validate()
        assert r.pipeline.name == "two"
    assert p.regions() == [["b-in", "map", "b-out"], ["a-in", "a-count", "a-out"]]


def test_sources_joined_by_a_keyed_operator_are_one_region() -> None:
    p = Pipeline("joined")
    left = p.source(list_source([1]), uid="left").key_by(lambda r: r).count(uid="c")
    left.sink(CollectSink(), uid="out")
    right = p.source(list_source([2]), uid="right")
    c = next(n for n in p.nodes if getattr(n, "uid", None) == "c")
    c.inputs.append(right.node.id)
    assert [r.id for r in p.split()] == ["left"]


def test_a_job_runs_one_loop_for_one_region_or_full(tmp_path: Path) -> None:
    regional = Job(two_parts(), config(tmp_path))
    assert regional.regional and [loop.region for loop in regional.loops] == ["a-in", "b-in"]
    full = Job(two_parts(), config(tmp_path, "failover.strategy=full"))
    assert not full.regional and [loop.region for loop in full.loops] == [None]
    assert [v["id"] for v in full.region_views()] == ["a-in", "b-in"]
    one = Pipeline("one")
    one.source(list_source([1]), uid="in").sink(CollectSink(), uid="out")
    assert [loop.region for loop in Job(one, config(tmp_path)).loops] == [None]
    with pytest.raises(ConfigError, match=r"failover\.strategy"):
        config(tmp_path, "failover.strategy=regional")


def test_a_job_s_lag_is_as_old_as_its_oldest_region_s(tmp_path: Path) -> None:
    """Regions plan their epochs apart: the job's lag, summed over them, was measured by
    the time of the oldest region's planning (the autoscaler times its samples by it)."""
    job = Job(two_parts(), config(tmp_path))
    a, b = (loop.status for loop in job.loops)
    assert job.status.source_lag_ms is None  # before any planning
    a.source_lag_ms = 5_000
    assert job.status.source_lag_ms == 5_000
    b.source_lag_ms = 3_000
    assert job.status.source_lag_ms == 3_000


def checkpoint(
    cid: int, created_ms: int, sources: tuple[str, ...] = ("a-in", "b-in")
) -> CheckpointMetadata:
    """A checkpoint of job "two" holding the positions of ``sources`` (the job's root holds
    both; a region's directory its own)."""
    return CheckpointMetadata(
        cid,
        cid * 10,
        "two",
        created_ms,
        128,
        True,
        {"a-count": OperatorSnapshot("a-count", 1, ())},
        {s: {"gen-0": {"p": 1}} for s in sources},
        {"a-out": (PendingCommit(3, ("x",)),), "b-out": (PendingCommit(3, ("y",)),)},
        0,
    )


def savepoint(epoch: int, uid: str, source: str) -> SavepointMetadata:
    op = OperatorSavepoint(uid, 2, {}, {0: {"file": f"{uid}/kg-0", "bytes": 3, "entries": 1}}, 5)
    return SavepointMetadata("two", epoch, 1, 128, {uid: op}, {source: {}}, 5, "zlib")


def test_a_region_restores_its_own_part_of_a_snapshot(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/x")
    part = Target(checkpoint(1, 5), store).part_for("b-in", {"b-in", "b-out"})
    assert isinstance(part.meta, CheckpointMetadata)
    assert part.meta.operators == {} and set(part.meta.sources) == {"b-in"}
    assert set(part.meta.sinks) == {"b-out"} and part.epoch == 10

    merged = merge_parts(
        "two",
        {"a-in": savepoint(7, "a-count", "a-in"), "b-in": savepoint(4, "b-count", "b-in")},
        0.0,
    )
    assert merged.epoch == 7 and merged.region_epochs == {"a-in": 7, "b-in": 4}
    assert set(merged.operators) == {"a-count", "b-count"} and merged.state_bytes == 6
    again = SavepointMetadata.from_json(merged.to_json())
    assert again == replace(merged)
    b = Target(again, store).part_for("b-in", {"b-in", "b-count"})
    assert b.epoch == 4 and set(b.meta.operators) == {"b-count"}
    assert set(b.meta.sources) == {"b-in"}
    # The two became one region (named a-in): it resumes after the higher of their epochs,
    # never writing an epoch number one of them already used.
    merged_region = Target(again, store).part_for("a-in", {"a-in", "a-count", "b-in", "b-count"})
    assert merged_region.epoch == 7
    b_alone = Target(again, store).part_for("b2", {"b-in", "b-count"})
    assert b_alone.epoch == 4, "a region by another name still finds its uids' epoch"


def write(root: Path, where: str, meta: CheckpointMetadata) -> None:
    open_store(f"file://{root}/ck/two/{where}".rstrip("/")).put(
        metadata_key(meta.checkpoint_id), meta.to_json()
    )


def test_latest_resumes_each_region_from_the_newer_of_its_own_and_the_jobs(
    tmp_path: Path,
) -> None:
    write(tmp_path, "", checkpoint(4, 2000))  # the job ran as one driver last
    write(tmp_path, "regions/a-in", checkpoint(2, 1000, ("a-in",)))  # ... after running as regions
    job = Job(two_parts(), config(tmp_path))
    plan = job.check_restore_source()
    for rid in ("a-in", "b-in"):
        target = plan[rid]
        assert target is not None and target.store.uri.endswith("/ck/two")
        assert target.meta.checkpoint_id == 4  # type: ignore[union-attr]
    assert set(plan["b-in"].meta.sources) == {"b-in"}  # type: ignore[union-attr]

    write(tmp_path, "regions/a-in", checkpoint(3, 3000, ("a-in",)))
    plan = job.check_restore_source()
    assert plan["a-in"] and plan["a-in"].store.uri.endswith("/regions/a-in")
    assert plan["b-in"] and plan["b-in"].store.uri.endswith("/ck/two")


def test_one_driver_refuses_regions_newer_than_its_own_checkpoints(tmp_path: Path) -> None:
    write(tmp_path, "", checkpoint(4, 2000))
    write(tmp_path, "regions/a-in", checkpoint(2, 3000, ("a-in",)))
    full = Job(two_parts(), config(tmp_path, "failover.strategy=full"))
    with pytest.raises(ConfigError, match=r"regions/a-in holds checkpoint 2 .*failover.strategy"):
        full.check_restore_source()
    with pytest.raises(ConfigError, match=r"restore\.source=none but"):
        Job(two_parts(), config(tmp_path, "restore.source=none")).check_restore_source()
    fresh = config(tmp_path, "restore.source=none", "restore.force_empty=true")
    assert Job(two_parts(), fresh).check_restore_source() in (
        {},
        {"a-in": None, "b-in": None},
    )
    write(tmp_path, "", checkpoint(5, 4000))
    assert full.check_restore_source()[None] is not None  # the root is newer again


def test_a_job_started_empty_on_purpose_never_rewinds_to_the_old_lineage(tmp_path: Path) -> None:
    # restore.force_empty starts a new lineage beside the job's checkpoints: a failure before
    # its own first checkpoint goes back to empty state, not to the old run's checkpoint 4.
    write(tmp_path, "", checkpoint(4, 2000))
    cfg = config(
        tmp_path,
        "failover.strategy=full",
        "restore.source=none",
        "restore.force_empty=true",
        "restart.delay_ms=0",
    )
    (job,) = Job(two_parts(), cfg).loops
    assert job.region is None
    job.recovery.start(None)
    assert job.recovery.position.target is None
    assert [m.checkpoint_id for m in job.coordinator.completed] == [4]  # kept beside, unused
    job.recovery.failover(RuntimeError("an executor was lost"))
    assert job.recovery.position.target is None
    assert job.recovery.position.epoch == 0


def test_latest_is_refused_when_the_regions_changed(tmp_path: Path) -> None:
    # The graph was one region "a-in" that read both sources; now they are two regions.
    write(tmp_path, "regions/a-in", checkpoint(2, 3000, ("a-in", "b-in")))
    allow = config(tmp_path, "restore.allow_non_restored_state=true")
    for cfg in (config(tmp_path), allow):  # no flag makes a source start over
        with pytest.raises(ConfigError, match=r"source 'b-in' was in failover region 'a-in'"):
            Job(two_parts(), cfg).check_restore_source()


def test_checkpoints_of_a_region_the_pipeline_lost_are_not_left_behind_silently(
    tmp_path: Path,
) -> None:
    write(tmp_path, "regions/gone", checkpoint(2, 3000, ("gone",)))
    job = Job(two_parts(), config(tmp_path))
    with pytest.raises(ConfigError, match=r"region 'gone', whose sources \(gone\) this pipeline"):
        job.check_restore_source()
    allow = config(tmp_path, "restore.allow_non_restored_state=true")
    assert Job(two_parts(), allow).check_restore_source() == {
        "a-in": None,
        "b-in": None,
    }


def test_an_explicit_checkpoint_of_one_region_does_not_restore_the_others(
    tmp_path: Path,
) -> None:
    write(tmp_path, "regions/a-in", checkpoint(2, 3000, ("a-in",)))
    uri = f"file://{tmp_path}/ck/two/regions/a-in/chk-0000000002"
    for strategy in ("region", "full"):
        cfg = config(tmp_path, f"restore.source={uri}", f"failover.strategy={strategy}")
        with pytest.raises(ConfigError, match=r"holds no position of source\(s\) \['b-in'\]"):
            Job(two_parts(), cfg).check_restore_source()


@pytest.mark.parametrize(
    ("states", "job_state"),
    [
        ((JobState.RUNNING, JobState.RUNNING), JobState.RUNNING),
        ((JobState.FINISHED, JobState.RUNNING), JobState.RUNNING),
        ((JobState.RECOVERING, JobState.RUNNING), JobState.RECOVERING),
        ((JobState.FINISHED, JobState.FINISHED), JobState.FINISHED),
        ((JobState.STOPPED, JobState.STOPPED), JobState.STOPPED),
        ((JobState.STOPPED, JobState.FINISHED), JobState.STOPPED),
        ((JobState.STOPPED, JobState.RUNNING), JobState.RUNNING),
    ],
)
def test_the_jobs_state_out_of_its_regions(
    tmp_path: Path, states: tuple[JobState, JobState], job_state: JobState
) -> None:
    job: Any = Job(two_parts(), config(tmp_path))
    for d, s in zip(job.loops, states, strict=True):
        d.status.state = s
        d.status.records_in = 5
    st = job.status
    assert st.state == job_state and st.records_in == 10


def test_a_lost_executor_names_the_regions_whose_local_state_it_held() -> None:
    from stator.driver.regions import lost_state
    from stator.epoch.reports import StateReport
    from stator.locality.placement import PlacementTracker

    def ran(tracker: PlacementTracker, uid: str, subtask: int, executor: str) -> None:
        state = StateReport(uid, subtask, 1, 0, 0, 0, executor=executor, host="h")
        tracker.record([state], {uid: 2})

    a, b = PlacementTracker(), PlacementTracker()
    ran(a, "count-a", 0, "1")
    ran(a, "count-a", 1, "2")
    ran(b, "count-b", 0, "2")
    ran(b, "count-b", 1, "3")
    assert a.held_on() == {"1": ["count-a[0]"], "2": ["count-a[1]"]}
    assert lost_state({"in-a": a, "in-b": b}, {"1", "3"}) == {
        "2": {"in-a": ["count-a[1]"], "in-b": ["count-b[0]"]}
    }
    assert lost_state({"in-a": a, "in-b": b}, {"2", "3"}) == {"1": {"in-a": ["count-a[0]"]}}
    # Executor 1 dies and count-a[0] has already run its next epoch on executor 3 when the
    # job looks: what moved off executor 1 since the last look still names region in-a.
    ran(a, "count-a", 0, "3")
    left = {"in-a": a.take_left(), "in-b": b.take_left()}
    assert left == {"in-a": {"1": ["count-a[0]"]}, "in-b": {}}
    assert lost_state({"in-a": a, "in-b": b}, {"2", "3"}) == {}
    assert lost_state({"in-a": a, "in-b": b}, {"2", "3"}, left) == {"1": {"in-a": ["count-a[0]"]}}
    assert a.take_left() == {}  # taken once
