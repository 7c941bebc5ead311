"""Failover regions (FLIP-1) on real Spark: two disconnected pipelines in one job, a failure
injected in one, the other measured while the first is down; savepoints, stop and rescale of a
two-region job; a region that fails for good ends the job. Output is checked per key: every
emitted running count is higher than the one before (nothing committed twice) and the last
equals the count of the input (nothing lost)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stator import EpochResult, Job, Pipeline
from stator.config import JobConfig
from stator.driver.job import region_view
from stator.errors import JobFailed
from stator.savepoint.metadata import METADATA_NAME, SavepointMetadata
from stator.sinks import CollectSink
from stator.storage import open_store
from tests.helpers import with_overrides
from tests.integration.region_jobs import (
    A_EVENTS,
    B_EVENTS,
    FailsAt,
    Timeline,
    assert_exact,
    two_regions,
)


@pytest.fixture
def region_config(job_config: JobConfig) -> JobConfig:
    return with_overrides(
        job_config,
        epoch={"max_records": 400},
        restart={"strategy": "fixed-delay", "attempts": 3, "delay_ms": 4000},
    )


def test_a_failure_in_one_region_restarts_only_that_region(
    spark: Any, region_config: JobConfig, tmp_path: Path
) -> None:
    # Region in-a fails at its 4th epoch: Spark's 4 task attempts fail, the region waits out
    # its restart delay (4 s), its retried epoch fails twice more and Spark's third attempt
    # succeeds. Region in-b runs on meanwhile.
    p, a_source, a_sink, b_sink = two_regions(
        tmp_path / "marks", 4000, 12_000, fail_at=700, times=6
    )
    job = Job(p, region_config, spark)
    assert job.regional
    timeline = Timeline()
    job.on_epoch(timeline)
    status = job.run()

    assert status.state == "FINISHED"
    a, b = job.regions["in-a"].status, job.regions["in-b"].status
    assert a.restarts == 1, a.last_error
    assert b.restarts == 0 and b.restores.local + b.restores.remote == 0, b
    failed_at = a_source.failures()[0]
    back_at = timeline.first_epoch_after("in-a", a_source.failures()[-1])
    assert back_at - failed_at >= 4.0, "in-a was down for its restart delay at least"
    b_commits = timeline.checkpoints_between("in-b", failed_at, back_at)
    assert b_commits >= 3, f"in-b committed {b_commits} checkpoints while in-a was down"
    assert_exact(a_sink.results, A_EVENTS, 4000, 2)
    assert_exact(b_sink.results, B_EVENTS, 12_000, 1)
    views = {v["id"]: v for v in job.region_views()}
    assert views["in-a"]["restarts"] == 1 and views["in-b"]["restarts"] == 0
    assert views["in-a"]["nodes"] == ["in-a", "count-a", "out-a"]


def test_with_failover_strategy_full_both_regions_restart(
    spark: Any, region_config: JobConfig, tmp_path: Path
) -> None:
    p, a_source, a_sink, b_sink = two_regions(
        tmp_path / "marks", 4000, 12_000, fail_at=700, times=6
    )
    job = Job(p, with_overrides(region_config, failover={"strategy": "full"}), spark)
    assert not job.regional
    timeline = Timeline()
    job.on_epoch(timeline)
    status = job.run()

    assert status.state == "FINISHED" and status.restarts == 1
    failed_at = a_source.failures()[0]
    back_at = timeline.first_epoch_after(None, a_source.failures()[-1])
    assert timeline.checkpoints_between(None, failed_at, back_at) == 0, "the whole job was down"
    assert_exact(a_sink.results, A_EVENTS, 4000, 2)
    assert_exact(b_sink.results, B_EVENTS, 12_000, 1)
    assert {v["id"] for v in job.region_views()} == {"in-a", "in-b"}


def test_a_region_that_fails_for_good_ends_the_job(
    spark: Any, region_config: JobConfig, tmp_path: Path
) -> None:
    p, _, _, _ = two_regions(tmp_path / "marks", 4000, 10**9, fail_at=700, times=10**6)
    cfg = with_overrides(region_config, restart={"strategy": "fixed-delay", "attempts": 1})
    job = Job(p, cfg, spark)
    with pytest.raises(JobFailed, match="region 'in-a' failed and the restart strategy"):
        job.run()
    assert job.status.state == "FAILED"
    assert job.regions["in-b"].status.state in ("RUNNING", "FINISHED")  # stopped, not failed
    assert job.status.last_error and job.status.last_error.startswith("region 'in-a': ")


def test_savepoint_stop_and_rescale_of_a_two_region_job(
    spark: Any, region_config: JobConfig, tmp_path: Path
) -> None:
    cfg = with_overrides(region_config, parallelism=2)
    p, _, a1, b1 = two_regions(tmp_path / "marks", 6000, 5000)
    job = Job(p, cfg, spark)
    assert job.regional
    plain: list[Any] = []

    def savepoints(result: EpochResult) -> None:
        if result.region == "in-a" and result.epoch == 2 and not result.savepoint:
            plain.append(job.request_savepoint())
        if result.region == "in-a" and result.epoch == 6 and not result.savepoint:
            job.request_savepoint(stop=True)

    job.on_epoch(savepoints)
    status = job.run()
    assert status.state == "STOPPED", status.last_error
    assert plain[0].status == "COMPLETED", plain[0].error
    for location in (plain[0].location, status.stopped_with_savepoint):
        store = open_store(location)
        meta = SavepointMetadata.from_json(store.get(METADATA_NAME))
        assert set(meta.region_epochs) == {"in-a", "in-b"}
        assert set(meta.operators) == {"count-a", "count-b"}
    assert job.regions["in-a"].status.epoch > plain[0].epoch, "the plain savepoint went on"

    # Rescale 2 -> 3 from the stop's savepoint: each region resumes at its own epoch.
    p2, _, a2, b2 = two_regions(tmp_path / "marks", 6000, 5000)
    cfg2 = with_overrides(cfg, parallelism=3, restore={"source": status.stopped_with_savepoint})
    job2 = Job(p2, cfg2, spark)
    job2.preflight()
    assert job2.run().state == "FINISHED"
    assert job2.parallelism.operators == {"count-a": 3, "count-b": 3}
    assert_exact(a1.results + a2.results, A_EVENTS, 6000, 2)
    assert_exact(b1.results + b2.results, B_EVENTS, 5000, 1)


def test_a_job_that_ran_as_one_driver_resumes_as_regions(
    spark: Any, region_config: JobConfig, tmp_path: Path
) -> None:
    full = with_overrides(region_config, failover={"strategy": "full"})
    p, _, a1, b1 = two_regions(tmp_path / "marks", 4000, 3000)
    first = Job(p, full, spark)
    first.on_epoch(lambda r: first.stop() if r.epoch == 3 else None)
    first.preflight()
    first.run()
    assert first.status.checkpoints >= 3

    p2, _, a2, b2 = two_regions(tmp_path / "marks", 4000, 3000)
    second = Job(p2, region_config, spark)
    assert second.regional
    plan = second.preflight()
    assert {rid: t.epoch for rid, t in plan.items() if t} == {"in-a": 3, "in-b": 3}
    assert second.run().state == "FINISHED"
    assert_exact(a1.results + a2.results, A_EVENTS, 4000, 2)
    assert_exact(b1.results + b2.results, B_EVENTS, 3000, 1)


def test_one_splits_failure_in_a_job_without_key_by_restarts_only_that_split(
    spark: Any, region_config: JobConfig, tmp_path: Path
) -> None:
    # Split gen-1 fails its first 6 reads of one range: Spark's attempts 1-3 fail, the 4th
    # reports the failure and gen-1 waits out its restart delay (4 s) while gen-0 and gen-2
    # go on committing; then its task fails twice more and Spark's third attempt succeeds.
    sink = CollectSink()
    source = FailsAt(
        A_EVENTS, count=9000, splits=3, marks=str(tmp_path / "marks"), at=700, times=6,
        split="gen-1",
    )  # fmt: skip
    p = Pipeline("parallel")
    p.source(source, uid="in").map(lambda e: (e[0], e[2])).sink(sink, uid="out")
    job = Job(p, region_config, spark)
    assert not job.regional and job.loops[0].split_failover is not None
    timeline = Timeline()
    job.on_epoch(timeline)
    status = job.run()

    assert status.state == "FINISHED" and status.restarts == 1, status.last_error
    marks = source.attempts()
    assert len(marks) == 7, "4 attempts, the delay, 2 more and the one that succeeded"
    reported, again = marks[3], marks[4]
    assert again - reported >= 4.0, "gen-1 waited out its restart delay"
    commits = timeline.checkpoints_between(None, reported, again)
    assert commits >= 3, f"{commits} checkpoints of gen-0 and gen-2 while gen-1 was down"
    (split,) = region_view(job.loops[0])["splits"]
    assert (split["split"], split["restarts"], split["state"]) == ("gen-1", 1, "RUNNING")
    assert "ConnectionResetError: input connection reset (injected)" in split["last_error"]
    expected = sorted((e[0], e[2]) for e in A_EVENTS.make(0, 9000, 1))
    assert sorted(sink.results) == expected, "every record committed once"


def test_a_split_that_keeps_failing_ends_the_job(
    spark: Any, region_config: JobConfig, tmp_path: Path
) -> None:
    source = FailsAt(
        A_EVENTS, count=9000, splits=3, marks=str(tmp_path / "marks"), at=700, times=10**6,
        split="gen-2",
    )  # fmt: skip
    p = Pipeline("parallel-fails")
    p.source(source, uid="in").sink(CollectSink(), uid="out")
    cfg = with_overrides(region_config, restart={"strategy": "fixed-delay", "attempts": 1})
    job = Job(p, cfg, spark)
    with pytest.raises(JobFailed, match="source 'in' split gen-2 failed and the restart strategy"):
        job.run()
    assert len(source.attempts()) == 8, "two epochs of 4 attempts each"


@pytest.mark.parametrize("format_type", ["canonical", "native"])
def test_regions_resume_from_a_newer_run_as_one_driver_not_their_own_older_checkpoints(
    spark: Any, region_config: JobConfig, tmp_path: Path, format_type: str
) -> None:
    """regions (own checkpoints) -> stop with a savepoint -> one driver (full) from it, which
    checkpoints at the job's root -> regions again from latest: each region must resume from
    the root's newer checkpoint, not from its own older one (that would commit again). A
    native savepoint's databases are at their own region's epoch: the job resumes after the
    highest, as from a canonical one."""
    cfg = with_overrides(
        region_config, savepoint={"dir": f"file://{tmp_path}/sp", "format_type": format_type}
    )
    p1, _, a1, b1 = two_regions(tmp_path / "marks", 6000, 5000)
    first = Job(p1, cfg, spark)
    assert first.regional
    first.on_epoch(
        lambda r: first.request_savepoint(stop=True) if (r.region, r.epoch) == ("in-a", 3) else None
    )
    stopped = first.run().stopped_with_savepoint
    assert stopped
    meta = SavepointMetadata.from_json(open_store(stopped).get(METADATA_NAME))
    assert meta.format_type == format_type, meta.region_epochs

    full = with_overrides(cfg, failover={"strategy": "full"}, restore={"source": stopped})
    p2, _, a2, b2 = two_regions(tmp_path / "marks", 6000, 5000)
    second = Job(p2, full, spark)
    assert not second.regional
    # Stop once two of its checkpoints completed (uploads are asynchronous: by epoch alone,
    # a fast run may stop with one complete and the next still uploading).
    second.on_epoch(
        lambda r: second.stop() if r.epoch >= 8 and second.status.checkpoints >= 2 else None
    )
    second.preflight()
    second.run()
    assert second.status.checkpoints >= 2

    p3, _, a3, b3 = two_regions(tmp_path / "marks", 6000, 5000)
    third = Job(p3, cfg, spark)
    plan = third.preflight()
    assert all(t is not None and "/regions/" not in t.store.uri for t in plan.values()), plan
    assert third.run().state == "FINISHED"
    assert_exact(a1.results + a2.results + a3.results, A_EVENTS, 6000, 2)
    assert_exact(b1.results + b2.results + b3.results, B_EVENTS, 5000, 1)
