"""Talking to a driver's control API (see docs/control-api.md)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from .spec import CONTROL_PORT


class DriverUnreachable(RuntimeError):
    pass


def base_url(pod: dict[str, Any] | None) -> str | None:
    ip = ((pod or {}).get("status") or {}).get("podIP")
    return f"http://{ip}:{CONTROL_PORT}" if ip else None


def call(
    url: str, path: str, body: dict[str, Any] | None = None, timeout: float = 5
) -> tuple[int, dict[str, Any]]:
    data = json.dumps(body).encode() if body is not None else None
    if not url.startswith("http://"):
        raise DriverUnreachable(f"not an http URL: {url}")
    req = urllib.request.Request(  # noqa: S310 - checked above: http to a pod IP
        url + path,
        data=data,
        method="POST" if body is not None else "GET",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:
        try:
            return err.code, json.loads(err.read() or b"{}")
        except json.JSONDecodeError:
            return err.code, {}
    except (urllib.error.URLError, OSError, json.JSONDecodeError) as err:
        raise DriverUnreachable(f"{url}{path}: {err}") from err
