"""The driver's control API, every endpoint, against a running job."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from stator import Job, Pipeline
from stator.config import JobConfig
from stator.control.client import ControlClient, ControlHTTPError
from stator.control.schema import CheckpointsInfo, JobInfo
from stator.control.server import serving
from stator.control.token import read_token
from stator.errors import ConfigError
from stator.savepoint.metadata import SavepointMetadata
from stator.sinks import CollectSink
from stator.sources import FileSource, GeneratorSource, KeyedEvents
from stator.storage import open_store
from tests.helpers import stop_with_savepoint_after, wait_until, with_overrides
from tests.integration.control_calls import call

ROUTES = (("/v1/job", "GET"), ("/metrics", "GET"), ("/v1/savepoints", "POST"))


@contextmanager
def _running(spark: Any, job_config: JobConfig, tmp_path: Path, **control: Any) -> Iterator[Any]:
    p = Pipeline("control")
    (
        p.source(GeneratorSource(KeyedEvents(50), count=None, splits=2), uid="events")
        .key_by(lambda e: e[0])
        .count(uid="count")
        .sink(CollectSink(), uid="out")
    )
    cfg = with_overrides(
        job_config,
        epoch={"max_records": 500},
        control={"port": 0, **control},
        savepoint={"dir": f"file://{tmp_path}/savepoints"},
    )
    driver = Job(p, cfg, spark)
    result: dict[str, Any] = {}

    def run() -> None:  # as `stator run` does
        with serving(driver, cfg.control) as server:
            result["server"] = server
            result["status"] = driver.run()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    wait_until("control API up", lambda: result.get("server"))
    base = f"http://127.0.0.1:{result['server'].port}"
    wait_until("job running", lambda: call(base, "/readyz")[0] == 200)
    yield driver, base, thread, result
    driver.stop()
    thread.join(120)


@pytest.fixture
def running_job(spark: Any, job_config: JobConfig, tmp_path: Path) -> Iterator[Any]:
    with _running(spark, job_config, tmp_path) as job:
        yield job


def test_a_token_is_required_and_checked(spark: Any, job_config: JobConfig, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cr3t-token\n")
    with _running(spark, job_config, tmp_path, token_file=str(token_file)) as job:
        driver, base, _, _ = job
        assert call(base, "/healthz")[0] == 200  # probes stay open
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cr3t-token"}):
            for path, method in (
                ("/v1/job", "GET"),
                ("/metrics", "GET"),
                ("/v1/savepoints", "POST"),
            ):
                code, err = call(base, path, method, {"stop": True}, headers=headers)
                assert code == 401 and "bearer token" in err["error"], (path, headers)
        assert driver.savepoints.all() == [], "a refused request changed nothing"
        client = ControlClient(base, token="s3cr3t-token")
        assert client.job().state == "RUNNING"
        with pytest.raises(ControlHTTPError) as refused:
            ControlClient(base, token="nope").job()
        assert refused.value.status == 401
    empty = tmp_path / "empty"
    empty.write_text("")
    with pytest.raises(ConfigError, match=r"control.token_file=.*is empty"):
        read_token(str(empty))


def test_every_endpoint(running_job: Any, tmp_path: Path) -> None:
    driver, base, thread, result = running_job
    assert call(base, "/healthz") == (200, {"status": "ok"})
    assert call(base, "/readyz") == (200, {"ready": True, "state": "RUNNING"})

    wait_until("two checkpoints", lambda: driver.status.checkpoints >= 2)
    status, job = call(base, "/v1/job")
    assert status == 200 and job["job"] == "control" and job["state"] == "RUNNING"
    assert JobInfo.from_wire(job).to_wire() == job, "the answer is the schema's"
    assert job["parallelism"] == {"count": 2} and job["max_parallelism"] == 128
    assert [(r["id"], r["nodes"]) for r in job["regions"]] == [
        ("events", ["events", "count", "out"])
    ]
    assert job["regions"][0]["state"] == job["state"]
    assert job["epoch"] >= 2 and job["records_in"] > 0 and job["latest_checkpoint"]["id"] >= 2
    # A fresh job restores nothing; local[*] has one executor, so no placement.
    assert job["restores"] == {
        "local": 0,
        "remote": 0,
        "local_bytes": 0,
        "remote_bytes": 0,
        "latest": [],
    }
    assert job["placement"] is None
    status, body = call(base, "/v1/handover", "POST", {"restore": "latest"})
    assert status == 409 and "--await-handover" in body["error"], "only a pre-started driver"
    assert job["startup"]["handover_ms"] is None
    marks = job["startup"]
    order = ("process_started_ms", "driver_started_ms", "spark_ready_ms", "recovered_ms")
    assert all(marks[k] for k in (*order, "first_epoch_ms")), marks
    assert marks["caught_up_ms"] is None, "it had input from the start"
    assert [marks[k] for k in order] == sorted(marks[k] for k in order)
    assert (
        marks["recovered_ms"] <= marks["first_epoch_ms"] <= job["latest_checkpoint"]["created_ms"]
    )

    status, cks = call(base, "/v1/checkpoints")
    assert CheckpointsInfo.from_wire(cks).to_wire() == cks
    assert status == 200 and cks["latest"]["id"] == cks["retained"][-1]["id"]
    assert len(cks["retained"]) <= 3 and cks["counts"]["completed"] >= 2
    assert all(h["status"] == "COMPLETED" for h in cks["history"])
    assert cks["latest"]["state_bytes"] > 0 and cks["latest"]["duration_ms"] > 0
    # Uploads are asynchronous: at most checkpoint.max_concurrent (2) in flight, all newer.
    assert len(cks["in_flight"]) <= 2
    assert all(i > cks["latest"]["id"] for i in cks["in_flight"])

    status, text = call(base, "/metrics")
    assert status == 200 and 'stator_epochs_total{job="control"}' in text
    assert 'stator_operator_parallelism{job="control",operator="count"} 2.0' in text
    assert 'stator_restores_total{job="control",source="remote"} 0.0' in text
    assert 'stator_restore_remote_bytes_total{job="control"} 0.0' in text
    assert 'stator_keyed_tasks_local_total{job="control"} 0.0' in text
    assert 'stator_checkpoints_in_flight{job="control"}' in text

    # Bad requests are refused with a reason.
    assert call(base, "/v1/savepoints", "POST", raw=b"{not json")[0] == 400
    code, err = call(base, "/v1/savepoints", "POST", {"stop": "yes"})
    assert code == 400 and "'stop' must be true or false" in err["error"]
    code, err = call(base, "/v1/savepoints", "POST", {"stpo": True})
    assert code == 400 and "unknown field(s) ['stpo']" in err["error"]
    code, err = call(base, "/v1/savepoints", "POST", {"target": "relative/path"})
    assert code == 400 and "file:/// or s3://" in err["error"]
    code, err = call(base, "/v1/savepoints", "POST", {"format_type": "rocksdb"})
    assert code == 400 and "'format_type' must be one of canonical, native" in err["error"]
    assert call(base, "/v1/savepoints/nope")[0] == 404
    assert call(base, "/v1/nothing")[0] == 404

    # A savepoint that keeps the job running, in the native format (the job's is canonical).
    code, created = call(base, "/v1/savepoints", "POST", {"format_type": "native"})
    assert code == 202 and created["status"] in ("PENDING", "IN_PROGRESS")
    code, err = call(base, "/v1/savepoints", "POST", {})  # one at a time
    assert code == 429 and created["id"] in err["error"], err

    def finished() -> dict[str, Any] | None:
        got: dict[str, Any] = call(base, f"/v1/savepoints/{created['id']}")[1]
        return got if got["status"] in ("COMPLETED", "FAILED") else None

    done = wait_until("savepoint", finished)
    assert done["status"] == "COMPLETED", done
    location = done["location"]
    meta = SavepointMetadata.from_json(open_store(location).get("_savepoint.json"))
    assert meta.epoch == done["epoch"] and set(meta.operators) == {"count"}
    assert meta.native and done["format_type"] == "native"
    parts = meta.operators["count"].subtasks
    assert [s.index for s in parts] == [0, 1] and not meta.operators["count"].key_groups
    assert all(f.key.startswith(f"count/{s.index}/") for s in parts for f in s.files)
    assert {k for k, _ in open_store(location).listing()} == {
        "_savepoint.json",
        *(f.key for s in parts for f in s.files),
    }, "a native savepoint holds its databases' files and nothing else"
    assert call(base, "/readyz")[0] == 200
    code, listed = call(base, "/v1/savepoints")
    assert code == 200 and [r["id"] for r in listed["savepoints"]] == [created["id"]]

    # Targets outside the savepoint directory, climbing out of it, or the directory itself.
    for bad, why in (
        ("elsewhere", "under the savepoint directory"),
        ("savepoints/../elsewhere", "has '.' or '..' in its path"),
        ("savepoints", "under the savepoint directory"),
    ):
        code, err = call(base, "/v1/savepoints", "POST", {"target": f"file://{tmp_path}/{bad}"})
        assert code == 400 and why in err["error"], (bad, err)
    # A target that already holds a savepoint fails the request, not the job.
    restarts = driver.status.restarts
    code, taken = call(base, "/v1/savepoints", "POST", {"stop": True, "target": location})
    assert code == 202

    def taken_done() -> dict[str, Any] | None:
        got: dict[str, Any] = call(base, f"/v1/savepoints/{taken['id']}")[1]
        return got if got["status"] in ("COMPLETED", "FAILED") else None

    refused = wait_until("refused savepoint", taken_done)
    assert refused["status"] == "FAILED" and "already holds a savepoint" in refused["error"]
    assert driver.status.restarts == restarts, "a refused savepoint is no failure of the job"
    assert driver.status.state.value not in ("FAILED", "STOPPED")

    # Stop with savepoint: only one at a time.
    target = f"file://{tmp_path}/savepoints/final"
    code, stopping = call(base, "/v1/savepoints", "POST", {"stop": True, "target": target})
    assert code == 202
    code, err = call(base, "/v1/savepoints", "POST", {"stop": True})
    assert code == 409 and "already in progress" in err["error"]
    wait_until(
        "stop-with-savepoint",
        lambda: call(base, f"/v1/savepoints/{stopping['id']}")[1]["status"] == "COMPLETED",
    )
    thread.join(120)  # the driver serves until its requester has read the result
    assert not thread.is_alive()
    final = result["status"]
    assert final.state == "STOPPED" and final.stopped_with_savepoint == target
    assert driver.savepoints.find(stopping["id"]).status == "COMPLETED"
    final_meta = SavepointMetadata.from_json(open_store(target).get("_savepoint.json"))
    assert not final_meta.native, "savepoint.format_type (canonical) when a trigger names none"
    assert [r.id for r in driver.savepoints.all()] == [created["id"], taken["id"], stopping["id"]]


def test_a_restored_driver_with_nothing_to_read_is_caught_up(
    spark: Any, job_config: JobConfig, tmp_path: Path
) -> None:
    """Restored from a savepoint taken after its input stopped (a rescale when the input
    ended), a driver runs no epoch: its start-up marks say when it found nothing to read
    (``caught_up_ms``), which the operator counts as processing again (its downtime, the
    autoscaler's cool-down)."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("".join(f"k{i % 7}\n" for i in range(300)))

    def pipeline() -> Pipeline:
        p = Pipeline("caught-up")
        (
            p.source(FileSource(f"file://{tmp_path}/in"), uid="lines")
            .key_by(lambda line: line)
            .count(uid="count")
            .sink(CollectSink(), uid="out")
        )
        return p

    cfg = with_overrides(job_config, savepoint={"dir": f"file://{tmp_path}/savepoints"})
    first = stop_with_savepoint_after(Job(pipeline(), cfg, spark), 1).run()
    assert first.records_in == 300 and first.stopped_with_savepoint, first
    again = with_overrides(cfg, restore={"source": first.stopped_with_savepoint})
    driver = Job(pipeline(), again, spark)
    thread = threading.Thread(target=driver.run, daemon=True)
    thread.start()
    try:
        wait_until("nothing to read", lambda: driver.status.startup.caught_up_ms is not None)
        marks = driver.status.startup
        assert marks.first_epoch_ms is None and driver.status.records_in == 0, marks
        assert marks.recovered_ms is not None and marks.recovered_ms <= marks.caught_up_ms
    finally:
        driver.stop()
        thread.join(120)
