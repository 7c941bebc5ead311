"""Failpoints: a process kills itself (SIGKILL) at a named step, for failure tests.

Exactly-once is proven by killing real processes at awkward moments; some moments (inside a
Kafka transaction, between a commit and its bookkeeping) are too short to hit from outside.
``STATOR_FAILPOINTS="name@n,..."`` makes the process that reaches ``name`` for the ``n``-th
time (1 when ``@n`` is left out) die there as a crash would. With ``STATOR_FAILPOINTS_ONCE``
(a directory), only the first process to fire a failpoint dies (Spark's Python workers all
inherit the variable; a replacement worker must not die again). Unset (always, outside
tests), a failpoint costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

ENV = "STATOR_FAILPOINTS"
ONCE_ENV = "STATOR_FAILPOINTS_ONCE"


def _parse(text: str) -> dict[str, int]:
    points: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, count = item.partition("@")
        points[name] = int(count) if count else 1
    return points


_armed = _parse(os.environ.get(ENV, ""))
_hits: dict[str, int] = {}


def reach(name: str) -> None:
    """Die here if ``name`` is armed and this is its armed hit."""
    if not _armed or name not in _armed:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] != _armed[name]:
        return
    once = os.environ.get(ONCE_ENV)
    if once:
        try:  # the first process to claim it fires; the others go on
            os.close(os.open(os.path.join(once, name), os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            return
    os.kill(os.getpid(), signal.SIGKILL)
