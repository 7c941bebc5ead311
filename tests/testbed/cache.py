"""The test bed's build cache: one directory per component, version and recipe.

A component is built into a staging directory next to its final place and renamed into
place only after its files are verified and a ``COMPLETE`` manifest is written, so a
half-built cache (an interrupted or failed build) is never taken as complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

MANIFEST = "COMPLETE"


def cache_root() -> Path:
    """``$STATOR_CACHE``, else ``$XDG_CACHE_HOME/stator`` or ``~/.cache/stator``."""
    explicit = os.environ.get("STATOR_CACHE")
    if explicit:
        return Path(explicit).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return (base / "stator").resolve()


def recipe_digest(*parts: str) -> str:
    """Short digest of everything that shapes a build, so a changed recipe gets a new directory."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:10]


def component_dir(name: str, version: str, digest: str) -> Path:
    return cache_root() / "testbed" / f"{name}-{version}-{digest}"


def is_complete(directory: Path, required: list[str]) -> bool:
    """True only if the manifest exists and every required file is present and non-empty."""
    if not (directory / MANIFEST).is_file():
        return False
    return all(
        (directory / rel).is_file() and (directory / rel).stat().st_size > 0 for rel in required
    )


@contextmanager
def staging(final: Path) -> Iterator[Path]:
    """Yield an empty staging directory; on success the caller's files replace ``final`` atomically.

    The caller writes its files into the yielded directory; :func:`seal` writes the manifest.
    On any exception the staging directory is removed and ``final`` is left untouched.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    stage = final.parent / f".{final.name}.staging-{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir()
    try:
        yield stage
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    if final.exists():
        shutil.rmtree(final)
    stage.rename(final)


def seal(stage: Path, info: dict[str, object]) -> None:
    """Write the manifest: the last file of a build, after everything it describes."""
    body = dict(info, built_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    (stage / MANIFEST).write_text(json.dumps(body, indent=2, sort_keys=True) + "\n")
