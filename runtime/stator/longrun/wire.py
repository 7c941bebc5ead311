"""Framed messages over TCP between the driver and its long-running tasks, and between the
tasks themselves (the data plane that replaces Spark's shuffle).

A frame is a 4-byte length and a pickle. A connection is accepted only after its first 32
bytes are the run's token (random per run, sent to the tasks in their Spark closure), so
nothing unpickles bytes from a peer that is not a task of the same run. Sockets send at
once (``TCP_NODELAY``): an epoch's frames are small and latency is the point.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import pickle
import socket
import struct
from typing import Any

TOKEN_BYTES = 32
# Set by Spark on Kubernetes in every executor pod: the address peers reach it at.
POD_IP_ENV = "SPARK_EXECUTOR_POD_IP"
_LENGTH = struct.Struct(">I")
# A frame larger than this is refused: a keyed subtask's input for one epoch is bounded by
# epoch.max_records, far below it.
MAX_FRAME = 1 << 30
CONNECT_TIMEOUT_S = 10.0


class ChannelClosed(ConnectionError):
    """The peer closed the connection (its task ended, failed or was killed)."""


class Channel:
    """One connection's frames, both ways. Not thread-safe: one reader and one writer."""

    def __init__(self, sock: socket.socket, peer: str) -> None:
        self.sock, self.peer = sock, peer
        sock.setblocking(True)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self, message: Any) -> None:
        self.send_pickled(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))

    def send_pickled(self, body: bytes) -> None:
        """Send a message pickled once for several channels."""
        self.sock.sendall(_LENGTH.pack(len(body)) + body)

    def recv(self) -> Any:
        (length,) = _LENGTH.unpack(self._exactly(_LENGTH.size))
        if length > MAX_FRAME:
            raise ConnectionError(f"a frame of {length} bytes from {self.peer}: refused")
        return pickle.loads(self._exactly(length))  # noqa: S301 - an authenticated peer

    def _exactly(self, n: int) -> bytes:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            k = self.sock.recv_into(view[got:], n - got)
            if k == 0:
                raise ChannelClosed(f"{self.peer} closed the connection")
            got += k
        return bytes(buf)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def connect(address: tuple[str, int], token: bytes, peer: str) -> Channel:
    """Connect to a run's driver or task at ``address`` and present the run's token."""
    sock = socket.create_connection(address, timeout=CONNECT_TIMEOUT_S)
    sock.settimeout(None)
    sock.sendall(token)
    return Channel(sock, peer)


def listen(host: str) -> socket.socket:
    """A listening socket on ``host`` at a free port."""
    server = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((host, 0))
    server.listen(256)
    return server


def accept(server: socket.socket, token: bytes, timeout_s: float) -> Channel | None:
    """The next connection that presents ``token`` within ``timeout_s``; one that does not
    is closed unread (None)."""
    sock, address = server.accept()
    sock.settimeout(timeout_s)
    try:
        presented = _read_token(sock)
    except (OSError, ConnectionError):
        sock.close()
        return None
    if not hmac.compare_digest(presented, token):
        sock.close()
        return None
    sock.settimeout(None)
    return Channel(sock, f"{address[0]}:{address[1]}")


def _read_token(sock: socket.socket) -> bytes:
    got = b""
    while len(got) < TOKEN_BYTES:
        chunk = sock.recv(TOKEN_BYTES - len(got))
        if not chunk:
            raise ConnectionError("closed before its token")
        got += chunk
    return got


def own_address() -> str:
    """The address other pods reach this process at: an executor pod's IP, else the host's."""
    return os.environ.get(POD_IP_ENV) or socket.gethostbyname(socket.gethostname())
