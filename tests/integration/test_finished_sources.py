"""A keyed operator whose sources have all finished keeps taking part in checkpoints and
savepoints: its state is in every later checkpoint, none of them fails, and a savepoint taken
then restores to the exact output. (It used to be left out of the epoch's Spark job, so every
later checkpoint failed with "N of M subtasks reported a snapshot", and so did a
stop-with-savepoint that came after the last record was read.)"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from stator import Job, Pipeline
from stator.config import JobConfig
from stator.sinks import FileSink, read_committed
from stator.sources import GeneratorSource, KeyedEvents
from tests.helpers import stop_with_savepoint_after, with_overrides

SHORT, LONG, EPOCH = 300, 6_000, 1_000  # the short source ends in the first epoch


def pipeline(out: str) -> Pipeline:
    p = Pipeline("finished-sources", max_parallelism=32)
    for uid, count, seed in (("short", SHORT, 1), ("long", LONG, 2)):
        (
            p.source(GeneratorSource(KeyedEvents(20, seed=seed), count=count), uid=uid)
            .key_by(lambda e: e[0])
            .count(uid=f"count-{uid}")
            .map(list)
            .sink(FileSink(f"{out}/{uid}"), uid=f"out-{uid}")
        )
    return p


def finals(out: str) -> dict[str, dict[str, int]]:
    per: dict[str, dict[str, int]] = {}
    for uid in ("short", "long"):
        per[uid] = {k: v for k, v in (tuple(r) for r in read_committed(f"{out}/{uid}"))}
    return per


def test_checkpoints_and_a_savepoint_after_a_source_finished(
    spark: Any, job_config: JobConfig, tmp_path: Path
) -> None:
    cfg = with_overrides(
        job_config,
        # max_records is split between the sources that still read: the long one reads 500
        # in the first epoch, then 1,000 per epoch once the short one has finished.
        epoch={"max_records": EPOCH},
        savepoint={"dir": f"file://{tmp_path}/savepoints"},
        # One region for both pipelines: a checkpoint covers the finished one's state too.
        failover={"strategy": "full"},
    )
    out = f"file://{tmp_path}/out"
    driver = stop_with_savepoint_after(Job(pipeline(out), cfg, spark), 5)
    first = driver.run()
    assert first.state == "STOPPED" and first.stopped_with_savepoint
    assert first.failed_checkpoints == 0 and first.checkpoints >= 5
    latest = first.last_checkpoint
    assert latest is not None and set(latest.operators) == {"count-short", "count-long"}

    again = with_overrides(cfg, restore={"source": first.stopped_with_savepoint})
    second = pipeline(out).run(again, spark)
    assert second.finished and second.failed_checkpoints == 0

    want_short = Counter(e[0] for e in KeyedEvents(20, seed=1).make(0, SHORT, 1))
    want_long = Counter(e[0] for e in KeyedEvents(20, seed=2).make(0, LONG, 1))
    got = finals(out)
    assert got["short"] == dict(want_short) and got["long"] == dict(want_long)
