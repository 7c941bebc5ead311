"""The exactly-once file sink (stator.sinks.files): only the staged object a task reported
is committed, so a late writer of the same epoch and part (a failed Spark attempt that still
finished, a task of a replaced driver) never replaces committed output."""

from __future__ import annotations

from pathlib import Path

from stator.sinks import FileSink
from stator.sinks.files import read_committed


def stage(sink: FileSink, epoch: int, part: str, records: list[dict[str, int]]) -> dict:
    writer = sink.writer("out", epoch, part)
    writer.write(records)
    descriptor, _ = writer.finish()
    return descriptor


def test_only_the_reported_attempt_is_committed_and_a_late_one_changes_nothing(
    tmp_path: Path,
) -> None:
    sink = FileSink(f"file://{tmp_path}/out")
    reported = stage(sink, 3, "op-0", [{"k": 1}, {"k": 2}])
    stage(sink, 3, "op-0", [{"k": 99}])  # another attempt of the same epoch and part
    sink.commit("out", 3, [reported], [])
    assert read_committed(f"file://{tmp_path}/out") == [{"k": 1}, {"k": 2}]
    stage(sink, 3, "op-0", [{"k": 666}])  # a cut-off writer, after the commit
    sink.commit("out", 3, [reported], [])  # committed again (a restore): idempotent
    assert read_committed(f"file://{tmp_path}/out") == [{"k": 1}, {"k": 2}]


def test_discard_after_removes_staged_output_of_later_epochs_only(tmp_path: Path) -> None:
    sink = FileSink(f"file://{tmp_path}/out")
    kept = stage(sink, 2, "op-0", [{"k": 1}])
    stage(sink, 3, "op-0", [{"k": 2}])
    sink.discard_after("out", 2)
    staged = sorted(k for k, _ in sink.store.listing("_staging/"))
    assert staged == [kept["staged"]]
