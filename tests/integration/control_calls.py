"""Raw calls to a driver's control API (docs/control-api.md), below the typed client, for
the integration tests that check what the server answers."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


def call(
    base: str,
    path: str,
    method: str = "GET",
    body: Any = None,
    raw: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    """One raw HTTP request to a driver's control API at ``base``: its status and its body
    (parsed when JSON), HTTP errors included, so tests can assert on refusals too."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(
        base + path,
        data=data,
        method=method,
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            text = resp.read().decode()
            status = resp.status
    except urllib.error.HTTPError as err:
        text, status = err.read().decode(), err.code
    try:
        return status, json.loads(text)
    except json.JSONDecodeError:
        return status, text
