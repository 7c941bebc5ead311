"""Rate-limited generator (released by the test: ``release.py``) -> running count per key ->
exactly-once file sink, configured by environment variables (set through a StatefulPipeline's
spec.driver.env)."""

from __future__ import annotations

import os
import time
from typing import Any

from stator import Pipeline
from stator.sinks import FileSink
from stator.sources import KeyedEvents
from tests.pipelines.release import ReleasableGenerator


def _price_of(fail_key: str) -> Any:
    """A user function with a bug that only one key's records reach (FAIL_KEY)."""

    def check(event: Any) -> Any:
        if event[0] == fail_key:
            return {"user": event[0]}["price"]  # KeyError: 'price', every time
        return event

    return check


def _hold_at(hold_file: str) -> Any:
    """Hold keyed tasks while HOLD_FILE exists, after saying so in HOLD_FILE.<node>: a test
    can then kill an executor in the middle of a keyed task, not between epochs."""

    def hold(value: Any) -> Any:
        if hold_file and os.path.exists(hold_file):
            node = os.environ.get("STATOR_NODE_NAME", "unknown")
            with open(f"{hold_file}.{node}", "w") as marker:
                marker.write(str(os.getpid()))
            deadline = time.monotonic() + 60
            while os.path.exists(hold_file) and time.monotonic() < deadline:
                time.sleep(0.05)
        return value

    return hold


def build() -> Pipeline:
    count = int(os.environ.get("COUNT", "60000"))
    rate = float(os.environ.get("RATE", "1500"))
    p = Pipeline("e2e-counts", max_parallelism=64)
    (
        p.source(
            ReleasableGenerator(
                KeyedEvents(200, seed=9),
                count=count,
                splits=2,
                rate_per_second=rate,
                release=os.environ.get("RELEASE", ""),
            ),
            uid="events",
        )
        .map(_price_of(os.environ.get("FAIL_KEY", "")), name="check")
        .key_by(lambda e: e[0])
        .count(uid="count")
        .map(_hold_at(os.environ.get("HOLD_FILE", "")), name="hold")
        .map(list)
        .sink(FileSink(os.environ["COUNTS_OUT"]), uid="out")
    )
    return p
