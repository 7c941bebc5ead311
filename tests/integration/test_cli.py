"""The ``stator`` command line: running, inspecting checkpoints, and clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
