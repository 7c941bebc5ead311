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
- the regions themselves changed (parts connected or split, or a region renamed by a new
  smallest source uid): refused while a region's latest checkpoint holds the position of a
  source that is now in another region, whatever the flags: each region resumes only from
  its own checkpoints, so that source would start over. A region removed with all its
  sources is refused too, unless ``restore.allow_non_restored_state`` (its state is dropped,
  as for a removed operator).

An explicit ``restore.source`` that is one region's checkpoint holds only that region's
state: it restores a job only if it covers every source of the job.

``restore.source=none`` is refused while any layout holds checkpoints (unless
``restore.force_empty``), as for a job of one region.
"""

from __future__ import annotations

from ..checkpoint.metadata import CheckpointMetadata
from ..errors import ConfigError
from ..lineage import Target, list_checkpoints
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
    job: str, root: str, regions: dict[str, set[str]], allow_non_restored: bool, s3: S3Options
) -> dict[str, CheckpointMetadata]:
    """The newest checkpoint of each region (id -> its source uids) that has one; refuse if
    the regions changed (module docstring)."""
    found = region_checkpoints(root, s3)
    home = {uid: region for region, sources in regions.items() for uid in sources}
    for old, meta in sorted(found.items()):
        moved = sorted(u for u in meta.sources if u in home and home[u] != old)
        if moved:
            raise ConfigError(
                f"job '{job}': the graph's connected parts changed: source '{moved[0]}' was in "
                f"failover region '{old}' (checkpoints under {root}/{REGIONS_DIR}/{old}) and is "
                f"now in region '{home[moved[0]]}'. Each region resumes only from its own "
                f"checkpoints, so the job cannot resume from latest: run the previous graph, "
                f"take a savepoint (stator savepoint trigger) and restore from it "
                f"(restore.source=<savepoint>); a savepoint restores into any region layout"
            )
        if old not in regions and not allow_non_restored:
            raise ConfigError(
                f"job '{job}': {root}/{REGIONS_DIR}/{old} holds checkpoints of failover region "
                f"'{old}', whose sources ({', '.join(sorted(meta.sources))}) this pipeline no "
                f"longer has; give them back, or set restore.allow_non_restored_state=true to "
                f"drop that region's state"
            )
    return {region: meta for region, meta in found.items() if region in regions}


def check_covers(target: Target, sources: set[str]) -> None:
    """An explicit checkpoint of one region restores a job only if it covers its sources."""
    meta = target.meta
    if not isinstance(meta, CheckpointMetadata) or f"/{REGIONS_DIR}/" not in target.store.uri:
        return
    missing = sorted(sources - set(meta.sources))
    if missing:
        raise ConfigError(
            f"restore.source: {target.describe()} is one failover region's checkpoint and "
            f"holds no position of source(s) {missing}, which would start over. Restore the "
            f"job from a savepoint (stator savepoint trigger) or from its latest checkpoints "
            f"(restore.source=latest)"
        )
