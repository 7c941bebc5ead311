"""A pre-started driver (``stator run --await-handover``): it starts Spark and its Python
workers while the old driver still processes, waits, and takes over at the old driver's
savepoint when told to over the control API. Its committed output, with the old driver's,
equals a run without any stop, record for record; bad hand-overs change nothing."""

from __future__ import annotations

import functools
import os
import threading
from pathlib import Path
from typing import Any

from stator import Job
from stator.config import JobConfig
from stator.control.server import serving
from stator.driver.handover import Handover, HandoverRequest
from stator.driver.preflight import preflight
from stator.driver.spark_session import warm_python_workers
from stator.savepoint.metadata import SavepointMetadata
from stator.storage import open_store
from tests.helpers import wait_until, with_overrides
from tests.integration.control_calls import call
from tests.integration.rescale_job import EPOCH, EVENTS, output, pipeline, run_phase


def test_a_prestarted_driver_takes_over_at_the_savepoint(
    spark: Any, job_config: JobConfig, tmp_path: Path
) -> None:
    base = with_overrides(
        job_config, epoch={"max_records": EPOCH}, savepoint={"dir": f"file://{tmp_path}/savepoints"}
    )
    reference = f"file://{tmp_path}/reference"
    ref_cfg = with_overrides(
        base, name="reference", checkpoint={"storage": f"file://{tmp_path}/ref-checkpoints"}
    )
    ref = pipeline(reference).run(with_overrides(ref_cfg, parallelism=2), spark)
    assert ref.finished

    out = f"file://{tmp_path}/handed-over"
    cfg = with_overrides(base, parallelism=3, control={"port": 0})
    new = Job(pipeline(out), cfg, spark, await_handover=True)
    result: dict[str, Any] = {}

    def run_new() -> None:  # as `stator run --await-handover` does
        with serving(new, cfg.control) as server:
            result["server"] = server
            new.await_handover()
            preflight(new.job, new.config, new.parallelism, new.store)
            result["status"] = new.run()

    thread = threading.Thread(target=run_new, daemon=True)
    thread.start()
    wait_until("control API up", lambda: result.get("server"))
    url = f"http://127.0.0.1:{result['server'].port}"
    wait_until(
        "waiting",
        lambda: (
            call(url, "/readyz")
            == (503, {"ready": False, "state": "STANDBY", "reason": "the job is STANDBY"})
        ),
    )
    warm = new.status.startup
    assert warm.spark_ready_ms is not None and warm.handover_ms is None
    assert new.status.epoch == 0 and new.status.records_in == 0

    old = run_phase(spark, base, out, 2, "latest", stop_after_epoch=4)
    assert old.state == "STOPPED" and old.stopped_with_savepoint
    savepoint = old.stopped_with_savepoint

    for body, code, says in (
        ([savepoint], 400, "JSON object"),
        ({"restore": savepoint, "force": True}, 400, "unknown field(s) ['force']"),
        ({"restore": "/tmp/savepoint"}, 400, "file:/// or s3://"),
        ({"restore": savepoint, "allow_non_restored_state": "yes"}, 400, "true or false"),
    ):
        status, answer = call(url, "/v1/handover", "POST", body)
        assert (status, says in answer["error"]) == (code, True), answer
    assert new.status.startup.handover_ms is None, "a refused hand-over changes nothing"

    assert call(url, "/v1/handover", "POST", {"restore": savepoint})[0] == 202
    assert call(url, "/v1/handover", "POST", {"restore": savepoint})[0] == 200, "sent again"
    status, answer = call(url, "/v1/handover", "POST", {"restore": "latest"})
    assert status == 409 and savepoint in answer["error"]
    thread.join(300)
    assert not thread.is_alive()
    finished = result["status"]
    assert finished.finished and finished.restores.remote == 6, "2 keyed operators x 3 subtasks"
    # Each subtask reports the savepoint's bytes it read: together, all of them.
    saved = SavepointMetadata.from_json(open_store(savepoint).get("_savepoint.json"))
    assert finished.restores.remote_bytes == saved.state_bytes > 0
    assert all(r["savepoint"] for r in finished.last_restores.values())
    marks = finished.startup
    assert marks.spark_ready_ms < marks.handover_ms <= marks.recovered_ms <= marks.first_epoch_ms

    got, want = output(out), output(reference)
    assert got["count_order"] == want["count_order"], "running counts differ per key"
    assert got["counts"] == want["counts"] and got["windows"] == want["windows"]
    total = sum(v for (_, _, v), n in got["windows"].items() for _ in range(n))
    assert total == EVENTS


def _mark(directory: Path) -> None:
    (directory / str(os.getpid())).touch()


def _pid(_: int) -> int:
    return os.getpid()


def test_the_warm_workers_are_the_ones_the_next_job_runs_in(spark: Any, tmp_path: Path) -> None:
    """What a pre-started driver warms (imports, store and sink clients) is worth it only if
    the first epoch's tasks run in those very workers, and connect() ran in each."""
    sc = spark.sparkContext
    slots = int(sc.defaultParallelism)
    warm_python_workers(spark, [functools.partial(_mark, tmp_path)])
    warmed = {int(p.name) for p in tmp_path.iterdir()}
    assert warmed
    used = set(sc.parallelize(range(4 * slots), 2 * slots).map(_pid).collect())
    assert used <= warmed, f"tasks ran in workers that were not warmed: {used - warmed}"


def test_a_waiting_hand_over_times_out_without_a_request() -> None:
    handover = Handover()
    assert handover.wait(0.05) is None
    request = HandoverRequest("s3://bucket/savepoints/sp-1")
    assert handover.give(request) and handover.wait(0.05) == request
