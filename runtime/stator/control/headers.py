"""Security headers on every answer of the control API (its JSON and the console's files):
the console runs only its own scripts, is never framed, and nothing is sniffed or cached."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

# No inline script or style, nothing from elsewhere: a value shown by the console can never
# run as code, and the token it holds can only go back to this server.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def secure(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The outermost middleware: refusals and errors get the headers too."""
    try:
        response = await handler(request)
    except web.HTTPException as exc:  # 404, 405, redirects: aiohttp raises them
        exc.headers.update(HEADERS)
        raise
    response.headers.update(HEADERS)
    return response
