"""Markers that the state caches store in place of a value.

They must stay themselves through every copy: the warm cache file pickles caches that hold
them (``warm.py``), and a handle tests them by identity (``is MISSING``). A plain
``object()`` unpickles as a new object that is no longer the marker, so a deleted key read
back from that file came out as a bare ``object`` (issue 37). Enum members pickle by name and
copy to themselves.
"""

from __future__ import annotations

import enum
from typing import Any


class Marker(enum.Enum):
    MISSING = "missing"  # known to be absent (or deleted this epoch)
    UNLOADED = "unloaded"  # never read this epoch

    def __repr__(self) -> str:
        return f"<{self.name}>"


MISSING: Any = Marker.MISSING
UNLOADED: Any = Marker.UNLOADED
