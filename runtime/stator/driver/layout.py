"""Which checkpoints ``restore.source=latest`` resumes from when a job's failover regions
changed between runs.

A job of one region (or run with ``failover.strategy=full``) keeps its checkpoints at the
job's root; a job of several regions keeps each region's under ``regions/<region>/``
(``regions.py``), each region at its own epoch. When the layout changes between runs:

- root -> regions (``failover.strategy`` turned to ``region``, or a disconnected part was
  added): each region resumes from the newer of its own latest checkpoint and the root's,
  restricted to its own operators, sources and sinks (``Target.part_for``).
- regions -> root (one driver again): refused while a region holds a checkpoint newer than
  the root's latest: one driver cannot resume regions that stand at different epochs. A
  savepoint taken before the change restores into any layout.
- the regions themselves changed (parts connected or split): refused while a directory holds
  checkpoints of a region this pipeline does not have, unless
  ``restore.allow_non_restored_state`` (then its state is dropped, as for a removed
  operator): resuming the rest would silently leave that state behind.

``restore.source=none`` is refused while any layout holds checkpoints (unless
``restore.force_empty``), as for a job of one region.
"""

from __future__ import annotations

from ..checkpoint.metadata import CheckpointMetadata
from ..errors import ConfigError
from ..lineage import list_checkpoints
from ..storage import S3Options, open_store

REGIONS_DIR = "regions"


def newest_checkpoint(uri: str, s3: S3Options) -> CheckpointMetadata | None:
    """The newest completed checkpoint under a checkpoint root (a job's or a region's)."""
    completed = [e.metadata for e in list_checkpoints(uri, s3) if e.metadata]
    return completed[-1] if completed else None


def region_dirs(root: str, s3: S3Options | None = None) -> list[str]:
    """Ids of the region directories under a job's checkpoint root."""
    keys = [k for k, _ in open_store(root, s3).listing(f"{REGIONS_DIR}/")]
    return sorted({k.split("/")[1] for k in keys if k.count("/") >= 2})


def region_checkpoints(root: str, s3: S3Options) -> dict[str, CheckpointMetadata]:
    """Region id -> its newest completed checkpoint, for every region directory under the
    job's checkpoint root that holds one."""
    found = {}
    for region in region_dirs(root, s3):
        latest = newest_checkpoint(f"{root}/{REGIONS_DIR}/{region}", s3)
        if latest is not None:
            found[region] = latest
    return found


def check_one_driver(
    job: str, root: str, root_latest: CheckpointMetadata | None, s3: S3Options
) -> None:
    """A job run by one driver resumes from the root: refuse if its regions are newer."""
    newer = {
        region: meta
        for region, meta in region_checkpoints(root, s3).items()
        if root_latest is None or meta.created_ms > root_latest.created_ms
    }
    if newer:
        region = sorted(newer)[0]
        raise ConfigError(
            f"job '{job}' last ran with several failover regions: {root}/{REGIONS_DIR}/"
            f"{region} holds checkpoint {newer[region].checkpoint_id} (epoch "
            f"{newer[region].epoch}), newer than any checkpoint at the job's root; one driver "
            f"cannot resume regions that stand at different epochs. Run with "
            f"failover.strategy=region and the same graph, or take a savepoint of that run and "
            f"restore from it (restore.source=<savepoint>)"
        )


def check_regions(
    job: str, root: str, regions: set[str], allow_non_restored: bool, s3: S3Options
) -> dict[str, CheckpointMetadata]:
    """The newest checkpoint of each of ``regions`` that has one; refuse if a region this
    pipeline does not have holds checkpoints (module docstring)."""
    found = region_checkpoints(root, s3)
    stray = sorted(set(found) - regions)
    if stray and not allow_non_restored:
        raise ConfigError(
            f"job '{job}': {root}/{REGIONS_DIR}/{stray[0]} holds checkpoints of failover region "
            f"'{stray[0]}', which this pipeline does not have (its regions: "
            f"{', '.join(sorted(regions))}): the graph's connected parts changed. Restore from a "
            f"savepoint taken before the change (restore.source=<savepoint>), or set "
            f"restore.allow_non_restored_state=true to drop that region's state"
        )
    return {region: meta for region, meta in found.items() if region in regions}
