"""A client of the driver's control API (docs/control-api.md), for ``stator savepoint`` and the
operator. Standard library only, so the operator image needs nothing more for it.

Two failures, because callers act differently on them: :class:`ControlUnreachable` (nothing
answered: the driver may be starting, gone, or partitioned) and :class:`ControlHTTPError` (the
driver answered and refused, with its ``error`` text). An answer that is not the schema's
(``schema.py``) is :class:`ControlAnswerInvalid`, a kind of the first."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import urllib.parse
from typing import TypeVar

from ..errors import StatorError
from .schema import (
    Answer,
    CheckpointsInfo,
    HandoverAnswer,
    Health,
    JobInfo,
    Readiness,
    SavepointList,
    SavepointRequest,
)
from .wire import WireError


class ControlUnreachable(StatorError):
    """The control API did not answer (connection refused, timeout, not JSON)."""


class ControlHTTPError(StatorError):
    """The control API answered with an error status."""

    def __init__(self, url: str, status: int, error: str) -> None:
        super().__init__(f"{url}: HTTP {status}: {error}")
        self.status = status
        self.error = error


class ControlAnswerInvalid(ControlUnreachable):
    """The control API answered JSON that is not the schema's (``schema.py``): for the caller,
    no usable answer, like one that is not JSON at all."""


A = TypeVar("A", bound=Answer)


def read_answer(kind: type[A], data: object, url: str) -> A:
    """``data``, an answer from ``url``, as the schema's ``kind``; :class:`ControlAnswerInvalid`
    names the field that does not fit."""
    try:
        return kind.from_wire(data)
    except WireError as exc:
        problem = f"the control API at {url} answered malformed data: {exc}"
        raise ControlAnswerInvalid(problem) from exc


class ControlClient:
    """The control API of one driver, at ``base_url`` (``http://host:port``)."""

    def __init__(
        self,
        base_url: str,
        timeout: float = 5.0,
        token: str | None = None,
        deadline: float | None = None,
    ) -> None:
        """``timeout``: per socket operation; ``deadline``: for a whole request (default
        twice the timeout)."""
        self.base_url = _checked_url(base_url).rstrip("/")
        self.timeout = timeout
        self.deadline = deadline if deadline is not None else 2 * timeout
        self._headers = {"Content-Type": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"

    def health(self) -> bool:
        """Whether the driver process serves at all."""
        return self._get(Health, "/healthz").status == "ok"

    def ready(self) -> Readiness:
        """Whether the job runs; 503 (not running yet, or any more) is an answer, not an error."""
        try:
            return self._get(Readiness, "/readyz")
        except ControlHTTPError as exc:
            if exc.status != 503:
                raise
            return Readiness(ready=False, state=exc.error)

    def job(self) -> JobInfo:
        return self._get(JobInfo, "/v1/job")

    def checkpoints(self) -> CheckpointsInfo:
        return self._get(CheckpointsInfo, "/v1/checkpoints")

    def trigger_savepoint(
        self, stop: bool = False, target: str | None = None, format_type: str | None = None
    ) -> SavepointRequest:
        """Queue a savepoint (and stop after it); returns the request, to poll by its id."""
        body: dict[str, object] = {"stop": stop}
        if target is not None:
            body["target"] = target
        if format_type is not None:
            body["format_type"] = format_type
        return self._get(SavepointRequest, "/v1/savepoints", "POST", body)

    def savepoint(self, request_id: str) -> SavepointRequest:
        return self._get(SavepointRequest, f"/v1/savepoints/{request_id}")

    def savepoints(self) -> tuple[SavepointRequest, ...]:
        return self._get(SavepointList, "/v1/savepoints").savepoints

    def handover(self, restore: str, allow_non_restored_state: bool = False) -> HandoverAnswer:
        """Hand a pre-started driver what to restore from (the same again is accepted)."""
        body = {"restore": restore, "allow_non_restored_state": allow_non_restored_state}
        return self._get(HandoverAnswer, "/v1/handover", "POST", body)

    def _get(
        self, kind: type[A], path: str, method: str = "GET", body: dict[str, object] | None = None
    ) -> A:
        """One request whose answer is the schema's ``kind``."""
        return read_answer(kind, self._call(method, path, body), self.base_url + path)

    def _call(
        self, method: str, path: str, body: dict[str, object] | None = None
    ) -> dict[str, object]:
        """One request, bounded: the answer may take ``deadline`` seconds in all (a driver
        that sends a byte at a time cannot hold the caller), may be ``MAX_ANSWER_BYTES`` long,
        and must be a JSON object. The operator calls drivers that run users' code."""
        url = self.base_url + path
        parts = urllib.parse.urlsplit(url)
        connection = (
            http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        )
        conn = connection(parts.hostname or "", parts.port, timeout=self.timeout)
        watchdog = _Watchdog(self.deadline)
        try:
            conn.connect()  # within the timeout; the response keeps this socket, not conn
            watchdog.watch(conn.sock)
            conn.request(
                method,
                urllib.parse.urlunsplit(("", "", parts.path, parts.query, "")),
                body=json.dumps(body).encode() if body is not None else None,
                headers=self._headers,
            )
            resp = conn.getresponse()
            raw = resp.read(MAX_ANSWER_BYTES + 1)
            if len(raw) > MAX_ANSWER_BYTES:
                raise ControlUnreachable(
                    f"the control API at {url} answered more than {MAX_ANSWER_BYTES} bytes"
                )
            if resp.status >= 400:
                raise ControlHTTPError(url, resp.status, _error_text(raw, resp.reason))
            result = json.loads(raw or b"{}")
            if not isinstance(result, dict):
                raise ControlUnreachable(f"the control API at {url} answered no JSON object")
            return result
        except (http.client.HTTPException, OSError, ValueError) as err:
            if watchdog.fired:
                raise ControlUnreachable(
                    f"the control API at {url} did not answer within {self.deadline:g} s"
                ) from err
            raise ControlUnreachable(f"cannot reach the control API at {url}: {err}") from err
        finally:
            watchdog.cancel()
            conn.close()


# The largest answer the client reads (the job's status with its regions and placement is
# tens of kilobytes); a larger one is refused, not parsed.
MAX_ANSWER_BYTES = 1 << 20


class _Watchdog:
    """Ends a request that is still running at its deadline by shutting its socket down (a
    per-operation timeout does not bound a server that answers a byte at a time)."""

    def __init__(self, seconds: float) -> None:
        self.fired = False
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def watch(self, sock: socket.socket | None) -> None:
        with self._lock:
            self._sock = sock
            if self.fired:
                self._shut()

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            self._shut()

    def _shut(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)

    def cancel(self) -> None:
        self._timer.cancel()


def _checked_url(url: str) -> str:
    """``url`` if a request can be made of it: urllib's own complaints (a bad IPv6 address, a
    port that is not a number) come as exceptions of its own, and only at the first call."""
    if not url.startswith(("http://", "https://")):
        raise StatorError(f"{url!r}: the control API URL must start with http:// or https://")
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises for a port that is not a number in 0-65535
    except ValueError as exc:
        problem: str | None = str(exc)
    else:
        problem = None if parts.hostname else "it names no host"
    if problem is None and any(c.isspace() or not c.isprintable() for c in url):
        problem = "it contains spaces or control characters"
    if problem is not None:
        raise StatorError(
            f"{url!r} is not a valid control API URL ({problem}); give http://HOST:PORT, "
            f"e.g. http://driver:8081"
        )
    return url


def _error_text(raw_bytes: bytes, reason: str) -> str:
    """The server's ``error`` (or, for /readyz, its ``state``), else the raw body."""
    raw = raw_bytes.decode(errors="replace")
    try:
        body = json.loads(raw)
    except ValueError:
        return raw or reason
    if isinstance(body, dict):
        return str(body.get("error") or body.get("state") or raw)
    return raw
