"""The web console's server side (issue 42): the history's ring buffers, ``/v1/history`` and
the job graph in the schema, the console's files and their security headers, the token, and
``stator console``'s URL (no Spark; the console in a browser: tests/integration/test_console.py)."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from stator.cli import console as cli_console
from stator.cli.main import main
from stator.config import load_config
from stator.control.answers import history_info
from stator.control.headers import HEADERS
from stator.control.schema import HistoryInfo, JobInfo
from stator.control.server import ControlServer
from stator.control.timeline import SERIES, Series, Timeline
from stator.control.wire import WireError, from_wire
from stator.driver.listeners import EpochResult
from stator.driver.status import JobStatus
from stator.epoch.histogram import Histogram
from stator.epoch.phases import phases
from stator.epoch.reports import SplitReport, StateReport
from stator.errors import ConfigError
from stator_operator import naming
from stator_operator.resources import service
from tests.unit.operator_fakes import Bed
from tests.unit.two_regions import running_job

TOKEN = "s3cr3t"
CONSOLE_DIR = Path(cli_console.__file__).parents[1] / "control" / "console"


def get(url: str, token: str | None = None) -> tuple[int, dict[str, str], bytes]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, ControlServer]]:
    server = ControlServer(running_job(tmp_path), "127.0.0.1", 0, token=TOKEN)
    server.start()
    yield f"http://127.0.0.1:{server.port}", server
    server.stop()


# ---------------------------------------------------------------------- the history


def status(records_in: int, records_out: int = 0) -> JobStatus:
    return JobStatus("j", records_in=records_in, records_out=records_out)


def test_the_history_keeps_only_its_newest_samples_and_epochs() -> None:
    timeline = Timeline(samples=3, epochs=2)
    for i in range(10):
        timeline.sample(status(100 * i), at_ms=1000 * i)
        timeline.epoch_done(EpochResult(i, False, 10, 5, 0.25, [], 0, []))
    times, values = timeline.samples()
    assert times == (7000, 8000, 9000)
    # A rate is per second from the sample before: the oldest kept has none.
    assert values["records_in"] == (None, 100.0, 100.0)
    assert [e.epoch for e in timeline.epochs()] == [8, 9]
    assert timeline.epochs()[-1].duration_ms == 250
    answer = timeline.time_series()
    assert answer.capacity == 3 and len(answer.t_ms) == 3


def test_a_rate_is_per_second_over_its_window_and_none_where_its_counter_went_back() -> None:
    """Epochs of 2 s that read 200 records each, sampled every second: the rate over two
    samples would swing between 0 and 200 records/s; over five it stays near the truth."""
    timeline = Timeline()
    counts = [0, 0, 200, 200, 400, 400, 600, 600, 800]
    for second, count in enumerate(counts):
        timeline.sample(status(count), at_ms=1000 * second)
    rates = timeline.samples()[1]["records_in"]
    assert rates[:3] == (None, 0.0, 100.0)  # fewer samples than the window: all of them
    assert rates[5:] == (80.0, 120.0, 80.0, 120.0), "within 20% of the 100 records/s"
    timeline = Timeline()
    for second, count in enumerate([0, 100, 200, 50, 150, 250, 350, 450, 550]):
        timeline.sample(status(count), at_ms=1000 * second)
    rates = timeline.samples()[1]["records_in"]
    assert rates[3:8] == (None,) * 5, "a counter that went back in the window: no rate"
    assert rates[8] == 100.0


def test_a_restart_seen_by_a_sample_is_a_failover_with_the_error() -> None:
    timeline = Timeline(failovers=2)
    for at_ms, restarts in ((0, 0), (1000, 1), (2000, 1), (3000, 3), (4000, 4)):
        st = replace(status(0), restarts=restarts, last_error=f"boom {restarts} " + "x" * 600)
        timeline.sample(st, at_ms=at_ms)
    failovers = timeline.failovers()
    assert [(f.at_ms, f.restarts) for f in failovers] == [(3000, 3), (4000, 4)], "the last two"
    assert failovers[0].error is not None and failovers[0].error.startswith("boom 3")
    assert len(failovers[0].error) == 500


def test_a_series_is_one_line_and_reaches_the_answer() -> None:
    busy = Series("busy_ratio", "ratio", "load", "gauge", lambda st: st.epoch / 10)
    timeline = Timeline(series=(*SERIES, busy))
    timeline.sample(replace(status(0), epoch=5), at_ms=1)
    answer = timeline.time_series()
    assert ("busy_ratio", "ratio", "load") in [(s.name, s.unit, s.group) for s in answer.series]
    assert answer.values["busy_ratio"] == (0.5,)


def test_a_latency_series_is_the_p99_of_what_its_window_observed() -> None:
    """Seconds 0-4 observe 100 records at 4 ms each, then every second 100 at 900 ms: the p99
    of the window follows the new latency once it dominates, where a p99 since the start
    would stay far lower; a second without records shows none."""
    grown: list[Histogram] = []
    h = Histogram()
    for second in range(12):
        if second < 5:
            h.observe(4, 100)
        elif second != 11:
            h.observe(900, 100)
        grown.append(Histogram(counts=list(h.counts), sum_ms=h.sum_ms))
    latency = Series("lat", "ms", "latency", "p99", lambda st: tuple(grown[st.epoch].counts))
    timeline = Timeline(series=(latency,))
    for second in range(12):
        timeline.sample(replace(status(0), epoch=second), at_ms=1000 * second)
    p99 = timeline.samples()[1]["lat"]
    assert p99[0] is None, "no window before the first sample"
    assert p99[1] is not None and p99[1] <= 5, "only the 4 ms records"
    assert p99[10] is not None and 500 < p99[10] <= 1000, "the window holds only 900 ms"
    assert grown[7].quantile(0.5) <= 5 and p99[7] is not None and p99[7] > 500
    timeline = Timeline(series=(latency,))
    timeline.sample(replace(status(0), epoch=11), at_ms=0)
    timeline.sample(replace(status(0), epoch=0), at_ms=1000)
    assert timeline.samples()[1]["lat"] == (None, None), "counts that went back: a reset"
    names = {s.name: s.kind for s in SERIES}
    assert names["processing_latency_p99"] == names["committed_latency_p99"] == "p99"
    empty = Timeline()
    empty.sample(status(0), at_ms=0)
    empty.sample(status(0), at_ms=1000)
    assert empty.samples()[1]["processing_latency_p99"] == (None, None), "nothing observed"


def test_history_answer_reads_back_and_holds_the_checkpoints(tmp_path: Path) -> None:
    timeline = Timeline()
    timeline.sample(status(0), at_ms=1)
    timeline.sample(status(50), at_ms=1001)
    stamps = [SplitReport("in", "gen-0", 4, 0, 50, started_ms=1005, ended_ms=1030)]
    stamps.append(StateReport("sum", 0, 4, 0, 50, 40, started_ms=1031, ended_ms=1090))
    timed = phases(1000, 1002, stamps, 1095, 1100)
    timeline.epoch_done(EpochResult(4, False, 50, 40, 0.5, [], 0, [], "a-in", timed))
    data = history_info(running_job(tmp_path), timeline).to_wire()
    history = HistoryInfo.from_wire(json.loads(json.dumps(data)))
    assert history.to_wire() == data, "the answer is the schema's"
    assert history.samples.t_ms == (1, 1001)
    assert history.samples.values["records_in"] == (None, 50.0)
    assert [(c.id, c.status) for c in history.checkpoints] == [(2, "COMPLETED"), (3, "FAILED")]
    assert [(e.epoch, e.duration_ms, e.region) for e in history.epochs] == [(4, 500, "a-in")]
    assert history.epochs[0].phases == {
        "submitted": 2,
        "source_start": 5,
        "source_end": 30,
        "keyed_start": 31,
        "keyed_input": 0,  # not stamped: no such task
        "keyed_processed": 0,
        "keyed_end": 90,
        "job_end": 95,
        "handed_off": 100,
    }
    assert history.failovers == ()
    assert history.samples.interval_ms == 1000 and history.epochs_capacity == 1000


def test_the_server_samples_the_status_by_itself(served: tuple[str, ControlServer]) -> None:
    base, _ = served
    code, _, body = get(base + "/v1/history", TOKEN)
    data = json.loads(body)
    assert code == 200 and HistoryInfo.from_wire(data).to_wire() == data
    assert len(data["samples"]["t_ms"]) >= 1, "sampled at start, then once a second"
    assert [c["id"] for c in data["checkpoints"]] == [2, 3]


def test_a_number_on_the_wire_is_finite_and_not_negative() -> None:
    assert from_wire(float, 3) == 3.0
    for bad in (-1.0, float("nan"), float("inf"), True, "1"):
        with pytest.raises(WireError):
            from_wire(float, bad)


# ---------------------------------------------------------------------- the job graph


def test_the_job_answer_has_the_graph_with_regions_and_key_groups(
    served: tuple[str, ControlServer],
) -> None:
    base, _ = served
    job = JobInfo.from_wire(json.loads(get(base + "/v1/job", TOKEN)[2]))
    assert job.graph is not None
    nodes = {n.label: n for n in job.graph.nodes}
    assert set(nodes) == {"a-in", "a-count", "a-out", "b-in", "map", "b-out"}
    assert (nodes["a-in"].kind, nodes["map"].kind, nodes["a-out"].kind) == ("source", "map", "sink")
    count = nodes["a-count"]
    assert (count.region, count.parallelism) == ("a-in", 2)
    assert count.key_groups == ((0, 64), (64, 128))
    assert nodes["a-count"].inputs == (nodes["a-in"].id,)
    assert nodes["b-out"].region == "b-in" and nodes["map"].key_groups == ()


# ---------------------------------------------------------------------- files, token, headers


def test_data_needs_the_token_and_the_consoles_files_do_not(
    served: tuple[str, ControlServer],
) -> None:
    base, _ = served
    for path in ("/v1/history", "/v1/job", "/v1/checkpoints", "/v1/savepoints", "/metrics"):
        for token in (None, "wrong"):
            code, headers, _ = get(base + path, token)
            assert code == 401, (path, token)
            assert headers["X-Content-Type-Options"] == "nosniff", "refusals carry them too"
    code, headers, page = get(base + "/console/")
    assert code == 200 and headers["Content-Type"].startswith("text/html")
    assert b'<script type="module" src="app.js"></script>' in page
    assert b"running" not in page.lower(), "the page holds no data of the job"
    for name, kind in (("app.js", "text/javascript"), ("style.css", "text/css")):
        code, headers, _ = get(f"{base}/console/{name}")
        assert code == 200 and headers["Content-Type"].startswith(kind), name
    assert get(base + "/console/nope.js")[0] == 404
    assert get(base + "/console/%2e%2e/v1/job")[0] in (401, 404), "no way around the token"
    assert get(base + "/console/..%2fv1%2fjob")[0] in (401, 404)


def test_the_read_only_token_may_get_but_not_change_the_job(tmp_path: Path) -> None:
    """The operator's second token (NAME-read: monitors, the console) reads every route and is
    refused, 403, on what would change the job; the control token still does both; a read
    token without a control token is refused as configuration."""
    server = ControlServer(running_job(tmp_path), "127.0.0.1", 0, TOKEN, reader_token="look")
    server.start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        for path in ("/v1/job", "/v1/history", "/v1/checkpoints", "/v1/savepoints", "/metrics"):
            assert get(base + path, "look")[0] == 200, path
        for path, body in (("/v1/savepoints", b"{}"), ("/v1/handover", b"{}")):
            request = urllib.request.Request(
                base + path, data=body, method="POST", headers={"Authorization": "Bearer look"}
            )
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=10)
            assert refused.value.code == 403, path
            assert b"read-only" in refused.value.read()
        assert list(server.driver.savepoints.all()) == [], "nothing was triggered"
        request = urllib.request.Request(
            base + "/v1/savepoints",
            data=b"{}",
            method="POST",
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        with urllib.request.urlopen(request, timeout=10) as resp:
            assert resp.status == 202, "the control token still writes"
    finally:
        server.stop()
    with pytest.raises(
        ConfigError, match=r"control\.read_token_file is set without control\.token_file"
    ):
        load_config(None, ["control.read_token_file=/x"])


def test_every_answer_has_the_security_headers(served: tuple[str, ControlServer]) -> None:
    base, _ = served
    for path, token in (
        ("/console/", None),
        ("/console/app.js", None),
        ("/console/missing", None),
        ("/v1/job", TOKEN),
        ("/healthz", None),
    ):
        _, headers, _ = get(base + path, token)
        for key, value in HEADERS.items():
            assert headers.get(key) == value, (path, key)
    csp = HEADERS["Content-Security-Policy"]
    assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp


def test_console_redirects_to_its_directory_keeping_no_data(
    served: tuple[str, ControlServer],
) -> None:
    base, _ = served

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    with pytest.raises(urllib.error.HTTPError) as found:
        opener.open(base + "/console", timeout=10)
    assert found.value.code == 302 and found.value.headers["Location"] == "/console/"


def test_the_console_is_read_only_and_runs_no_inline_code() -> None:
    """It only reads (GET): no savepoint, no stop; its HTML has no inline script or style
    (the policy would block them) and its scripts never write HTML from strings."""
    scripts = {p.name: p.read_text() for p in CONSOLE_DIR.glob("*.js")}
    assert {"app.js", "dom.js", "graph.js", "plot.js"} <= set(scripts)
    for name, text in scripts.items():
        assert not re.search(r"method\s*:", text), name
        assert not re.search(r"\b(POST|PUT|DELETE|PATCH)\b", text), name
        assert "innerHTML" not in text and "outerHTML" not in text, name
        assert "eval(" not in text and "document.write" not in text, name
    html = (CONSOLE_DIR / "index.html").read_text()
    assert re.findall(r"<script[^>]*>", html) == ['<script type="module" src="app.js">']
    assert "style=" not in html and "<style" not in html and "on" + "click" not in html


# ---------------------------------------------------------------------- stator console


def test_the_token_rides_in_the_fragment_and_is_printed_only_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_console.console_url("http://h:1", "a/b c") == "http://h:1/console/#token=a%2Fb%20c"
    assert cli_console.console_url("http://h:1", None) == "http://h:1/console/"
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    args = ["console", "--url", "http://127.0.0.1:9/", "--token-file", str(token_file)]
    assert main([*args, "--no-browser"]) == 0
    out = capsys.readouterr().out
    assert "http://127.0.0.1:9/console/" in out and TOKEN not in out
    assert main([*args, "--no-browser", "--show-token"]) == 0
    assert f"http://127.0.0.1:9/console/#token={TOKEN}" in capsys.readouterr().out


def test_console_needs_a_pipeline_or_a_url(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["console"]) == 2
    assert main(["console", "p", "--url", "http://x"]) == 2
    assert main(["console", "p", "--token-file", "/t"]) == 2
    assert "--token-file goes with --url" in capsys.readouterr().err


def test_the_cli_uses_the_operators_names() -> None:
    assert f"p{cli_console.SECRET_SUFFIX}" == naming.read_secret_name("p")
    assert cli_console.TOKEN_KEY == naming.CONTROL_TOKEN_KEY
    assert cli_console.CONTROL_PORT == naming.CONTROL_PORT
    svc = service({"metadata": {"name": "p", "namespace": "ns", "uid": "u"}})
    assert svc["metadata"]["name"] == f"p{cli_console.SERVICE_SUFFIX}"
    assert svc["spec"]["ports"][0]["port"] == cli_console.CONTROL_PORT
    hint = naming.console_hint("p", "ns")
    assert hint["service"] == svc["metadata"]["name"] and hint["path"] == "/console/"


def test_the_pipeline_status_tells_how_to_open_the_console(tmp_path: Path) -> None:
    bed = Bed(tmp_path)
    bed.deploy()
    bed.step()
    assert bed.status["console"] == {
        "command": "stator console counts -n team",
        "service": "counts-driver",
        "path": "/console/",
    }
