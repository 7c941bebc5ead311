"""``make demo-local``: the main job on embedded defaults, with a crash in the middle.

Runs examples/windowed_count.py (generator -> keyed event-time window count -> exactly-once
file sink, checkpoints on local disk) as a real ``stator run`` process, kills it with SIGKILL
after a few checkpoints, restarts it (it restores from the latest checkpoint), and compares
the committed output with a failure-free run of the same job, record for record.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from stator.sinks import read_committed

ROOT = Path(__file__).resolve().parent.parent
PIPELINE = "examples.windowed_count:build"


def start(work: Path, name: str, log_name: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "STATOR_DEMO_OUT": f"file://{work}/{name}/out",
        "PYSPARK_PYTHON": sys.executable,
    }
    argv = [
        sys.executable,
        "-m",
        "stator",
        "run",
        PIPELINE,
        "--set",
        f"checkpoint.storage=file://{work}/{name}/checkpoints",
        "--set",
        f"state.local_dir={work}/{name}/state",
        "--set",
        "epoch.max_records=60000",
        "--set",
        "spark.master=local[2]",
    ]
    log = (work / f"{log_name}.log").open("ab")
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=log, start_new_session=True)


def checkpoints(work: Path, name: str) -> int:
    return len(list((work / name / "checkpoints").glob("*/chk-*/_metadata")))


def finish(proc: subprocess.Popen[bytes], work: Path, log_name: str) -> None:
    if proc.wait(600) != 0:
        print((work / f"{log_name}.log").read_text()[-4000:])
        raise SystemExit(f"{log_name} failed")


def main() -> int:
    work = Path(tempfile.gettempdir()) / "stator-data" / "demo"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    t0 = time.monotonic()
    print(f"demo: running {PIPELINE} (600,000 events, 200 keys, 1-minute windows) in {work}")

    crashed = start(work, "crashed", "crashed-1")
    while checkpoints(work, "crashed") < 3:
        if crashed.poll() is not None:
            finish(crashed, work, "crashed-1")
        time.sleep(0.1)
    os.killpg(crashed.pid, signal.SIGKILL)
    crashed.wait()
    n = checkpoints(work, "crashed")
    print(f"[{time.monotonic() - t0:5.1f}s] killed the job with SIGKILL after {n} checkpoints")
    restarted = start(work, "crashed", "crashed-2")
    finish(restarted, work, "crashed-2")
    print(f"[{time.monotonic() - t0:5.1f}s] restarted job finished (restored from checkpoint)")

    reference = start(work, "reference", "reference")
    finish(reference, work, "reference")
    print(f"[{time.monotonic() - t0:5.1f}s] failure-free reference run finished")

    got: list[dict[str, Any]] = read_committed(f"file://{work}/crashed/out")
    want: list[dict[str, Any]] = read_committed(f"file://{work}/reference/out")
    total = sum(r["count"] for r in got)
    print(f"committed windows: {len(got)} (reference: {len(want)}); events counted: {total:,}")
    print("first windows:", json.dumps(sorted(got, key=lambda r: (r["start"], r["key"]))[:3]))
    if got == want and total == 600_000:
        print("demo: OK - output after the crash equals the failure-free run, record for record")
        return 0
    print("demo: MISMATCH between the crashed and the reference run")
    return 1


if __name__ == "__main__":
    sys.exit(main())
