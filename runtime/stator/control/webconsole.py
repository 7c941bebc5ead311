"""The web console: static files (``console/``: HTML, CSS, JavaScript; no build step, no
library) served at ``/console/`` by the control server, read-only.

The token: the console's files are open (they hold no data); every answer they show comes
from the API with ``Authorization: Bearer``. A browser that navigates cannot send that
header, so ``stator console`` opens ``/console/#token=...``: the fragment never leaves the
browser (it is not sent to the server, not logged, not in a Referer); the page's script
moves it to the tab's ``sessionStorage``, removes it from the address bar and history entry,
and sends it as the header of its own requests. No cookie holds it, so no other site can
make the browser use it (no CSRF); the content security policy (``headers.py``) lets only
these files run, and they write every value as text, never as HTML. docs/control-api.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

from aiohttp import web

CONSOLE = "/console/"
TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}


@dataclass(frozen=True)
class Console:
    """The console's files, read once from the package: name -> (body, content type)."""

    files: dict[str, tuple[bytes, str]]

    @classmethod
    def load(cls) -> Console:
        root = resources.files("stator.control") / "console"
        files = {}
        for entry in root.iterdir():
            suffix = "." + entry.name.rpartition(".")[2]
            if entry.is_file() and suffix in TYPES:
                files[entry.name] = (entry.read_bytes(), TYPES[suffix])
        if "index.html" not in files:
            raise FileNotFoundError(f"the console's index.html is missing from {root}")
        return cls(files)

    async def redirect(self, _: web.Request) -> web.StreamResponse:
        raise web.HTTPFound(CONSOLE)  # the browser keeps the fragment (the token)

    async def file(self, request: web.Request) -> web.Response:
        found = self.files.get(request.match_info["name"] or "index.html")
        if found is None:
            raise web.HTTPNotFound(text="no such file in the console")
        body, content_type = found
        return web.Response(body=body, headers={"Content-Type": content_type})
