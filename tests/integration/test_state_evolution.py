"""Restoring a savepoint into changed code: added operators, removed state (with and
without allowNonRestoredState), an incompatible serializer, a removed operator."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from stator import INT64, JSON, Context, Job, KeyedProcessFunction, Pipeline, RuntimeContext
from stator import ValueStateDescriptor as Value
from stator.config import JobConfig
from stator.errors import ConfigError, JobFailed
from stator.sinks import CollectSink
from stator.sources import list_source
from tests.helpers import stop_with_savepoint_after, with_overrides

WORDS = ["a", "b", "a", "c", "a", "b"] * 4  # 24 records, 4 per epoch: 6 epochs


class Counts(KeyedProcessFunction):
    """Counts per key in state "seen"; optionally keeps a second state "extra"."""

    def __init__(self, with_extra: bool = True, seen_serializer: Any = INT64) -> None:
        self.with_extra, self.seen_serializer = with_extra, seen_serializer

    def open(self, ctx: RuntimeContext) -> None:
        self.seen = ctx.get_state(Value("seen", self.seen_serializer))
        if self.with_extra:
            self.extra = ctx.get_state(Value("extra", INT64))

    def process_element(self, value: Any, ctx: Context) -> Iterable[Any]:
        n = self.seen.value(0) + 1
        self.seen.update(n)
        if self.with_extra:
            self.extra.update(n * 10)
        yield (value, n)


def pipeline(
    fn: Counts, sink: CollectSink, *, reduce_op: bool = True, added: CollectSink | None = None
) -> Pipeline:
    p = Pipeline("evolve")
    src = p.source(list_source(WORDS), uid="words")
    src.key_by(lambda w: w).process(fn, uid="counts").sink(sink, uid="out")
    if reduce_op:
        src.key_by(lambda w: w).count(uid="reduce").sink(CollectSink(), uid="reduce-out")
    if added is not None:
        src.key_by(lambda w: w).count(uid="added").sink(added, uid="added-out")
    return p


@pytest.fixture(params=["canonical", "native"])
def savepoint(
    spark: Any, job_config: JobConfig, tmp_path: Path, request: pytest.FixtureRequest
) -> tuple[JobConfig, str]:
    """A stopped job's savepoint in each format type: every check below holds for both."""
    cfg = with_overrides(
        job_config,
        epoch={"max_records": 4},
        savepoint={"dir": f"file://{tmp_path}/sp", "format_type": request.param},
    )
    driver = stop_with_savepoint_after(Job(pipeline(Counts(), CollectSink()), cfg, spark), 2)
    status = driver.run()
    assert status.state == "STOPPED"
    restore = with_overrides(cfg, name="evolved", restore={"source": status.stopped_with_savepoint})
    return restore, str(status.stopped_with_savepoint)


def final_counts(sink: CollectSink) -> dict[str, int]:
    return dict(sink.results)


def test_added_operator_starts_empty(spark: Any, savepoint: tuple[JobConfig, str]) -> None:
    cfg, _ = savepoint
    out, added = CollectSink(), CollectSink()
    pipeline(Counts(), out, added=added).run(cfg, spark)
    assert final_counts(out) == {"a": 12, "b": 8, "c": 4}  # restored state continues
    assert final_counts(added) == {"a": 8, "b": 5, "c": 3}  # only the 16 records after it


def test_removed_state_needs_allow_non_restored_state(
    spark: Any, savepoint: tuple[JobConfig, str]
) -> None:
    cfg, _ = savepoint
    with pytest.raises(JobFailed) as err:
        pipeline(Counts(with_extra=False), CollectSink()).run(cfg, spark)
    assert "['extra']" in str(err.value) and "allow_non_restored_state" in str(err.value)
    out = CollectSink()
    allowed = with_overrides(cfg, name="evolved-2", restore={"allow_non_restored_state": True})
    pipeline(Counts(with_extra=False), out).run(allowed, spark)
    assert final_counts(out) == {"a": 12, "b": 8, "c": 4}


def test_incompatible_serializer_names_the_state(
    spark: Any, savepoint: tuple[JobConfig, str]
) -> None:
    cfg, _ = savepoint
    with pytest.raises(JobFailed) as err:
        pipeline(Counts(seen_serializer=JSON), CollectSink()).run(cfg, spark)
    text = str(err.value)
    assert "state 'seen' of operator 'counts'" in text and "'int64'" in text and "'json'" in text


def test_removed_operator(spark: Any, savepoint: tuple[JobConfig, str]) -> None:
    cfg, _ = savepoint
    with pytest.raises(ConfigError, match=r"operator\(s\) \['reduce'\].*allow_non_restored_state"):
        pipeline(Counts(), CollectSink(), reduce_op=False).run(cfg, spark)
    out = CollectSink()
    allowed = with_overrides(cfg, name="evolved-3", restore={"allow_non_restored_state": True})
    pipeline(Counts(), out, reduce_op=False).run(allowed, spark)
    assert final_counts(out) == {"a": 12, "b": 8, "c": 4}


def test_state_reader_reads_savepoints_and_checkpoints(
    spark: Any, savepoint: tuple[JobConfig, str], job_config: JobConfig
) -> None:
    from stator.state_reader import read_state

    _, location = savepoint
    rows = {
        (r.operator_uid, r.state_name, r.key, r.value)
        for r in read_state(spark, location).collect()
    }
    # After epoch 2 (8 words: a b a c a b a b): a=4, b=3, c=1, in both operators.
    assert ("counts", "seen", '"a"', "4") in rows and ("counts", "extra", '"a"', "40") in rows
    assert ("reduce", "reduce", '"b"', "3") in rows and ("counts", "seen", '"c"', "1") in rows
    assert len(rows) == 9  # 3 keys x (seen, extra, reduce)

    checkpoints = job_config.checkpoint.storage + "/evolve"
    from stator.checkpoint.coordinator import CheckpointCoordinator
    from stator.storage import open_store

    latest = CheckpointCoordinator(open_store(checkpoints)).recover().restored
    assert latest is not None
    df = read_state(spark, f"{checkpoints}/chk-{latest.checkpoint_id:010d}")
    assert {(r.operator_uid, r.state_name, r.key, r.value) for r in df.collect()} == rows
    assert df.columns == [
        "operator_uid",
        "state_name",
        "state_kind",
        "key_group",
        "key",
        "user_key",
        "value",
    ]


def test_savepoint_cli_list_show_dispose(savepoint: tuple[JobConfig, str], tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    _, location = savepoint

    def stator(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "stator", "savepoint", *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )

    root = location.rsplit("/", 2)[0]
    listed = stator("list", root, "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [r["location"] for r in rows] == [location] and rows[0]["epoch"] == 3
    shown = json.loads(stator("show", location).stdout)
    assert shown["operators"]["counts"]["states"]["seen"]["serializer"] == "int64"
    not_a_savepoint = stator("dispose", f"file://{tmp_path}")
    assert not_a_savepoint.returncode == 2 and "is not a savepoint" in not_a_savepoint.stderr
    bad_url = stator("trigger", "driver:8081")
    assert bad_url.returncode == 2 and "must start with http://" in bad_url.stderr
    disposed = stator("dispose", location)
    assert disposed.returncode == 0, disposed.stderr
    assert json.loads(stator("list", root, "--json").stdout) == []
