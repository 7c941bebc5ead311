"""A sink that fails to commit after its checkpoint completed loses nothing: the checkpoint
stands, the epoch fails, and rewinding to the checkpoint commits the output again (the
scenario of ``test_minio_stopped_during_uploads``, where MinIO went away between a
checkpoint's metadata and the file sink's commit)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stator.api.nodes import SinkNode
from stator.checkpoint.coordinator import CheckpointCoordinator
from stator.checkpoint.metadata import SubtaskSnapshot
from stator.driver.completion import PendingOutput, acknowledge, commit_completed
from stator.epoch.reports import SinkReport, StateReport
from stator.errors import SinkCommitError, StorageError
from stator.sinks.base import Sink, SinkWriter
from stator.storage import FileStore


class FlakySink(Sink):
    """Commits into a list; the first ``failures`` commits raise like an unreachable store."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.committed: dict[int, list[str]] = {}

    def writer(self, uid: str, epoch: int, part: str) -> SinkWriter:
        raise NotImplementedError  # the driver side only

    def commit(
        self, uid: str, epoch: int, parts: list[dict[str, Any]], payloads: list[Any]
    ) -> None:
        if self.failures:
            self.failures -= 1
            raise StorageError("s3://out is unreachable")
        self.committed[epoch] = [p["part"] for p in parts]


def _staged(epoch: int) -> list[SinkReport]:
    return [SinkReport("out", epoch, {"part": f"{epoch}-{i}", "records": 10}, None) for i in (0, 1)]


def _state(epoch: int) -> StateReport:
    snap = SubtaskSnapshot(0, 1, (0, 128), epoch, ())
    return StateReport("op", 0, epoch, 0, 0, 0, snap)


def _complete(coord: CheckpointCoordinator, output: PendingOutput, epoch: int) -> Any:
    pending = coord.trigger(epoch, True)
    refused = acknowledge(
        pending, "job", "", {"op": 1}, 128, [_state(epoch)], {}, output, coord, 0.0
    )
    assert refused is None
    return coord.finish(pending).meta


def test_failed_sink_commit_keeps_checkpoint_and_output(tmp_path: Path) -> None:
    sink = FlakySink(failures=1)
    output = PendingOutput({"out": SinkNode(1, [0], "out", "out", sink)})
    coord = CheckpointCoordinator(FileStore(f"file://{tmp_path}"), retained=2)
    output.add(_staged(1))
    output.add(_staged(2))

    meta = _complete(coord, output, 2)
    with pytest.raises(SinkCommitError, match="checkpoint 1 is complete"):
        commit_completed(meta, output, coord)
    # The checkpoint exists (its metadata lists both epochs) and nothing was committed.
    assert coord.latest is not None and coord.latest.checkpoint_id == 1
    assert [c.epoch for c in coord.latest.sinks["out"]] == [1, 2]
    assert sink.committed == {}

    # Failing over rewinds to the checkpoint: its metadata commits both epochs again.
    output.rewind(coord.latest.epoch, coord.latest.sinks)
    assert sink.committed == {1: ["1-0", "1-1"], 2: ["2-0", "2-1"]}


def test_failed_commit_retried_by_next_checkpoint(tmp_path: Path) -> None:
    """Output stays pending until a commit succeeds (no pop before the commit)."""
    sink = FlakySink(failures=1)
    output = PendingOutput({"out": SinkNode(1, [0], "out", "out", sink)})
    output.add(_staged(1))
    with pytest.raises(StorageError):
        output.commit_upto(1)
    assert [c.epoch for c in output.as_commits()["out"]] == [1]
    output.commit_upto(1)
    assert sink.committed == {1: ["1-0", "1-1"]} and output.as_commits()["out"] == ()


def test_a_part_reported_twice_is_committed_once() -> None:
    # Spark re-runs a map task whose output went with its executor and keeps the reports of
    # both successful runs: the sink must see each staged part once.
    sink = FlakySink(failures=0)
    output = PendingOutput({"out": SinkNode(1, [0], "out", "out", sink)})
    first, second = _staged(1)
    assert output.add([first, second, first]) == first.records + second.records
    output.add([second])  # a later report of the same part
    output.commit_upto(1)
    assert sink.committed == {1: ["1-0", "1-1"]}
