"""``examples/fraud_detection.py`` on real Spark, against its plain-Python model record for
record: rescaled 3 -> 5 -> 2 through savepoints (canonical, then native) on fresh local disks
each time, so every new subtask restores its keyed, timer, TTL and broadcast state from the
savepoint; and run as a real ``stator run`` process on ``local-cluster`` whose Python worker,
executor JVM and driver are killed with SIGKILL and restarted from its checkpoints. The
model does not depend on where epochs end (late transactions are 20 minutes behind; an epoch
here spans at most 200 s), so a run cut anywhere must still equal it."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

from examples.fraud_detection import build
from stator import Job
from stator.config import JobConfig
from stator.sinks import FileSink, read_committed
from tests.helpers import python_workers, stop_with_savepoint_after, with_overrides
from tests.pipelines.fraud_model import expected

ROOT = Path(__file__).resolve().parents[2]
TRANSACTIONS, EPOCH = 16_000, 3_000
SEED = int(os.environ.get("STATOR_FRAUD_SEED", str(random.SystemRandom().randrange(10**6))))
EXECUTOR = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


def _as_json(records: Counter[Any]) -> Counter[str]:
    """Records as the file sink commits them (JSON), as comparable text."""
    return Counter(
        {json.dumps(list(r) if isinstance(r, tuple) else r): n for r, n in records.items()}
    )


def _committed(out: str) -> tuple[Counter[str], Counter[str], Counter[str]]:
    def read(name: str) -> Counter[str]:
        return Counter(json.dumps(r) for r in read_committed(f"{out}/{name}"))

    return read("alerts"), read("sessions"), read("late")


def _assert_equals_model(out: str) -> None:
    alerts, sessions, late = _committed(out)
    want_alerts, want_sessions, want_late = (_as_json(c) for c in expected(TRANSACTIONS))
    assert late == want_late
    assert sessions == want_sessions
    assert alerts == want_alerts


def _job(out: str) -> Any:
    return build(
        FileSink(f"{out}/alerts"),
        FileSink(f"{out}/sessions"),
        FileSink(f"{out}/late"),
        transactions=TRANSACTIONS,
        max_parallelism=32,
    )


def test_rescaled_3_5_2_through_savepoints(
    spark: Any, job_config: JobConfig, tmp_path: Path
) -> None:
    out = f"file://{tmp_path}/out"
    base = with_overrides(
        job_config, epoch={"max_records": EPOCH}, savepoint={"dir": f"file://{tmp_path}/sp"}
    )
    phases = [(3, "canonical", 4), (5, "native", 9), (2, "canonical", None)]
    restore = "latest"
    for parallelism, fmt, stop_after in phases:
        cfg = with_overrides(
            base,
            parallelism=parallelism,
            restore={"source": restore},
            savepoint={"format_type": fmt},
            state={"local_dir": str(tmp_path / f"pod-{parallelism}")},  # fresh disks
        )
        driver = Job(_job(out), cfg, spark)
        if stop_after is not None:
            stop_with_savepoint_after(driver, stop_after)
        status = driver.run()
        if stop_after is None:
            assert status.finished
        else:
            assert status.state == "STOPPED" and status.stopped_with_savepoint
            restore = status.stopped_with_savepoint
    _assert_equals_model(out)


class Run:
    """``stator run`` of the example as its own process group, restartable."""

    def __init__(self, workdir: Path, master: str = "local[2]") -> None:
        self.workdir, self.starts, self.master = workdir, 0, master
        self.out = f"file://{workdir}/out"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.starts += 1
        argv = [sys.executable, "-m", "stator", "run", "examples/fraud_detection.py:pipeline"]
        for setting in (
            f"checkpoint.storage=file://{self.workdir}/ck",
            f"state.local_dir={self.workdir}/state",
            f"epoch.max_records={EPOCH}",
            "parallelism=3",
            f"spark.master={self.master}",
            "restart.delay_ms=200",
        ):
            argv += ["--set", setting]
        env = {
            **os.environ,
            "STATOR_FRAUD_OUT": self.out,
            "STATOR_FRAUD_TRANSACTIONS": str(TRANSACTIONS),
            "STATOR_FRAUD_RATE": "1200",
        }
        log = (self.workdir / f"driver-{self.starts}.log").open("ab")
        self.proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=log, stderr=log, start_new_session=True
        )

    def checkpoints(self) -> int:
        """The newest completed checkpoint's id (0 before the first). Retention deletes old
        checkpoint directories while this looks: a directory gone mid-glob is looked at again."""
        for _ in range(10):
            try:
                found = self.workdir.glob("ck/**/chk-*/_metadata")
                return max((int(p.parent.name.split("-")[1]) for p in found), default=0)
            except FileNotFoundError:
                continue
        return 0

    def wait_for_checkpoint(self, n: int, timeout: float = 240) -> bool:
        """True once checkpoint ``n`` completed; False if the job ended first."""
        deadline = time.monotonic() + timeout
        assert self.proc is not None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                assert self.proc.returncode == 0, self.log_tail()
                return False
            if self.checkpoints() >= n:
                return True
            time.sleep(0.1)
        raise TimeoutError(f"checkpoint {n} not reached in {timeout}s\n{self.log_tail()}")

    def kill_driver(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def workers(self) -> list[psutil.Process]:
        assert self.proc is not None
        return python_workers(self.proc.pid)

    def executors(self) -> list[psutil.Process]:
        """The job's executor JVMs (``local-cluster``)."""
        assert self.proc is not None
        found = []
        for p in psutil.Process(self.proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                if EXECUTOR in p.cmdline():
                    found.append(p)
        return found

    def wait(self, timeout: float = 300) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def log_tail(self) -> str:
        logs = sorted(self.workdir.glob("driver-*.log"))
        return "\n".join(f"--- {p.name}:\n" + p.read_text(errors="replace")[-3000:] for p in logs)


def test_killed_python_worker_executor_and_driver(tmp_path: Path) -> None:
    """On ``local-cluster`` (executors are JVMs of their own): a Python worker, then an
    executor JVM with its workers, then the whole driver are SIGKILLed at seeded points after
    checkpoints; the restarted job must still equal the model."""
    rng = random.Random(SEED)
    print(f"seed {SEED}")
    run = Run(tmp_path, master="local-cluster[2,1,1024]")
    run.start()
    # Every run commits at least ceil(16,000 / 3,000) = 6 checkpoints, so kill points up to
    # 5 are always reached with work left for the restarted driver (a point past the run's
    # last checkpoint made the test depend on how the generator's epochs happened to split).
    points = sorted(rng.sample(range(2, 6), 3))
    killed: list[str] = []
    for point, victim in zip(points, ("python worker", "executor", "driver"), strict=True):
        if not run.wait_for_checkpoint(point):
            break
        time.sleep(rng.uniform(0, 0.4))
        if victim == "python worker" and (workers := run.workers()):
            rng.choice(workers).kill()
        elif victim == "executor" and (executors := run.executors()):
            jvm = rng.choice(executors)
            for proc in [jvm, *jvm.children(recursive=True)]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc.kill()
        elif victim == "driver":
            run.kill_driver()
            run.start()
        else:
            continue
        killed.append(victim)
    assert killed == ["python worker", "executor", "driver"], (killed, run.log_tail())
    assert run.wait() == 0, run.log_tail()
    _assert_equals_model(run.out)
