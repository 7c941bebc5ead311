"""Bounds on what the operator copies from a driver's answer into a pipeline's status.

A driver runs the pipeline's code, so its answer is the user's: without bounds one pipeline
could write status objects that etcd refuses (1.5 MiB), and every later status write of that
pipeline would fail, or grow the operator's memory. Each string, list and mapping is cut to a
size that still says what it holds, and a status part that is still too large is replaced by
a note saying so.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from stator.control.wire import Json

MAX_TEXT = 2000  # characters of one string (an error message keeps its first lines)
MAX_ITEMS = 256  # entries of one list or mapping (placement lists one per subtask)
MAX_DEPTH = 8
MAX_PART_BYTES = 256 * 1024  # one status field, as JSON


def bounded(value: object, depth: int = 0) -> Json:
    """``value`` with every string, list and mapping cut to the bounds above; anything that
    is not JSON data becomes its (cut) text."""
    if depth > MAX_DEPTH:
        return "(nested too deeply)"
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return value if len(value) <= MAX_TEXT else value[:MAX_TEXT] + " (cut)"
    if isinstance(value, list | tuple):
        return [bounded(v, depth + 1) for v in list(value)[:MAX_ITEMS]]
    if isinstance(value, dict):
        items = list(value.items())[:MAX_ITEMS]
        return {str(k)[:253]: bounded(v, depth + 1) for k, v in items}
    return bounded(str(value), depth + 1)


def bounded_fields(fields: Mapping[str, Json]) -> dict[str, Json]:
    """Status fields from a driver, each bounded; a field still over ``MAX_PART_BYTES`` is
    replaced by a note (the status write must go through)."""
    out: dict[str, Json] = {}
    for key, value in fields.items():
        small = bounded(value)
        size = len(json.dumps(small, default=str))
        out[key] = (
            small
            if size <= MAX_PART_BYTES
            else {
                "omitted": f"the driver reported {size} bytes for {key}; at most {MAX_PART_BYTES}"
            }
        )
    return out
