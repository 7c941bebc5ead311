"""The web console as a person sees it (issue 42): a real job on two executor JVMs
(``local-cluster``: placement is real) serves its control API with a token; headless Chromium
(Debian's package) opens ``/console/#token=...`` and the page must show the job graph with
the job's operators, plots with data points, and the placement map; without the token the
page shows no data and the API refuses it. A screenshot is taken (set
``STATOR_CONSOLE_SCREENSHOT=docs/console.png`` to keep it: the README's)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stator import Job, Pipeline
from stator.config import SparkConfig, load_config
from stator.control.server import ControlServer, serving
from stator.driver.status import JobState
from stator.sinks import CollectSink
from stator.sources import GeneratorSource, KeyedEvents
from tests.helpers import SparkSessions, wait_until
from tests.integration.control_calls import call
from tests.unit.two_regions import config, two_parts

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed (Debian: apt-get install chromium; .ci/run installs it)",
)
TOKEN = "console-test-token"
OPERATORS = ("events", "count", "out", "clicks", "parse", "clicks-out")


def pipeline() -> Pipeline:
    """Two failover regions: a keyed count, and a stateless map."""
    p = Pipeline("console-demo", max_parallelism=16)
    (
        p.source(GeneratorSource(KeyedEvents(40), count=None, splits=2), uid="events")
        .key_by(lambda e: e[0])
        .count(uid="count")
        .sink(CollectSink(), uid="out")
    )
    (
        p.source(GeneratorSource(KeyedEvents(10), count=None, splits=1), uid="clicks")
        .map(lambda e: e, name="parse")
        .sink(CollectSink(), uid="clicks-out")
    )
    return p


@pytest.fixture(scope="module")
def cluster(spark_sessions: SparkSessions) -> Iterator[Any]:
    yield spark_sessions.get(SparkConfig(master="local-cluster[2,1,1024]"), "console")
    spark_sessions.stop()  # two executor JVMs: give their memory back


@pytest.fixture(scope="module")
def running(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Job, str]]:
    """One job for both tests (two executor JVMs start once)."""
    tmp_path = tmp_path_factory.mktemp("console")
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    cfg = load_config(
        None,
        [
            f"checkpoint.storage=file://{tmp_path}/ck",
            f"state.local_dir={tmp_path}/state",
            f"savepoint.dir=file://{tmp_path}/sp",
            "epoch.max_records=200",
            "checkpoint.every_epochs=2",
            "parallelism=2",
            "failover.strategy=full",  # one loop: placement is tracked for the whole job
            "local_recovery.standby=true",  # each subtask's copy on the other executor too
            "control.port=0",
            f"control.token_file={token_file}",
        ],
    )
    driver = Job(pipeline(), cfg, cluster)
    started: dict[str, Any] = {}

    def run() -> None:  # as `stator run` does
        with serving(driver, cfg.control) as server:
            started["server"] = server
            driver.run()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    wait_until("control API up", lambda: started.get("server"), timeout=120)
    base = f"http://127.0.0.1:{started['server'].port}"
    wait_until("three checkpoints", lambda: driver.status.checkpoints >= 3, timeout=180)
    savepoint = driver.request_savepoint()
    wait_until("the savepoint", lambda: savepoint.status == "COMPLETED", timeout=120)
    time.sleep(3)  # a few more status samples (one a second), standby copies made
    yield driver, base
    driver.stop()
    thread.join(120)


def chromium(tmp_path: Path, url: str, *extra: str) -> str:
    """Headless Chromium on ``url``; its stdout (the DOM with ``--dump-dom``)."""
    assert CHROMIUM is not None
    done = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--user-data-dir={tmp_path / 'chromium'}",
            "--virtual-time-budget=5000",
            *extra,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_the_console_shows_the_job(running: tuple[Job, str], tmp_path: Path) -> None:
    driver, base = running
    started = time.monotonic()
    dom = chromium(tmp_path, f"{base}/console/#token={TOKEN}", "--dump-dom")
    print(f"chromium rendered the console in {time.monotonic() - started:.1f} s")
    assert 'data-state="loaded"' in dom, dom[:3000]
    assert "console-test-token" not in dom, "the token is not written into the page"

    graph = re.search(r'<svg id="graph-svg".*?</svg>', dom, re.S)
    assert graph, "the job graph is drawn as SVG"
    labels = re.findall(r'class="node" data-label="([^"]+)"', graph.group(0))
    assert sorted(labels) == sorted(OPERATORS)
    edges = re.findall(r'data-from="([^"]+)" data-to="([^"]+)"', graph.group(0))
    assert ("events", "count") in edges and ("parse", "clicks-out") in edges
    assert "reduce \u00d72" in graph.group(0), "the keyed operator's parallelism is shown"
    assert set(re.findall(r'data-region="([^"]+)"', graph.group(0))) == {"clicks", "events"}

    plots = dict(re.findall(r'<figure class="plot" id="([^"]+)" data-points="(\d+)"', dom))
    assert int(plots["plot-throughput-records_s"]) > 1, plots
    assert int(plots["plot-latency-ms"]) > 1, "epoch durations"
    assert int(plots["plot-checkpoint-duration"]) >= 3 and int(plots["plot-checkpoint-size"]) >= 6
    assert dom.count('class="series"') >= 5 and dom.count('class="point"') > 5

    phases = re.findall(r'<tr class="phase-row">(.*?)</tr>', dom, re.S)
    assert len(phases) == 1, "the newest epoch that read records, of the job's one region"
    stamps = re.findall(r"<td>(.*?)</td>", phases[0])[3:]
    assert len(stamps) == 9 and all(re.fullmatch(r"\d+ ms|\d+\.\d s", t) for t in stamps), stamps
    assert stamps[-1] != "0 ms", "handed off after it was planned"

    rows = re.findall(r'<tr class="placement-row">(.*?)</tr>', dom, re.S)
    assert len(rows) == 2, "one row per subtask of 'count'"
    cells = [re.findall(r"<td>(.*?)</td>", r) for r in rows]
    assert [c[0] for c in cells] == ["count", "count"] and [c[1] for c in cells] == ["0", "1"]
    assert [c[2] for c in cells] == ["0\u20137", "8\u201315"], "key groups of max parallelism 16"
    placed = driver.placement.to_json()["count"] if driver.placement else []
    executors = {p["subtask"]: str(p["executor"]) for p in placed}
    assert [c[3].split()[0] for c in cells] == [executors[0], executors[1]], (cells, executors)
    assert all(c[5].startswith("checkpoint ") for c in cells), "each has its local copy"
    standby = {s["subtask"]: s.get("standby") for s in placed}
    print("placement:", cells, "standby:", standby)
    for c in cells:
        held = standby[int(c[1])]
        assert held is not None and c[6] == f"executor {held['executor']}", (
            "its standby copy's executor"
        )
        assert held["executor"] != c[3].split()[0], "on another executor than the subtask"
    failovers = re.search(r'<table id="failovers">.*?</table>', dom, re.S)
    assert failovers and "none yet" in failovers.group(0), "no restart: none listed"
    assert len(re.findall(r'<tr class="savepoint-row">', dom)) == 1
    assert "COMPLETED" in re.search(r'<tr class="savepoint-row">(.*?)</tr>', dom, re.S).group(1)

    shot = tmp_path / "console.png"
    chromium(
        tmp_path,
        f"{base}/console/#token={TOKEN}",
        f"--screenshot={shot}",
        "--window-size=1400,2300",
    )
    png = shot.read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 30_000, "a page was drawn, not a blank"
    keep = os.environ.get("STATOR_CONSOLE_SCREENSHOT")
    if keep:
        shutil.copyfile(shot, keep)


def test_without_the_token_nothing_is_shown_and_data_is_refused(
    running: tuple[Job, str], tmp_path: Path
) -> None:
    _, base = running
    for path in ("/v1/history", "/v1/job", "/v1/checkpoints", "/v1/savepoints"):
        code, body = call(base, path)
        assert code == 401 and "bearer token" in body["error"], path
    assert call(base, "/v1/history", headers={"Authorization": f"Bearer {TOKEN}"})[0] == 200
    dom = chromium(tmp_path, f"{base}/console/", "--dump-dom")
    assert 'data-state="token-required"' in dom
    assert 'id="graph-svg"' not in dom and "placement-row" not in dom
    dom = chromium(tmp_path, f"{base}/console/#token=wrong", "--dump-dom")
    assert 'data-state="token-required"' in dom and "refused the token" in dom


def test_what_a_driver_reports_is_shown_as_text_never_run(tmp_path: Path) -> None:
    """A driver runs the user's code, so its answers are the user's: an error message with
    markup and script appears as those characters, and nothing of it runs (no Spark: the
    job's status is set by hand)."""
    job = Job(two_parts(), config(tmp_path, "failover.strategy=full"))
    hostile = '<img src=x onerror="document.title=1"><script>document.title=2</script>'
    job.status.state, job.status.last_error = JobState.RUNNING, hostile
    server = ControlServer(job, "127.0.0.1", 0)
    server.start()
    try:
        dom = chromium(tmp_path, f"http://127.0.0.1:{server.port}/console/", "--dump-dom")
    finally:
        server.stop()
    assert 'data-state="loaded"' in dom
    assert "Last error: &lt;img src=x onerror=" in dom, "the text, escaped"
    assert "<img src=" not in dom and "<script>document" not in dom
    assert "<title>Stator console</title>" in dom, "no injected code ran"
