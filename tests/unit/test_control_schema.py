"""The control API's one schema (``stator.control.schema``): every answer the server gives
reads back equal through ``from_wire``, and an answer that does not fit the schema is refused
with an error that names the field (a driver runs the user's code: issue 38)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stator.control.client import ControlAnswerInvalid, ControlUnreachable, read_answer
from stator.control.schema import (
    Answer,
    CheckpointsInfo,
    Health,
    JobInfo,
    Readiness,
    SavepointList,
    SavepointRequest,
)
from stator.control.server import ControlServer
from stator.control.wire import MAX_ITEMS, MAX_TEXT, WireError, camel
from stator.driver.job import Job
from tests.unit.two_regions import config, running_job, two_parts


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    server = ControlServer(running_job(tmp_path), "127.0.0.1", 0)
    server.start()
    yield f"http://127.0.0.1:{server.port}"
    server.stop()


def raw(url: str, method: str = "GET", body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    with urllib.request.urlopen(request, timeout=10) as resp:
        return json.loads(resp.read())


def reads_back_equal(kind: type[Answer], answer: Any) -> Any:
    assert kind.from_wire(answer).to_wire() == answer, kind.__name__
    return kind.from_wire(answer)


def test_every_answer_of_the_server_reads_back_equal(served: str) -> None:
    assert reads_back_equal(Health, raw(served + "/healthz")) == Health(status="ok")
    assert reads_back_equal(Readiness, raw(served + "/readyz")).ready is True
    job = reads_back_equal(JobInfo, raw(served + "/v1/job"))
    assert isinstance(job, JobInfo) and (job.state, job.epoch) == ("RUNNING", 7)
    assert [r.id for r in job.regions] == ["a-in", "b-in"]
    assert job.latest_checkpoint is not None and job.latest_checkpoint.id == 2
    assert job.restores is not None and job.restores.latest[0].node == "n1"
    assert job.placement is not None and job.placement.last_epoch is not None
    placed = job.placement.subtasks["a-count"]
    assert [(s.key_groups, s.checkpoint_id) for s in placed] == [((0, 64), 2), ((64, 128), 2)]
    assert placed[0].standby is not None and placed[1].standby is None
    assert job.standby_copies is not None and job.standby_copies.bytes == 50
    cks = reads_back_equal(CheckpointsInfo, raw(served + "/v1/checkpoints"))
    assert [(h.status, h.error) for h in cks.history] == [
        ("COMPLETED", None),
        ("FAILED", "disk full"),
    ]
    created = reads_back_equal(SavepointRequest, raw(served + "/v1/savepoints", "POST", {}))
    assert created.status == "PENDING" and created.stop is False
    assert (
        reads_back_equal(SavepointRequest, raw(f"{served}/v1/savepoints/{created.id}")) == created
    )
    assert reads_back_equal(SavepointList, raw(served + "/v1/savepoints")).savepoints == (created,)


def test_a_regional_jobs_regions_read_back_with_their_lost_executors(tmp_path: Path) -> None:
    job = Job(two_parts(), config(tmp_path))
    assert job.regional
    server = ControlServer(job, "127.0.0.1", 0)
    server.start()
    try:
        answer = raw(f"http://127.0.0.1:{server.port}/v1/job")
    finally:
        server.stop()
    info = reads_back_equal(JobInfo, answer)
    assert [r.lost_executors for r in info.regions] == [(), ()]


JOB = {"job": "j", "state": "RUNNING", "epoch": 3}
CHECKPOINT = {
    "id": 1,
    "epoch": 1,
    "created_ms": 5,
    "state_bytes": 0,
    "incremental_bytes": 0,
    "duration_ms": 0,
    "incremental": False,
}


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ([JOB], "JobInfo: expected an object, got list"),
        ({**JOB, "epoch": "3"}, "JobInfo.epoch: expected an integer, got str '3'"),
        ({**JOB, "epoch": True}, "JobInfo.epoch: expected an integer, got bool True"),
        ({**JOB, "epoch": -1}, "JobInfo.epoch: -1 is out of range"),
        ({"job": "j"}, "JobInfo: the field 'epoch' is missing"),
        ({**JOB, "latest_checkpoint": {"id": 1}}, "JobInfo.latest_checkpoint: the field 'epoch'"),
        (
            {**JOB, "latest_checkpoint": {**CHECKPOINT, "incremental": "yes"}},
            "JobInfo.latest_checkpoint.incremental: expected true or false",
        ),
        ({**JOB, "last_error": "x" * (MAX_TEXT + 1)}, f"at most {MAX_TEXT}"),
        ({**JOB, "regions": [{}] * (MAX_ITEMS + 1)}, f"entries; at most {MAX_ITEMS}"),
        ({**JOB, "regions": [{"id": "r", "state": "R", "epoch": 1}]}, "'restarts' is missing"),
        ({**JOB, "parallelism": {"count": "2"}}, "JobInfo.parallelism['count']: expected an"),
        (
            {**JOB, "placement": {"subtasks": {"op": [{"subtask": 0, "parallelism": 2}]}}},
            "JobInfo.placement.subtasks['op'][0]: the field 'executor' is missing",
        ),
        (
            {
                **JOB,
                "placement": {
                    "subtasks": {
                        "op": [{"subtask": 0, "parallelism": 2, "executor": "1", "key_groups": [0]}]
                    }
                },
            },
            "key_groups: expected 2 entries, got 1",
        ),
    ],
)
def test_an_answer_that_does_not_fit_is_refused_naming_the_field(answer: Any, problem: str) -> None:
    with pytest.raises(WireError) as info:
        JobInfo.from_wire(answer)
    assert problem in str(info.value)
    with pytest.raises(ControlAnswerInvalid, match="answered malformed data") as refused:
        read_answer(JobInfo, answer, "http://driver:8081/v1/job")
    assert isinstance(refused.value, ControlUnreachable), "callers treat it as no answer"


def test_unknown_fields_are_ignored_and_optional_ones_default() -> None:
    """A newer driver may add fields; the operator reads a missing optional one as before."""
    info = JobInfo.from_wire({**JOB, "new_field": [1, 2]})
    assert info == JobInfo(job="j", state="RUNNING", epoch=3)
    assert info.restores is None and info.placement is None and info.startup.first_epoch_ms is None


def test_camel_is_the_one_spelling_of_status_and_stored_operation_fields() -> None:
    assert [camel(n) for n in ("epoch", "state_bytes", "key_groups", "last_error")] == [
        "epoch",
        "stateBytes",
        "keyGroups",
        "lastError",
    ]
