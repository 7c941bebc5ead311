"""The control API's bearer token, read from a file (in Kubernetes: mounted from the
pipeline's ``NAME-control`` Secret), by the driver and by the clients that call it."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError


def read_token(path: str | None, key: str = "control.token_file") -> str | None:
    """The bearer token in ``path`` (surrounding whitespace dropped); a missing or empty file
    is a configuration error (naming the setting ``key``), not an open API."""
    if path is None:
        return None
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigError(
            f"{key}={path}: cannot read it ({exc.strerror}); mount the "
            f"pipeline's Secret there or unset {key}"
        ) from exc
    if not token:
        raise ConfigError(f"{key}={path} is empty: it must hold the bearer token")
    return token
