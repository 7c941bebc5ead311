"""The control API client against a stand-in HTTP server that answers as the driver's does
(docs/control-api.md): typed results, and the two failures callers tell apart."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from stator.control.client import ControlClient, ControlHTTPError, ControlUnreachable
from stator.control.schema import Readiness
from stator.errors import StatorError
from tests.testbed.procs import free_port

REQUEST = {"id": "abc", "status": "PENDING", "stop": True, "target": None}
ROUTES: dict[tuple[str, str], tuple[int, Any]] = {
    ("GET", "/healthz"): (200, {"status": "ok"}),
    ("GET", "/readyz"): (503, {"ready": False, "state": "RECOVERING"}),
    ("GET", "/v1/job"): (200, {"job": "counts", "state": "RUNNING", "epoch": 4}),
    ("GET", "/v1/checkpoints"): (200, {"storage": "s3://b/ck", "latest": None, "retained": []}),
    ("POST", "/v1/savepoints"): (202, REQUEST),
    ("GET", "/v1/savepoints"): (200, {"savepoints": [REQUEST]}),
    ("GET", "/v1/savepoints/abc"): (200, {**REQUEST, "status": "COMPLETED"}),
    ("GET", "/v1/savepoints/nope"): (404, {"error": "no savepoint request with id 'nope'"}),
}


class Handler(BaseHTTPRequestHandler):
    bodies: list[Any] = []  # noqa: RUF012 - shared by the test and the server thread

    def _answer(self, method: str) -> None:
        if method == "POST":
            length = int(self.headers.get("Content-Length") or 0)
            Handler.bodies.append(json.loads(self.rfile.read(length)))
        status, body = ROUTES.get((method, self.path), (404, {"error": "no route"}))
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._answer("GET")

    def do_POST(self) -> None:
        self._answer("POST")

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_every_endpoint(server: str) -> None:
    client = ControlClient(server + "/")
    assert client.health() is True
    assert client.ready() == Readiness(ready=False, state="RECOVERING"), "503 is an answer"
    assert client.job().epoch == 4
    assert client.checkpoints().retained == ()
    assert client.trigger_savepoint(stop=True, target="s3://b/sp").id == "abc"
    assert client.trigger_savepoint().id == "abc"
    assert Handler.bodies[-2:] == [{"stop": True, "target": "s3://b/sp"}, {"stop": False}]
    assert client.savepoint("abc").status == "COMPLETED"
    assert [s.id for s in client.savepoints()] == ["abc"]


def test_errors_carry_the_status_and_the_servers_reason(server: str) -> None:
    with pytest.raises(ControlHTTPError) as info:
        ControlClient(server).savepoint("nope")
    assert (info.value.status, info.value.error) == (404, "no savepoint request with id 'nope'")


def test_nothing_listening_is_unreachable() -> None:
    with pytest.raises(ControlUnreachable, match="cannot reach the control API"):
        ControlClient(f"http://127.0.0.1:{free_port()}", timeout=2).job()


def test_only_http_urls() -> None:
    with pytest.raises(StatorError, match="must start with http:// or https://"):
        ControlClient("driver:8081")


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://[::1", "Invalid IPv6 URL"),
        ("http://", "it names no host"),
        ("http://driver:x", "Port could not be cast"),
        ("http://driver:99999", "Port out of range"),
        ("http://dri ver:8081", "it contains spaces or control characters"),
    ],
)
def test_a_url_no_request_can_be_made_of_is_refused_at_once(url: str, problem: str) -> None:
    with pytest.raises(StatorError) as info:
        ControlClient(url).job()
    assert str(info.value).startswith(f"{url!r} is not a valid control API URL ({problem}")


class Hostile(BaseHTTPRequestHandler):
    """A driver that runs a user's code may answer anything (issue 38)."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if self.path == "/v1/job" and self.server.mode == "huge":  # type: ignore[attr-defined]
            self.end_headers()
            chunk = b" " * 65536
            for _ in range(40):  # 2.5 MiB of JSON whitespace, then an object
                self.wfile.write(chunk)
            self.wfile.write(b"{}")
        elif self.server.mode == "drip":  # type: ignore[attr-defined]
            self.end_headers()
            for _ in range(100):  # 20 s, a byte at a time: each read is within the timeout
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.2)
        else:
            data = b"[1, 2, 3]"
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    def log_message(self, *_: Any) -> None:
        pass


class QuietServer(ThreadingHTTPServer):
    def handle_error(self, *_: Any) -> None:
        """The client hanging up on a hostile answer is the point."""


@pytest.fixture(params=["huge", "drip", "list"])
def hostile(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    httpd = QuietServer(("127.0.0.1", 0), Hostile)
    httpd.daemon_threads = True
    httpd.mode = request.param  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield request.param, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_a_hostile_answer_is_refused_within_the_deadline(hostile: tuple[str, str]) -> None:
    mode, url = hostile
    message = {
        "huge": "answered more than 1048576 bytes",
        "drip": "did not answer within 1.5 s",
        "list": "answered no JSON object",
    }[mode]
    started = time.monotonic()
    with pytest.raises(ControlUnreachable, match=message):
        ControlClient(url, timeout=1.0, deadline=1.5).job()
    assert time.monotonic() - started < 5
