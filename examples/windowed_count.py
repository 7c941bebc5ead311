"""Generator -> per-key event-time tumbling-window count -> exactly-once file sink.

Configured by environment variables so the demo can run it as a ``stator run`` process:
STATOR_DEMO_OUT (sink URI), STATOR_DEMO_EVENTS (number of events).
"""

from __future__ import annotations

import os

from stator import BoundedOutOfOrderness, Pipeline
from stator.api.windows import Count, Tumbling
from stator.sinks import FileSink
from stator.sources import GeneratorSource, KeyedEvents


def build() -> Pipeline:
    out = os.environ.get("STATOR_DEMO_OUT", "file:///tmp/stator-data/demo/out")
    events = int(os.environ.get("STATOR_DEMO_EVENTS", "600000"))
    p = Pipeline("windowed-count", max_parallelism=128)
    (
        p.source(
            GeneratorSource(
                KeyedEvents(num_keys=200, seed=3, ms_per_record=5), count=events, splits=2
            ),
            uid="clicks",
            timestamps=lambda e: e[2],
            watermarks=BoundedOutOfOrderness(max_delay_ms=2_000),
        )
        .key_by(lambda e: e[0])
        .window(Tumbling(size_ms=60_000), Count(), uid="per-minute")
        .map(lambda w: {"key": w.key, "start": w.start, "end": w.end, "count": w.value})
        .sink(FileSink(out), uid="counts")
    )
    return p
