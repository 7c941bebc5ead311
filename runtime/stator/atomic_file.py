"""Writing a file so that a reader, or a process killed halfway, sees the whole new file or
the previous one, never a torn one: it is written to a unique file beside it (named with
:data:`STAGED_PREFIX`, which listings skip) and renamed over it, as a rename within a
directory is atomic. Durability across a power loss is not the aim: what these files hold
(object-store keys of local copies, tallies, caches, a file-system store's objects) is either
rebuilt or checked against the object store."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

STAGED_PREFIX = ".tmp-"


@contextlib.contextmanager
def staged_file(path: Path) -> Iterator[Path]:
    """A new empty file to write ``path``'s content to, renamed over ``path`` when the block
    ends. If the block (or the rename) fails, ``path`` is as it was and the staged file is
    gone."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=STAGED_PREFIX)
    os.close(fd)
    staged = Path(name)
    try:
        yield staged
        os.replace(staged, path)
    except BaseException:
        staged.unlink(missing_ok=True)
        raise


def write_atomically(path: Path, *chunks: bytes) -> None:
    """Replace ``path`` with ``chunks``, one after the other (see :func:`staged_file`)."""
    with staged_file(path) as staged, staged.open("wb") as out:
        for chunk in chunks:
            out.write(chunk)
