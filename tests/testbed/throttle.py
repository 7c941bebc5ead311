"""A TCP forwarder whose client-to-server bandwidth a test can cap and lift at will.

Tests that must catch a transfer in the middle (an executor killed while it uploads) slow
the link down instead of guessing how long the transfer takes on this machine."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from types import TracebackType

CHUNK = 64 * 1024


class ThrottledPort:
    """Listens on 127.0.0.1 and forwards every connection to ``target``; bytes sent by
    clients pass at most ``limit`` bytes per second over all connections (None: no cap)."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self._limit: float | None = None
        self._next_free = 0.0
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="throttle-accept").start()

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def limit(self, bytes_per_s: float | None) -> None:
        with self._lock:
            self._limit = bytes_per_s
            self._next_free = time.monotonic()

    def close(self) -> None:
        self._closed = True
        self._server.close()

    def __enter__(self) -> ThrottledPort:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self._target)
            except OSError:
                client.close()
                continue
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _wait_for(self, n: int) -> None:
        with self._lock:
            if self._limit is None:
                return
            now = time.monotonic()
            start = max(now, self._next_free)
            self._next_free = start + n / self._limit
        time.sleep(max(0.0, start - now))

    def _pump(self, src: socket.socket, dst: socket.socket, throttled: bool) -> None:
        try:
            while data := src.recv(CHUNK):
                if throttled:
                    self._wait_for(len(data))
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
