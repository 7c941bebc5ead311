"""Asynchronous checkpoint uploads (Flink's synchronous/asynchronous split): the uploader a
keyed task hands its files to, and the confirmations the driver completes a checkpoint on.

A keyed subtask's part of checkpoint N with ``checkpoint.async_upload``, step by step:

1. In the task (synchronous): commit the epoch, snapshot the database (hard links,
   ``locality/restore.py``) and plan the upload (``transfer.plan_upload``: every key is
   chosen now, under a token of this task attempt). The task reports the planned files and
   the token, submits the upload and returns: the epoch does not wait for the store. A
   failure here declines N in the report, as with synchronous uploads.
2. The executor's uploader sends the files: one process per executor, started by its
   Python daemon (``executor_uploader.py``), reached over a Unix socket; where there is none
   (a daemon that is not Stator's), a child process of the worker, started with its first
   upload. Either outlives the task and the worker (Spark closes a worker that idled for a
   minute, and a worker whose task failed exits with ``os._exit``, which would kill an
   upload thread mid-file). It dies with the executor's pod. If a put fails, or the
   checkpoint's deadline passes, it writes ``<upload dir>/_failed`` with the reason (best
   effort): N fails, the epoch stands. If no uploader can be started or reached, the task
   uploads synchronously instead.
3. With every file sent, it writes ``<upload dir>/_uploaded``: the confirmation.
4. The driver (``driver/in_flight.py``) completes N when every subtask's confirmation, under
   the token of the attempt whose report it kept, is in the store. A worker or executor that
   dies mid-upload writes neither: N fails at its deadline, or at once if the job fails over.
   The object store is the only channel, so a confirmation cannot outrun its files.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from ..storage import ObjectStore
from .transfer import UploadPlan, send_files, upload_dir

log = logging.getLogger("stator.checkpoint")

CONFIRMED = "_uploaded"
FAILED = "_failed"
# The executor uploader's socket (``executor_uploader.start`` sets it in the Python daemon).
UPLOADER_SOCKET_ENV = "STATOR_UPLOADER_SOCKET"


def confirmation_key(checkpoint_id: int, uid: str, subtask: int, token: str, name: str) -> str:
    return f"{upload_dir(checkpoint_id, uid, subtask, token)}/{name}"


@dataclass(frozen=True)
class UploadJob:
    """Steps 2-3 for one subtask: send ``plan``'s files from ``local_dir``, then confirm."""

    store: ObjectStore
    checkpoint_id: int
    uid: str
    subtask: int
    local_dir: Path
    plan: UploadPlan
    deadline_ms: int  # epoch milliseconds
    drop_copy: bool  # delete ``local_dir`` afterwards (local recovery is off)

    def key(self, name: str) -> str:
        return confirmation_key(self.checkpoint_id, self.uid, self.subtask, self.plan.token, name)


def run_upload(job: UploadJob) -> bool:
    """Steps 2-3 of the module docstring. Returns whether the upload was confirmed."""
    try:
        send_files(job.store, job.local_dir, job.plan.todo, job.deadline_ms)
        job.store.put(
            job.key(CONFIRMED),
            json.dumps({"files": len(job.plan.todo), "bytes": job.plan.bytes}).encode(),
        )
        return True
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"[:2000]
        log.warning(
            "checkpoint %d: upload of operator '%s' subtask %d failed: %s",
            job.checkpoint_id,
            job.uid,
            job.subtask,
            reason,
        )
        if time.time() * 1000 <= job.deadline_ms:  # past it, the driver has given up
            # The store may be unreachable: then the driver's deadline decides.
            with contextlib.suppress(Exception):
                job.store.put(job.key(FAILED), reason.encode())
        return False
    finally:
        if job.drop_copy:
            shutil.rmtree(job.local_dir, ignore_errors=True)


class ExecutorUploader:
    """This worker's connection to the executor's uploader (``executor_uploader.py``): jobs
    go over it pickled, in submission order, and run one at a time. A job written to the
    socket is the uploader's, even if this worker exits the next moment."""

    def __init__(self, path: str) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.connect(path)
        except OSError:
            self._sock.close()
            raise
        self._out = self._sock.makefile("wb")

    def submit(self, job: UploadJob) -> None:
        """Raises OSError if the uploader is gone (the caller then uploads itself)."""
        pickle.dump(job, self._out, protocol=pickle.HIGHEST_PROTOCOL)
        self._out.flush()

    def alive(self) -> bool:
        return True  # a closed uploader shows as an OSError on submit


class Uploader:
    """This worker's own uploader process, where the executor has none: jobs go to its
    stdin, pickled, in submission order, and run one at a time (each sends its files in
    parallel threads). A job written to the pipe is the child's, even if this worker exits
    the next moment; the child finishes every job it was given and exits when the pipe
    closes."""

    def __init__(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self._proc = subprocess.Popen(
            [sys.executable, "-c", "from stator.checkpoint.uploads import main; main()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            env=env,
            close_fds=True,
        )

    def submit(self, job: UploadJob) -> None:
        """Raises OSError if the uploader is gone (the caller then uploads itself)."""
        stdin = self._proc.stdin
        assert stdin is not None
        pickle.dump(job, stdin, protocol=pickle.HIGHEST_PROTOCOL)
        stdin.flush()

    def alive(self) -> bool:
        return self._proc.poll() is None


# By process id: a forked child gets its own.
_uploaders: dict[int, Uploader | ExecutorUploader] = {}
_lock = threading.Lock()


def submit(job: Any) -> bool:
    """Hand ``job`` (an :class:`UploadJob`, or a standby copy's job: ``locality/standby_copy.py``)
    to this process's uploader (started on first use). Returns False if it could not be
    handed over: the caller runs an upload itself."""
    with _lock:
        pid = os.getpid()
        current = _uploaders.get(pid)
        try:
            if current is None or not current.alive():
                current = _uploaders[pid] = _connect()
            current.submit(job)
            return True
        except (OSError, ValueError) as exc:
            _uploaders.pop(pid, None)
            log.warning("no uploader process (%s) for %s", exc, type(job).__name__)
            return False


def _connect() -> Uploader | ExecutorUploader:
    """The executor's uploader if its daemon started one, else an uploader of our own."""
    path = os.environ.get(UPLOADER_SOCKET_ENV)
    if path:
        try:
            return ExecutorUploader(path)
        except OSError as exc:
            log.warning("executor uploader at %s unreachable (%s): starting our own", path, exc)
    return Uploader()


def serve(
    jobs: BinaryIO,
    stores: dict[bytes, ObjectStore] | None = None,
    one_at_a_time: contextlib.AbstractContextManager[Any] | None = None,
) -> None:
    """Run every job read from ``jobs`` (a worker's pipe or socket) until it closes. One
    client per store, reused across jobs (``stores``: shared with other readers, which
    ``one_at_a_time`` then serializes)."""
    stores = {} if stores is None else stores
    while True:
        try:
            job = pickle.load(jobs)  # noqa: S301 (our own worker, a private channel)
        except (EOFError, pickle.UnpicklingError, OSError):  # the worker is gone (maybe mid-write)
            return
        if not isinstance(job, UploadJob):  # never in the way of a checkpoint's upload
            _background_jobs.put(job)
            _start_background_thread()
            continue
        with one_at_a_time or contextlib.nullcontext():
            store = stores.setdefault(pickle.dumps(job.store), job.store)
            run_upload(replace(job, store=store))


class BackgroundJob(Protocol):
    """A job (a frozen dataclass with a ``store``) the uploader runs beside the uploads, one at
    a time (a standby copy: ``tasks/standby_copy.StandbyJob``). What queued while one ran is
    coalesced first (a copy of an older checkpoint would only be replaced by the next one)."""

    store: ObjectStore

    @staticmethod
    def coalesce(jobs: list[Any]) -> list[Any]: ...

    def run(self) -> None: ...


_background_jobs: queue.Queue[BackgroundJob] = queue.Queue()
_background_thread: list[threading.Thread] = []


def _start_background_thread() -> None:
    with _lock:
        if not _background_thread:
            thread = threading.Thread(target=_run_background_jobs, daemon=True)
            thread.start()
            _background_thread.append(thread)


def _run_background_jobs() -> None:
    """Whatever queued while a job ran is taken at once and coalesced, kind by kind."""
    stores: dict[bytes, ObjectStore] = {}
    while True:
        queued = [_background_jobs.get()]
        with contextlib.suppress(queue.Empty):
            while True:
                queued.append(_background_jobs.get_nowait())
        for kind in dict.fromkeys(type(job) for job in queued):
            for job in kind.coalesce([j for j in queued if type(j) is kind]):
                store = stores.setdefault(pickle.dumps(job.store), job.store)
                replace(job, store=store).run()


def main() -> None:
    """Entry point of the uploader process (``Uploader`` starts it)."""
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the worker
    serve(sys.stdin.buffer)
