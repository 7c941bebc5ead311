"""A savepoint as storage sees it, for tests of what lists, finds, disposes and checks them."""

from __future__ import annotations

from stator.savepoint.metadata import SavepointMetadata
from stator.storage import open_store


def write_savepoint(location: str, epoch: int = 7) -> None:
    """A savepoint's metadata (no state: enough for listing, finding, restoring checks)."""
    meta = SavepointMetadata("team.counts", epoch, 1_700_000_000_000, 64, {}, {}, 0, "zlib")
    open_store(location).put("_savepoint.json", meta.to_json())
