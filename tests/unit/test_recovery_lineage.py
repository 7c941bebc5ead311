"""Which checkpoint a failing job rewinds to, without Spark: never one of another lineage
(checkpoints kept beside a job that started from a savepoint, empty, or from an older
checkpoint of its own), and never its initial source once it has checkpointed (that would
replay output its checkpoints committed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stator import Job, Pipeline
from stator.checkpoint.metadata import CheckpointMetadata, OperatorSnapshot, metadata_key
from stator.config import load_config
from stator.driver.epoch_loop import RegionLoop
from stator.errors import JobFailed, StatorError
from stator.locality.restore import RESTORE_ERROR_MARKER
from stator.sinks import CollectSink
from stator.sources.generator import list_source
from stator.storage import open_store


def pipeline() -> Pipeline:
    p = Pipeline("job")
    p.source(list_source([1, 2]), uid="in").key_by(lambda r: r).count(uid="count").sink(
        CollectSink(), uid="out"
    )
    return p


def write_checkpoint(root: Path, cid: int, lineage: str = "") -> None:
    meta = CheckpointMetadata(
        cid,
        cid * 10,
        "job",
        cid * 1000,
        128,
        True,
        {"count": OperatorSnapshot("count", 1, ())},
        {"in": {"split-0": {"position": cid, "max_timestamp": 0, "finished": False}}},
        {},
        0,
        lineage=lineage,
    )
    open_store(f"file://{root}/ck/job").put(metadata_key(cid), meta.to_json())


def driver(root: Path, *more: str) -> RegionLoop:
    """The one region loop of the job (its recovery and coordinator are what these test)."""
    (loop,) = whole_job(root, *more).loops
    return loop


def whole_job(root: Path, *more: str) -> Job:
    cfg = load_config(
        None,
        [
            f"checkpoint.storage=file://{root}/ck",
            f"state.local_dir={root}/state",
            "restart.delay_ms=0",
            "restart.attempts=10",
            *more,
        ],
    )
    return Job(pipeline(), cfg, None)


def unrestorable(cid: int) -> RuntimeError:
    """What a task reports when a checkpoint's files are missing."""
    return RuntimeError(f"{RESTORE_ERROR_MARKER}[{cid}]: operator 'count' subtask 0: gone")


def test_a_job_whose_every_checkpoint_fails_to_restore_fails_instead_of_starting_over(
    tmp_path: Path,
) -> None:
    for cid in (4, 5):
        write_checkpoint(tmp_path, cid)
    job = driver(tmp_path)
    job.recovery.start(None)
    assert job.recovery.position.epoch == 50
    job.recovery.failover(unrestorable(5))  # falls back to checkpoint 4: same lineage
    assert job.recovery.position.epoch == 40
    with pytest.raises(JobFailed, match="no retained checkpoint can be restored"):
        job.recovery.failover(unrestorable(4))
    assert job.recovery.position.epoch == 40, "not rewound to empty state"


def test_a_job_restored_from_an_older_checkpoint_of_its_own_never_rewinds_past_it(
    tmp_path: Path,
) -> None:
    # Rolled back to checkpoint 3 on purpose: 4 and 5 are another lineage from now on.
    for cid in (3, 4, 5):
        write_checkpoint(tmp_path, cid)
    job = driver(tmp_path, f"restore.source=file://{tmp_path}/ck/job/chk-0000000003")
    job.recovery.start(None)
    assert job.recovery.position.epoch == 30
    job.recovery.failover(RuntimeError("an executor was lost"))
    assert job.recovery.position.epoch == 30, "not checkpoint 5 of the abandoned lineage"
    assert job.coordinator.latest is not None and job.coordinator.latest.checkpoint_id == 3
    # A new checkpoint subsumes the abandoned lineage's first, not the one the job runs on.
    write_checkpoint(tmp_path, 6)
    job.coordinator.complete(
        CheckpointMetadata.from_json(open_store(f"file://{tmp_path}/ck/job").get(metadata_key(6)))
    )
    job.coordinator.subsume()
    assert [m.checkpoint_id for m in job.coordinator.completed] == [3, 5, 6]


def test_a_restarted_run_resumes_its_own_checkpoints_whatever_it_started_from(
    tmp_path: Path,
) -> None:
    # Run "b" started empty beside run "a"'s checkpoint 4 (a stateless upgrade) and took
    # checkpoint 5; its driver died. Restarted with the same arguments, it resumes 5: not
    # empty state again (its source), not "a"'s checkpoint.
    write_checkpoint(tmp_path, 4, lineage="a")
    fresh = ("restore.source=none", "restore.force_empty=true")
    job = driver(tmp_path, *fresh, "restore.lineage=b")
    job.recovery.start(None)
    assert job.recovery.position.target is None and job.recovery.lineage == "b"
    write_checkpoint(tmp_path, 5, lineage="b")
    again = driver(tmp_path, *fresh, "restore.lineage=b")
    again.recovery.start(None)
    assert again.recovery.position.epoch == 50
    assert again.coordinator.stale == {4}
    with pytest.raises(JobFailed):  # and never falls back to "a"'s 4, nor to empty state
        again.recovery.failover(unrestorable(5))
    # Without checkpoints of its own a run starts from its source: "c" starts empty.
    other = driver(tmp_path, *fresh, "restore.lineage=c")
    other.recovery.start(None)
    assert other.recovery.position.target is None


def test_a_run_that_continues_a_checkpoint_records_its_lineage(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, 4, lineage="a")
    job = driver(tmp_path)  # latest, no name given: it continues "a"
    job.recovery.start(None)
    assert job.recovery.lineage == "a"
    named = driver(tmp_path, "restore.lineage=d")  # latest, named by its starter
    named.recovery.start(None)
    assert named.recovery.position.epoch == 40 and named.recovery.lineage == "d"


def test_a_run_resumes_its_checkpoints_when_its_starting_point_is_gone(tmp_path: Path) -> None:
    # Restarted with the arguments it began with: the savepoint it began from was disposed
    # since (or its bucket is unreachable); it does not need it.
    write_checkpoint(tmp_path, 5, lineage="b")
    gone = f"file://{tmp_path}/sp/savepoint-disposed"
    whole = whole_job(tmp_path, f"restore.source={gone}", "restore.lineage=b")
    assert whole.check_restore_source() == {None: None}
    (job,) = whole.loops
    job.recovery.start(None)
    assert job.recovery.position.epoch == 50
    other = whole_job(tmp_path, f"restore.source={gone}", "restore.lineage=c")
    with pytest.raises(StatorError, match="savepoint-disposed"):  # no run to resume: refused
        other.check_restore_source()


def test_an_explicit_checkpoint_older_than_the_retained_ones_is_rewound_to(
    tmp_path: Path,
) -> None:
    # Checkpoint 2 is not among the retained (3, 4, 5 with the default 3), and 3-5 are newer:
    # another lineage. A failure before the job's first checkpoint goes back to 2, it does
    # not fail the job as if every checkpoint had failed to restore.
    for cid in (2, 3, 4, 5):
        write_checkpoint(tmp_path, cid)
    job = driver(tmp_path, f"restore.source=file://{tmp_path}/ck/job/chk-0000000002")
    job.recovery.start(None)
    job.recovery.failover(RuntimeError("an executor was lost"))
    assert job.recovery.position.epoch == 20
