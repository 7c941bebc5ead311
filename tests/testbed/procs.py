"""Start, watch and stop the test bed's server processes.

Every process gets its own session (process group), so stopping it also stops anything it
spawned; its output goes to a log file in its own directory, and a failure to become ready
reports the tail of that log instead of a bare timeout.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A port that is free on loopback right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


class ProcessFailed(RuntimeError):
    """A test bed process died or never became ready; the message carries its log tail."""


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return "(no log written)"
    return "\n".join(text.strip().splitlines()[-lines:])


@dataclass
class ManagedProcess:
    """One server process of the test bed."""

    name: str
    argv: Sequence[str]
    workdir: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        return self.workdir / f"{self.name}.log"

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} was never started"
        return self.proc.pid

    def start(self) -> ManagedProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                list(self.argv),
                cwd=self.workdir,
                env={**os.environ, **self.env},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, probe: Callable[[], bool], timeout: float, what: str = "ready") -> None:
        """Poll ``probe`` until it is true; fail early, with the log, if the process exits."""
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if not self.alive():
                code = self.proc.returncode if self.proc else None
                raise ProcessFailed(
                    f"{self.name} exited with code {code} before it was {what}.\n"
                    f"--- last lines of {self.log}:\n{log_tail(self.log)}"
                )
            try:
                if probe():
                    return
            except Exception as exc:
                last_error = exc
            time.sleep(0.2)
        raise ProcessFailed(
            f"{self.name} was not {what} after {timeout:.0f}s (last probe error: {last_error}).\n"
            f"--- last lines of {self.log}:\n{log_tail(self.log)}"
        )

    def signal(self, sig: signal.Signals) -> None:
        if self.alive():
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the process group, then SIGKILL whatever is left after ``grace`` seconds."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.proc.wait(5)
        # Children that ignored SIGTERM (e.g. a JVM's forks) still share the group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def kill(self) -> None:
        """SIGKILL now, as a crash would: no chance to clean up."""
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(10)
