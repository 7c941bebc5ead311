"""One uploader process per executor: the Python daemon starts it before it forks any worker,
and every worker hands its uploads to it over a Unix socket (``uploads.submit``).

One per worker, as before, cost each worker's first checkpoint a Python process importing
boto3 and building an S3 client (~0.3 s of CPU on this machine), on cores the job was using.

Serving, step by step:

1. ``start`` (in the daemon, single-threaded, before ``manager()``): a socket bound in a
   private directory (0700) and listening, handed to the uploader process it starts, and
   its path put in the environment the forked workers inherit (a worker that connects before
   the uploader runs waits in the backlog). Failure (no writable temp directory, no
   process): logged, nothing set: each worker starts its own uploader as before.
2. ``serve`` (the uploader): each worker's connection gets a thread that reads its jobs in
   the order sent; jobs run one at a time (each sends its files in parallel threads, and the
   one S3 client's connection pool is sized for that). A job whose bytes were sent is the
   uploader's even if its worker exits the next moment: the socket holds them until read.
   An error accepting a connection is logged and the uploader goes on.
3. When the daemon is gone (the executor stopped or was killed: the uploader is re-parented),
   it accepts what is still waiting in the backlog, finishes every job it read and exits. A
   killed executor's pod takes it along; in a local run, whoever kills the executor's
   process tree does. A directory an uploader killed with its executor left behind (one
   socket nobody listens on) is removed by the next ``start`` on the machine
   (``remove_stale``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from ..storage import ObjectStore
from . import uploads
from .uploads import UPLOADER_SOCKET_ENV

log = logging.getLogger("stator.checkpoint")

ACCEPT_TIMEOUT_S = 1.0  # how often the uploader checks that its daemon still lives
DIR_PREFIX = "stator-uploader-"
# A directory younger than this may be an executor's that is starting (bound, not listening).
STALE_AFTER_S = 60.0


def remove_stale(parent: str, now: float | None = None) -> list[str]:
    """Remove the uploader directories under ``parent`` whose socket nobody listens on (their
    uploader was killed: SIGKILL skips step 3's clean-up); returns them. Best effort: another
    user's, or one that cannot be checked, is left alone."""
    now = time.time() if now is None else now
    removed = []
    with contextlib.suppress(OSError), os.scandir(parent) as entries:
        for entry in entries:
            if not entry.name.startswith(DIR_PREFIX) or not entry.is_dir(follow_symlinks=False):
                continue
            try:
                info = entry.stat()
                if info.st_uid != os.getuid() or now - info.st_mtime < STALE_AFTER_S:
                    continue
                if _answers(os.path.join(entry.path, "socket")):
                    continue
            except OSError:
                continue
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
    return removed


def _answers(path: str) -> bool:
    """Does an uploader listen at ``path``? A socket file without a listener refuses."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)  # a full backlog: busy, so alive (TimeoutError is an OSError)
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            return False
    return True


def start() -> None:
    """Step 1 of the module docstring."""
    directory = ""
    remove_stale(tempfile.gettempdir())
    try:
        directory = tempfile.mkdtemp(prefix=DIR_PREFIX)
        path = os.path.join(directory, "socket")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listening:
            listening.bind(path)
            listening.listen(64)
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
            code = "from stator.checkpoint.executor_uploader import main; main()"
            fd = listening.fileno()
            subprocess.Popen(
                [sys.executable, "-c", code, path, str(fd), str(os.getpid())],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env=env,
                close_fds=True,
                pass_fds=(fd,),
            )
    except OSError as exc:
        log.warning("no executor uploader (%s): each Python worker starts its own", exc)
        if directory:
            shutil.rmtree(directory, ignore_errors=True)
        return
    os.environ[UPLOADER_SOCKET_ENV] = path


def serve(server: socket.socket, path: str, daemon_pid: int) -> None:
    """Steps 2-3 of the module docstring, on ``server`` (listening at ``path``)."""
    server.settimeout(ACCEPT_TIMEOUT_S)
    stores: dict[bytes, ObjectStore] = {}  # one client per store, shared by the threads
    one_at_a_time = threading.Lock()
    threads: list[threading.Thread] = []

    def serve_one(conn: socket.socket) -> None:
        conn.settimeout(None)
        thread = threading.Thread(target=_run_jobs, args=(conn, stores, one_at_a_time), daemon=True)
        thread.start()
        threads[:] = [t for t in threads if t.is_alive()] + [thread]

    try:
        while os.getppid() == daemon_pid:
            try:
                serve_one(server.accept()[0])
            except TimeoutError:
                continue
            except OSError as exc:  # e.g. out of descriptors: the next accept may work
                log.warning("executor uploader: accepting a connection failed: %s", exc)
                time.sleep(ACCEPT_TIMEOUT_S / 10)
        server.setblocking(False)  # the daemon is gone: what already connected is served
        while True:
            try:
                serve_one(server.accept()[0])
            except OSError:  # BlockingIOError: the backlog is empty
                break
    finally:
        server.close()
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)
        for thread in threads:
            thread.join()


def _run_jobs(
    conn: socket.socket, stores: dict[bytes, ObjectStore], one_at_a_time: threading.Lock
) -> None:
    """One worker's jobs, in order, until it closes its end."""
    with contextlib.closing(conn), conn.makefile("rb") as jobs:
        uploads.serve(jobs, stores, one_at_a_time)


def main() -> None:
    """Entry point of the uploader process (``start`` starts it): argv is the socket's path,
    its listening descriptor and the daemon's process id."""
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the executor
    path, fd, daemon_pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    serve(socket.socket(fileno=fd), path, daemon_pid)
