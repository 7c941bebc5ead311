"""The rescale tests' job: deterministic keyed input, a running count and a window count,
run in phases that stop with a savepoint, and its committed output in comparable form."""

from __future__ import annotations

from collections import Counter
from typing import Any

from stator import BoundedOutOfOrderness, Job, Pipeline
from stator.api.windows import Count, Tumbling
from stator.config import JobConfig
from stator.sinks import FileSink, read_committed
from stator.sources import GeneratorSource, KeyedEvents
from tests.helpers import stop_with_savepoint_after, with_overrides

EVENTS, KEYS, EPOCH = 24_000, 150, 2_000  # 12 epochs of input


def pipeline(out: str) -> Pipeline:
    """A keyed count and a per-second tumbling window count, each to its sink under ``out``."""
    p = Pipeline("rescale", max_parallelism=64)
    src = p.source(
        GeneratorSource(KeyedEvents(KEYS, seed=5, ms_per_record=3), count=EVENTS, splits=3),
        uid="events",
        timestamps=lambda e: e[2],
        watermarks=BoundedOutOfOrderness(500),
    )
    src.key_by(lambda e: e[0]).count(uid="count").map(list).sink(
        FileSink(f"{out}/counts"), uid="counts"
    )
    (
        src.key_by(lambda e: e[0])
        .window(Tumbling(1_000), Count(), uid="per-second")
        .map(lambda w: [w.key, w.start, w.value])
        .sink(FileSink(f"{out}/windows"), uid="windows")
    )
    return p


def run_phase(
    spark: Any,
    cfg: JobConfig,
    out: str,
    parallelism: int,
    restore: str,
    stop_after_epoch: int | None,
) -> Any:
    """Run until ``stop_after_epoch``, then stop with a savepoint (or run to the end)."""
    driver = Job(
        pipeline(out),
        with_overrides(cfg, parallelism=parallelism, restore={"source": restore}),
        spark,
    )
    if stop_after_epoch is not None:
        stop_with_savepoint_after(driver, stop_after_epoch)
    return driver.run()


def output(out: str) -> dict[str, Any]:
    """The committed output under ``out``, in the forms the tests compare: multisets of
    records, and each key's running counts in commit order."""
    counts = [tuple(r) for r in read_committed(f"{out}/counts")]
    windows = [tuple(r) for r in read_committed(f"{out}/windows")]
    per_key: dict[str, list[int]] = {}
    for key, count in counts:
        per_key.setdefault(key, []).append(count)
    return {"counts": Counter(counts), "count_order": per_key, "windows": Counter(windows)}
