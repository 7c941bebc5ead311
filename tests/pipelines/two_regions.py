"""Two disconnected pipelines in one job (two failover regions): rate-limited generators
(released by the test: ``release.py``) ->
running count per key -> exactly-once file sinks, configured by environment variables."""

from __future__ import annotations

import os

from stator import Pipeline
from stator.sinks import FileSink
from stator.sources import KeyedEvents
from tests.pipelines.release import ReleasableGenerator


def build() -> Pipeline:
    count = int(os.environ.get("COUNT", "20000"))
    rate = float(os.environ.get("RATE", "1000"))
    p = Pipeline("two-regions", max_parallelism=64)
    for name, keys in (("a", 40), ("b", 25)):
        (
            p.source(
                ReleasableGenerator(
                    KeyedEvents(keys, seed=len(name) + keys),
                    count=count,
                    splits=2,
                    rate_per_second=rate,
                    release=os.environ.get("RELEASE", ""),
                ),
                uid=f"in-{name}",
            )
            .key_by(lambda e: e[0])
            .count(uid=f"count-{name}")
            .map(list)
            .sink(FileSink(os.environ[f"OUT_{name.upper()}"]), uid=f"out-{name}")
        )
    return p
