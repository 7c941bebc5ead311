"""The ``stator`` command line: running, inspecting checkpoints, and clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from stator.sinks import read_committed
from tests.testbed.procs import free_port

ROOT = Path(__file__).resolve().parents[2]


def stator(
    *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stator", *args],
        check=False,
        cwd=ROOT,
        text=True,
        capture_output=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "no.such.module:build"], "cannot import pipeline module 'no.such.module'"),
        (["run", "examples.keyed_count:nope"], "has no function 'nope'; it has: build"),
        (["run", "examples.keyed_count"], "must be MODULE:FUNCTION"),
        (
            ["run", "examples.keyed_count:build", "--set", "checkpoint.retaind=2"],
            "did you mean 'checkpoint.retained'",
        ),
        (
            ["run", "examples.keyed_count:build", "--set", "epoch.max_records=lots"],
            "epoch.max_records must be an integer",
        ),
        (
            ["run", "examples.keyed_count:build", "--set", "checkpoint.storage=ftp://x/y"],
            "unsupported storage URI 'ftp://x/y'",
        ),
        (["checkpoints", "show", "file:///nonexistent/chk-0000000001"], "no checkpoint at"),
    ],
)
def test_errors_name_the_problem(args: list[str], message: str) -> None:
    result = stator(*args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_unreachable_store_fails_fast_and_clearly(tmp_path: Path) -> None:
    port = free_port()  # nothing listens here
    result = stator(
        "run",
        "examples.keyed_count:build",
        "--set",
        "checkpoint.storage=s3://bucket/ck",
        "--set",
        f"s3.endpoint_url=http://127.0.0.1:{port}",
        "--set",
        "s3.max_attempts=1",
        "--set",
        "s3.connect_timeout_s=1",
        env={"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "secret-value"},
    )
    assert result.returncode == 2
    assert f"S3 endpoint http://127.0.0.1:{port} is unreachable" in result.stderr
    assert "secret-value" not in result.stderr + result.stdout


def test_run_then_inspect_checkpoints(tmp_path: Path) -> None:
    out = f"file://{tmp_path}/out"
    result = stator(
        "run",
        "examples.keyed_count:build",
        "--set",
        f"checkpoint.storage=file://{tmp_path}/ck",
        "--set",
        f"state.local_dir={tmp_path}/state",
        "--set",
        "epoch.max_records=40000",
        "--set",
        "spark.master=local[2]",
        env={"STATOR_EXAMPLE_OUT": out, "STATOR_EXAMPLE_EVENTS": "100000"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["finished"] and summary["records_in"] == 100_000 and summary["epochs"] == 3
    final: dict[str, int] = {}
    for key, count in read_committed(out):
        final[key] = count
    assert sum(final.values()) == 100_000

    listed = stator("checkpoints", "list", f"file://{tmp_path}/ck/keyed-count", "--json")
    rows = json.loads(listed.stdout)
    assert [r["id"] for r in rows] == [1, 2, 3] and all(r["status"] == "completed" for r in rows)
    shown = stator(
        "checkpoints", "show", f"file://{tmp_path}/ck/keyed-count/chk-0000000003", "--json"
    )
    info = json.loads(shown.stdout)
    assert info["epoch"] == 3 and sorted(info["operators"]) == ["counts"]
    assert sum(s["state_bytes"] for s in info["operators"]["counts"]) == info["state_bytes"]
    assert info["sources"]["events"]["gen-0"]["finished"] is True


PIPELINE_FILE = """
import os
from dataclasses import dataclass

from helpers import key_of  # a sibling module: the file's directory is the import root
from stator import KeyedProcessFunction, Pipeline, ValueStateDescriptor
from stator.sinks import FileSink
from stator.sources import GeneratorSource, KeyedEvents


@dataclass
class Total:  # kept in state: pickled by reference, so workers must import this module
    key: str
    n: int


class Totals(KeyedProcessFunction):
    def open(self, ctx):
        self.total = ctx.get_state(ValueStateDescriptor("total"))

    def process_element(self, value, ctx):
        total = self.total.value() or Total(value[0], 0)
        total.n += 1
        if os.environ.get("STATOR_TEST_RAISE") and total.n > 3:
            value = {}["price"]
        self.total.update(total)
        yield total.key, total.n


def build():
    p = Pipeline("by-path", max_parallelism=32)
    events = p.source(GeneratorSource(KeyedEvents(num_keys=20, seed=1), count=400), uid="events")
    events.sink(FileSink(os.environ["STATOR_TEST_OUT"] + "-raw"), uid="raw")  # staged by sources
    (
        events
        .key_by(key_of)
        .process(Totals(), uid="totals")
        .sink(FileSink(os.environ["STATOR_TEST_OUT"]), uid="out")
    )
    return p
"""


def _pipeline_dir(tmp_path: Path) -> Path:
    pipes = tmp_path / "pipes"
    pipes.mkdir()
    (pipes / "by_path.py").write_text(PIPELINE_FILE)
    (pipes / "helpers.py").write_text("def key_of(event):\n    return event[0]\n")
    (pipes / "totals_pkg").mkdir()  # a package whose build comes from a top-level module
    (pipes / "totals_pkg" / "__init__.py").write_text("from by_path import build\n")
    (tmp_path / "elsewhere").mkdir()
    return pipes


def _run_args(
    tmp_path: Path, *extra: str, pipeline: str = "../pipes/by_path.py:build"
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "stator",
        "run",
        pipeline,  # by default relative to the working directory, not to ROOT
        "--set",
        f"checkpoint.storage=file://{tmp_path}/ck",
        "--set",
        f"state.local_dir={tmp_path}/state",
        "--set",
        "spark.master=local[2]",
        *extra,
    ]


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    # Only the runtime on the path: not the repository, not the pipeline's directory.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {
        **env,
        "PYTHONPATH": str(ROOT / "runtime"),
        "STATOR_TEST_OUT": f"file://{tmp_path}/out",
        **extra,
    }


@pytest.mark.parametrize(
    "layout",
    [
        "relative-file",  # ../pipes/by_path.py:build from a sibling directory
        "driver-pod",  # as the operator's driver pod runs it: an absolute reference, cwd /,
        # --config job.yaml and --restore latest; here a package directory
    ],
)
def test_pipeline_by_file_path_from_another_directory(tmp_path: Path, layout: str) -> None:
    pipes = _pipeline_dir(tmp_path)
    if layout == "relative-file":
        args, cwd = _run_args(tmp_path), tmp_path / "elsewhere"
    else:
        (tmp_path / "job.yaml").write_text(f"checkpoint:\n  storage: file://{tmp_path}/ck\n")
        args = _run_args(
            tmp_path,
            "--config",
            str(tmp_path / "job.yaml"),
            "--restore",
            "latest",
            "--set",
            "control.host=127.0.0.1",
            pipeline=f"{pipes}/totals_pkg:build",
        )
        cwd = Path("/")
    result = subprocess.run(
        args,
        check=False,
        cwd=cwd,
        text=True,
        capture_output=True,
        timeout=300,
        env=_env(tmp_path),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["finished"] and summary["records_in"] == 400
    final = dict(read_committed(f"file://{tmp_path}/out"))
    assert sum(final.values()) == 400  # running totals: the last one per key is its count
    assert len(final) == 20
    assert len(read_committed(f"file://{tmp_path}/out-raw")) == 400


def test_user_function_that_raises_ends_the_job_with_its_cause(tmp_path: Path) -> None:
    _pipeline_dir(tmp_path)
    port = free_port()
    started = time.monotonic()
    # Output to files: Spark logs every task failure at length, more than a pipe holds.
    with open(tmp_path / "stdout", "w") as out_f, open(tmp_path / "stderr", "w") as err_f:
        proc = subprocess.Popen(
            _run_args(tmp_path, "--set", f"control.port={port}", "--set", "restart.attempts=3"),
            cwd=tmp_path / "elsewhere",
            text=True,
            stdout=out_f,
            stderr=err_f,
            env=_env(tmp_path, STATOR_TEST_RAISE="1"),
        )
        status: dict[str, object] = {}
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/job", timeout=2) as r:
                    status = json.loads(r.read())
            except OSError:
                pass
            if status.get("state") == "FAILED":
                break
            time.sleep(0.5)
        proc.wait(timeout=120)
    stdout, stderr = (tmp_path / "stdout").read_text(), (tmp_path / "stderr").read_text()
    elapsed = time.monotonic() - started
    cause = "KeyError: 'price' in operator 'totals' key '"
    assert proc.returncode == 2, stderr[-3000:]
    assert status.get("state") == "FAILED", status
    assert str(status["last_error"]).startswith(cause) and "epoch 1" in str(status["last_error"])
    assert status["restarts"] == 0  # not retried through the restart strategy
    errors = [line for line in stderr.splitlines() if line.startswith("stator: error:")]
    assert len(errors) == 1 and cause in errors[0], stderr[-3000:]
    assert "it raised on all 4 attempts of its task" in errors[0]
    assert stderr.rstrip().splitlines()[-1] == errors[0]  # the last thing the user sees
    assert "Py4JJavaError" not in errors[0]
    # The user's traceback in the driver log, from their file down.
    assert 'by_path.py", line' in stderr and 'value = {}["price"]' in stderr
    assert not stdout.strip()
    # Staged output of the failed epoch was removed (the source tasks had staged the raw
    # sink's part before the keyed task failed); nothing was committed.
    for out in (tmp_path / "out", tmp_path / "out-raw"):
        assert not out.exists() or not [p for p in out.rglob("*") if p.is_file()], out
    # Its root exists only because a part was put there: staged, then removed (deleting
    # prunes the emptied directories below the root).
    assert (tmp_path / "out-raw").is_dir()
    assert elapsed < 120, elapsed


def standby(url: str) -> bool:
    """A pre-started driver waits for its hand-over (False while it is not serving yet)."""
    from tests.integration.control_calls import call

    try:
        return call(url, "/readyz") == (
            503,
            {"ready": False, "state": "STANDBY", "reason": "the job is STANDBY"},
        )
    except OSError:
        return False


def test_a_two_region_job_from_the_command_line(tmp_path: Path) -> None:
    """``stator job`` shows both regions of a running job; a second driver started with
    ``--await-handover`` (both regions at parallelism 3) waits in STANDBY; ``stator savepoint
    trigger --stop`` stops the first with one savepoint of both regions, the second is handed
    it and finishes the input; ``stator checkpoints list`` lists each region's checkpoints;
    each sink's committed running counts are exact across both processes."""
    from stator.sources import KeyedEvents
    from tests.integration.control_calls import call

    ports = [free_port(), free_port()]
    out = {name: f"file://{tmp_path}/out-{name}" for name in ("a", "b")}
    env = {"OUT_A": out["a"], "OUT_B": out["b"], "COUNT": "24000", "RATE": "600"}
    common = [
        "--set",
        f"checkpoint.storage=file://{tmp_path}/ck",
        "--set",
        f"savepoint.dir=file://{tmp_path}/sp",
        "--set",
        f"state.local_dir={tmp_path}/state",
        "--set",
        "spark.master=local[2]",
    ]

    def start(*more: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "stator", "run", "tests.pipelines.two_regions:build",
             *common, *more],
            cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        )  # fmt: skip

    first = start("--set", f"control.port={ports[0]}")
    second = start(
        "--await-handover", "--set", f"control.port={ports[1]}", "--set", "parallelism=3"
    )
    url, new = (f"http://127.0.0.1:{p}" for p in ports)
    try:
        deadline = time.monotonic() + 240
        while True:
            shown = stator("job", url, "--json")
            regions = json.loads(shown.stdout)["regions"] if shown.returncode == 0 else []
            if len(regions) == 2 and all(r["latest_checkpoint"] for r in regions):
                break
            assert time.monotonic() < deadline and first.poll() is None, shown.stderr
            time.sleep(1)
        text = stator("job", url).stdout
        assert "state=RUNNING" in text
        assert "region=in-a" in text and "region=in-b" in text and "nodes=in-a,count-a" in text
        # Pre-started: its Spark and warm Python workers come up, then it waits in STANDBY.
        while not standby(new):
            if second.poll() is not None:
                raise AssertionError(f"the pre-started driver exited: {second.communicate()}")
            assert time.monotonic() < deadline, "never STANDBY"
            time.sleep(1)
        stopped = stator("savepoint", "trigger", url, "--stop", "--json")
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        location = json.loads(stopped.stdout)["location"]
        assert first.wait(120) == 0
        assert call(new, "/v1/handover", "POST", {"restore": location})[0] == 202
        stdout, stderr = second.communicate(timeout=300)
        assert second.returncode == 0, stderr[-3000:]
        assert json.loads(stdout.strip().splitlines()[-1])["finished"]
    finally:
        for proc in (first, second):
            if proc.poll() is None:
                proc.kill()
    listed = json.loads(
        stator("checkpoints", "list", f"file://{tmp_path}/ck/two-regions", "--json").stdout
    )
    assert {r["region"] for r in listed} == {"in-a", "in-b"}
    for name, keys in (("a", 40), ("b", 25)):
        events = KeyedEvents(keys, seed=1 + keys).make(0, int(env["COUNT"]), 1)
        expected: dict[str, int] = {}
        for e in events:
            expected[e[0]] = expected.get(e[0], 0) + 1
        seen: dict[str, list[int]] = {}
        for key, total in read_committed(out[name]):
            seen.setdefault(key, []).append(total)
        assert all(t == sorted(set(t)) for t in seen.values()), f"{name}: committed twice"
        assert {k: t[-1] for k, t in seen.items()} == expected, name
