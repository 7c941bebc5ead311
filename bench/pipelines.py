"""Pipelines the executor-pod benchmarks run in driver pods (``bench/pods.py``), configured by
environment variables of the driver (``spec.driver.env``), as the e2e pipelines are."""

from __future__ import annotations

import os
import random
from typing import Any

from stator import BYTES, INT64, KeyedProcessFunction, Pipeline, ValueStateDescriptor
from stator.sinks import FileSink
from stator.sinks.base import Sink
from stator.sources import GeneratorSource, KeyedEvents, SweepEvents


class Payload(KeyedProcessFunction):
    """Per key: a count, and on its first record ``value_bytes`` of incompressible bytes
    (seeded by the record index, so a replay writes the same state)."""

    def __init__(self, value_bytes: int) -> None:
        self.value_bytes = value_bytes

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", INT64))
        self.payload = ctx.get_state(ValueStateDescriptor("payload", BYTES))

    def process_element(self, event: Any, ctx: Any) -> Any:
        n = self.count.value(0) + 1
        self.count.update(n)
        if n == 1:
            seeded = random.Random(event[2])  # noqa: S311 - reproducible bytes, not secrets
            self.payload.update(seeded.randbytes(self.value_bytes))
        yield [ctx.current_key, n]


def payload_state(name: str, keys: int, value_bytes: int, rate: float, sink: Sink) -> Pipeline:
    """``keys`` keys of ``value_bytes`` each, all written at once (the first ``keys`` records
    come as a burst), then ``rate`` records per second updating the counts: the job keeps
    running with keys x value_bytes of keyed state (operator ``payload``, states ``count``
    and ``payload``), for recovery measurements."""
    p = Pipeline(name, max_parallelism=64)
    (
        p.source(
            GeneratorSource(
                SweepEvents(keys), count=None, splits=2, rate_per_second=rate, burst=keys
            ),
            uid="events",
        )
        .key_by(lambda e: e[0])
        .process(Payload(value_bytes), uid="payload")
        .sink(sink, uid="out")
    )
    return p


def big_state() -> Pipeline:
    """:func:`payload_state` of KEYS keys of VALUE_BYTES each at RATE records per second,
    into a file sink at OUT."""
    return payload_state(
        "big-state",
        int(os.environ["KEYS"]),
        int(os.environ["VALUE_BYTES"]),
        float(os.environ.get("RATE", "200")),
        FileSink(os.environ["OUT"]),
    )


def counts() -> Pipeline:
    """COUNT events over KEYS keys as fast as they go -> a user count per key -> file sink:
    the throughput of a keyed job, in a driver pod or with executors as pods."""
    p = Pipeline("pod-counts", max_parallelism=64)
    (
        p.source(
            GeneratorSource(
                KeyedEvents(int(os.environ["KEYS"]), seed=1),
                count=int(os.environ["COUNT"]),
                splits=2,
            ),
            uid="events",
        )
        .key_by(lambda e: e[0])
        .count(uid="count")
        .map(list)
        .sink(FileSink(os.environ["OUT"]), uid="out")
    )
    return p
