"""A job of two failover regions without Spark, shared by the region and control-API tests:
``b-in`` (stateless) and ``a-in`` (keyed), with file-system checkpoints under a test's path."""

from __future__ import annotations

from pathlib import Path

from stator import Pipeline
from stator.config import JobConfig, load_config
from stator.sinks import CollectSink
from stator.sources.generator import list_source


def two_parts(name: str = "two") -> Pipeline:
    """Two failover regions: ``b-in`` (stateless) and ``a-in`` (keyed)."""
    p = Pipeline(name)
    p.source(list_source([1, 2]), uid="b-in").map(str).sink(CollectSink(), uid="b-out")
    (
        p.source(list_source([1, 2]), uid="a-in")
        .key_by(lambda r: r)
        .count(uid="a-count")
        .sink(CollectSink(), uid="a-out")
    )
    return p


def config(tmp_path: Path, *more: str) -> JobConfig:
    """Checkpoints, local state and savepoints under ``tmp_path``; ``more``: key=value."""
    return load_config(
        None,
        [
            f"checkpoint.storage=file://{tmp_path}/ck",
            f"state.local_dir={tmp_path}/state",
            f"savepoint.dir=file://{tmp_path}/sp",
            *more,
        ],
    )
