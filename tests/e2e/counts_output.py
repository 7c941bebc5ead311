"""What the e2e pipeline (``tests/pipelines/e2e_counts.py``: a running count per key) has
committed, and the exact output it must equal."""

from __future__ import annotations

from typing import Any

from stator.sinks import read_committed
from stator.storage import S3Options
from tests.e2e.cluster import Space


def expected_counts(count: int) -> dict[str, int]:
    """Each key's total after ``count`` events of ``tests/pipelines/e2e_counts.py``'s input."""
    totals: dict[str, int] = {}
    for i in range(count):
        key = f"k{((i * 2654435761 + 9) & 0xFFFFFFFF) % 200}"
        totals[key] = totals.get(key, 0) + 1
    return totals


def committed(space: Space, name: str) -> list[Any]:
    """The records pipeline ``name`` in ``space`` has committed to its bucket."""
    opts = S3Options(
        endpoint_url=space.s3.endpoint_url,
        access_key_id=space.s3.access_key,
        secret_access_key=space.s3.secret_key,
    )
    return read_committed(f"s3://{space.bucket}/{name}/out", opts)


def assert_exact(records: list[Any], count: int) -> None:
    """Every key's running count rises by whole epochs and ends at its exact total: nothing
    lost, nothing counted twice across restarts and rescales."""
    per_key: dict[str, list[int]] = {}
    for key, value in records:
        per_key.setdefault(key, []).append(value)
    assert all(v == sorted(set(v)) for v in per_key.values()), "a count repeated or went back"
    assert {k: v[-1] for k, v in per_key.items()} == expected_counts(count)
