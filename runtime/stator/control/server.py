"""The driver's HTTP control API (aiohttp, in a thread of the driver process).

Request and response schemas: docs/control-api.md. Everything here reads the driver's state
under its own locks or from immutable snapshots; the epoch loop is never blocked by a request.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

from aiohttp import web

from ..config import ControlConfig
from ..driver.handover import HandoverConflict, HandoverRequest
from ..driver.savepoints import (
    SavepointBusy,
    SavepointConflict,
    SavepointRequest,
    SavepointTargetError,
)
from ..driver.status import JobState
from ..errors import ConfigError
from .answers import checkpoints_info, history_info, job_info, readiness, savepoint_request
from .headers import secure
from .metrics import render_metrics
from .schema import Answer, ErrorAnswer, HandoverAnswer, Health, SavepointList
from .timeline import INTERVAL_S, Timeline
from .token import read_token
from .view import JobView
from .webconsole import CONSOLE, Console

log = logging.getLogger("stator.control")
API = "/v1"
# Routes open without the token: the probes (liveness: the process serves; readiness: it
# processes and checkpoints; they tell only whether it runs, and why not) and the
# console's files (the same in every install: no data; what they show comes from the API,
# with the token: console.py says how the browser gets it). By route, not by path prefix.
OPEN_ROUTES = frozenset({"healthz", "readyz", "console", "console-file"})
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(answer: Answer, status: int = 200) -> web.Response:
    """An answer of the schema (``schema.py``) as JSON."""
    return web.json_response(answer.to_wire(), status=status)


def _error(status: int, reason: str) -> web.Response:
    return _json(ErrorAnswer(error=reason), status)


class ControlServer:
    """Serves one job's control API from a thread of the driver process."""

    def __init__(
        self,
        driver: JobView,
        host: str,
        port: int,
        token: str | None = None,
        reader_token: str | None = None,
    ) -> None:
        self.driver, self.host, self.port = driver, host, port
        self._token = token.encode() if token else None
        self._read_token = reader_token.encode() if reader_token and token else None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._failure_read = threading.Event()  # /job answered after the job failed
        self.timeline = Timeline()
        driver.on_epoch(self.timeline.epoch_done)
        self.console = Console.load()
        self._sampler: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> int:
        """Start serving; returns the bound port (useful when port 0 picked a free one)."""
        self._thread = threading.Thread(target=self._serve, name="stator-control", daemon=True)
        self._thread.start()
        self._ready.wait(30)
        if isinstance(self._error, OSError | OverflowError):  # host unknown, port taken, ...
            raise ConfigError(
                f"the control API cannot listen on {self.host}:{self.port} ({self._error}); "
                f"set control.host and control.port to an address of this machine and a free "
                f"port (0 picks one)"
            ) from self._error
        if self._error is not None:
            raise self._error
        log.info("control API listening on http://%s:%d%s", self.host, self.port, API)
        return self.port

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            self._runner = web.AppRunner(self.app(), access_log=None)
            loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, self.host, self.port)
            loop.run_until_complete(site.start())
            server = getattr(site, "_server", None)
            if server is not None and server.sockets:
                self.port = server.sockets[0].getsockname()[1]
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        self._sampler = loop.create_task(self._sample())
        self._ready.set()
        loop.run_forever()

    async def _sample(self) -> None:
        """The history's status samples (``timeline.py``), in this loop: no thread of its
        own, and never in the epoch loop's way."""
        while True:
            try:
                self.timeline.sample(self.driver.status)
            except Exception:  # the history is not worth the control API: log, go on
                log.exception("could not sample the job's status for /v1/history")
            await asyncio.sleep(INTERVAL_S)

    def linger(self, timeout_ms: int) -> None:
        """After a stop-with-savepoint, keep answering until its requester read the result
        (the operator polls for it); after a failure, until a client read the job's status
        (its last_error is the cause: the operator copies it to status.lastError). At most
        ``timeout_ms``."""
        state = self.driver.status.state
        if state is JobState.STOPPED:
            done = self.driver.savepoints.stop_results_fetched
        elif state is JobState.FAILED:
            done = self._failure_read.is_set
        else:
            return
        deadline = time.monotonic() + timeout_ms / 1000
        while time.monotonic() < deadline and not done():
            time.sleep(0.1)

    def stop(self) -> None:
        loop, runner = self._loop, self._runner
        if loop is None or runner is None:
            return
        if self._sampler is not None:
            loop.call_soon_threadsafe(self._sampler.cancel)
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    # ------------------------------------------------------------------ routes

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024, middlewares=[secure, self._authenticate])
        app.router.add_get("/healthz", self.health, name="healthz")
        app.router.add_get("/readyz", self.ready, name="readyz")
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get(f"{API}/job", self.job)
        app.router.add_get(f"{API}/checkpoints", self.checkpoints)
        app.router.add_get(f"{API}/history", self.history)
        app.router.add_get(f"{API}/savepoints", self.list_savepoints)
        app.router.add_post(f"{API}/savepoints", self.trigger_savepoint)
        app.router.add_get(f"{API}/savepoints/{{id}}", self.get_savepoint)
        app.router.add_post(f"{API}/handover", self.handover)
        app.router.add_get(CONSOLE.rstrip("/"), self.console.redirect, name="console")
        app.router.add_get(CONSOLE + "{name:[^/]*}", self.console.file, name="console-file")
        return app

    @web.middleware
    async def _authenticate(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every route but the probes needs the bearer token (compared in constant time), or
        for a GET the read-only token; a refused request changes nothing and its token is
        never logged."""
        if self._token is None or request.match_info.route.name in OPEN_ROUTES:
            return await handler(request)
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        bearer = given.encode() if scheme.lower() == "bearer" else b""
        if bearer and hmac.compare_digest(bearer, self._token):
            return await handler(request)
        if bearer and self._read_token and hmac.compare_digest(bearer, self._read_token):
            if request.method in ("GET", "HEAD"):
                return await handler(request)
            return _error(403, "this token is read-only: it may GET, not change the job")
        response = _error(401, "a valid bearer token is required (Authorization: Bearer ...)")
        response.headers["WWW-Authenticate"] = 'Bearer realm="stator"'
        return response

    async def health(self, _: web.Request) -> web.Response:
        """Liveness: the process serves (never the job's health: a restart of the pod would
        not fix a failing store, and the job fails over by itself)."""
        return _json(Health(status="ok"))

    async def ready(self, _: web.Request) -> web.Response:
        answer = readiness(self.driver.status)
        return _json(answer, 200 if answer.ready else 503)

    async def metrics(self, _: web.Request) -> web.Response:
        body, content_type = render_metrics(self.driver)
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def job(self, _: web.Request) -> web.Response:
        st = self.driver.status
        if st.state is JobState.FAILED:
            self._failure_read.set()
        return _json(job_info(self.driver, st))

    async def history(self, _: web.Request) -> web.Response:
        return _json(history_info(self.driver, self.timeline))

    async def checkpoints(self, _: web.Request) -> web.Response:
        return _json(checkpoints_info(self.driver))

    async def list_savepoints(self, _: web.Request) -> web.Response:
        requests = tuple(savepoint_request(r) for r in self.driver.savepoints.all())
        return _json(SavepointList(savepoints=requests))

    async def get_savepoint(self, request: web.Request) -> web.Response:
        found = self.driver.savepoints.find(request.match_info["id"])
        if found is None:
            return _error(404, f"no savepoint request with id {request.match_info['id']!r}")
        if found.status in ("COMPLETED", "FAILED"):
            found.fetched = True
        return _json(savepoint_request(found))

    async def trigger_savepoint(self, request: web.Request) -> web.Response:  # noqa: PLR0911
        try:
            body = await request.json() if request.can_read_body else {}
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, 'the body must be JSON, e.g. {"stop": true}')
        if not isinstance(body, dict):
            return _error(400, "the body must be a JSON object")
        unknown = sorted(set(body) - {"target", "stop", "format_type"})
        if unknown:
            return _error(400, f"unknown field(s) {unknown}; allowed: target, stop, format_type")
        stop, target = body.get("stop", False), body.get("target")
        format_type = body.get("format_type")  # checked with the target (SavepointTargetError)
        if not isinstance(stop, bool):
            return _error(400, "'stop' must be true or false")
        if target is not None and (
            not isinstance(target, str) or not target.startswith(("file:///", "s3://", "s3a://"))
        ):
            return _error(400, "'target' must be a file:/// or s3:// URI")
        try:
            created: SavepointRequest = self.driver.request_savepoint(target, stop, format_type)
        except SavepointConflict as exc:
            return _error(409, str(exc))
        except SavepointBusy as exc:
            return _error(429, str(exc))
        except SavepointTargetError as exc:
            return _error(400, str(exc))
        return _json(savepoint_request(created), 202)

    async def handover(self, request: web.Request) -> web.Response:  # noqa: PLR0911
        handover = self.driver.handover
        if handover is None:
            return _error(409, "this driver was not started with --await-handover")
        try:
            body = await request.json() if request.can_read_body else None
        except (json.JSONDecodeError, UnicodeDecodeError):
            body = None
        if not isinstance(body, dict):
            return _error(400, 'the body must be a JSON object, e.g. {"restore": "s3://..."}')
        unknown = sorted(set(body) - {"restore", "allow_non_restored_state"})
        if unknown:
            allowed = "restore, allow_non_restored_state"
            return _error(400, f"unknown field(s) {unknown}; allowed: {allowed}")
        restore, allow = body.get("restore"), body.get("allow_non_restored_state", False)
        if not isinstance(restore, str) or not (
            restore == "latest" or restore.startswith(("file:///", "s3://", "s3a://"))
        ):
            return _error(400, "'restore' must be \"latest\" or a file:/// or s3:// URI")
        if not isinstance(allow, bool):
            return _error(400, "'allow_non_restored_state' must be true or false")
        try:
            first = handover.give(HandoverRequest(restore, allow))
        except HandoverConflict as exc:
            return _error(409, str(exc))
        answer = HandoverAnswer(restore=restore, allow_non_restored_state=allow)
        return _json(answer, 202 if first else 200)


@contextmanager
def serving(job: JobView, config: ControlConfig) -> Iterator[ControlServer | None]:
    """The control API for ``job`` while the block runs (None if ``control.port`` is -1);
    after a stop-with-savepoint it lingers until the requester has read the result, after a
    failure until a client has read the job's status (``ControlServer.linger``)."""
    if config.port < 0:
        yield None
        return
    server = ControlServer(
        job,
        config.host,
        config.port,
        read_token(config.token_file),
        read_token(config.read_token_file, "control.read_token_file"),
    )
    server.start()
    try:
        yield server
    finally:
        server.linger(config.linger_ms)
        server.stop()
