"""Generator -> running count per key -> exactly-once file sink."""

from __future__ import annotations

import os

from stator import Pipeline
from stator.sinks import FileSink
from stator.sources import GeneratorSource, KeyedEvents


def build() -> Pipeline:
    out = os.environ.get("STATOR_EXAMPLE_OUT", "file:///tmp/stator-data/out/keyed-count")
    events = int(os.environ.get("STATOR_EXAMPLE_EVENTS", "200000"))
    p = Pipeline("keyed-count", max_parallelism=128)
    (
        p.source(
            GeneratorSource(KeyedEvents(num_keys=1000, seed=7), count=events, splits=2),
            uid="events",
        )
        .key_by(lambda e: e[0])
        .count(uid="counts")
        .sink(FileSink(out), uid="out")
    )
    return p
