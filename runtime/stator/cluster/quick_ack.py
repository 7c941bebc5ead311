"""Reads from Spark's JVM acknowledged at once (``TCP_QUICKACK``), not 40 ms later.

Spark's JVM writes to a Python process in several small writes without ``TCP_NODELAY``: a
Python worker's task data and then its end markers, an accumulator update's count and
then its values, a result server's reply and then the rows. Nagle's algorithm holds each
later small write until the earlier one is acknowledged, and Linux delays the reader's
acknowledgement by up to 40 ms when the reader has nothing to send back. Measured on a
trivial PySpark job (``local[1]``, one task): the worker waited 40 ms for the end marker
of its (empty) input in every task, and the driver another 40 ms for the accumulator
update; a job took 150 ms, 60-70 ms with every read acknowledged at once. A Stator epoch
runs two such stages and reports through an accumulator, so this delay was most of an
idle epoch's time (docs/benchmarks.md "Latency").

``TCP_QUICKACK`` is not sticky (the kernel may go back to delayed acknowledgements), so it
is set before every read on a TCP socket: one ``setsockopt`` per read. Two places read:

- the driver's sockets to its JVM (py4j, the accumulator server, job results) are Python
  socket files: :func:`install` wraps :class:`socket.SocketIO`'s ``readinto``;
- a Python worker reads its task from a plain file over the daemon's socket
  (``pyspark/daemon.py``): :func:`quick_reader` replaces it per task
  (``tasks/pydaemon.py``).

Anything that is not a TCP socket (a Unix socket, a pipe) is read as before.
"""

from __future__ import annotations

import functools
import io
import os
import socket
from collections.abc import Callable
from typing import Any

_QUICKACK = getattr(socket, "TCP_QUICKACK", None)  # Linux only
_INSTALLED: list[bool] = []  # once :func:`install` ran


def _tcp(sock: socket.socket) -> bool:
    """Whether ``sock`` is a TCP socket (the only kind that delays acknowledgements)."""
    return sock.type == socket.SOCK_STREAM and sock.family in (socket.AF_INET, socket.AF_INET6)


def _ack_at_once(sock: socket.socket) -> bool:
    """Ask for the next acknowledgements at once; False if ``sock`` cannot (not TCP)."""
    if _QUICKACK is None:
        return False
    try:
        sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
    except OSError:
        return False
    return True


def install() -> None:
    """Every socket file of this process acknowledges what it reads at once (idempotent)."""
    if _INSTALLED or _QUICKACK is None:
        return
    original = socket.SocketIO.readinto

    def readinto(self: Any, b: Any) -> int | None:
        if _tcp(self._sock):
            _ack_at_once(self._sock)
        return original(self, b)

    socket.SocketIO.readinto = readinto  # type: ignore[method-assign]
    _INSTALLED.append(True)


class _QuickAckReader(io.RawIOBase):
    """A socket's file descriptor read with ``TCP_QUICKACK`` set before every read."""

    def __init__(self, fd: int, sock: socket.socket) -> None:
        self._fd, self._sock = fd, sock

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def readinto(self, b: Any) -> int:
        _ack_at_once(self._sock)
        return os.readv(self._fd, [b])

    def close(self) -> None:
        if not self.closed:
            self._sock.close()  # the duplicate made for setsockopt; the caller owns fd
        super().close()


def quick_reader(infile: io.BufferedReader, buffer_size: int) -> io.BufferedReader:
    """A reader of ``infile``'s descriptor that acknowledges at once, in its place;
    ``infile`` itself if the descriptor is not a TCP socket.

    Only for a reader whose buffer is empty: PySpark's daemon makes a new one for every
    task, and the JVM sends nothing after its secret until the worker answered it."""
    try:
        sock = socket.socket(fileno=os.dup(infile.fileno()))
    except OSError:
        return infile
    if not _tcp(sock) or not _ack_at_once(sock):
        sock.close()
        return infile
    return io.BufferedReader(_QuickAckReader(infile.fileno(), sock), buffer_size)


def acknowledging(worker_main: Callable[..., Any]) -> Callable[..., Any]:
    """PySpark's per-task worker entry (``pyspark.worker.main(infile, outfile)``) reading
    its task through :func:`quick_reader`."""
    buffer_size = int(os.environ.get("SPARK_BUFFER_SIZE", "65536"))

    @functools.wraps(worker_main)
    def run(infile: Any, outfile: Any) -> Any:
        reader = quick_reader(infile, buffer_size)
        try:
            return worker_main(reader, outfile)
        finally:
            if reader is not infile:
                reader.close()

    return run
