"""Failures no restart can fix end the job at once, with the cause, and leave no staged
output: a savepoint whose files are corrupt (same sizes, so only restoring finds out)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from stator import INT64, Context, Job, KeyedProcessFunction, Pipeline, RuntimeContext
from stator import ValueStateDescriptor as Value
from stator.config import JobConfig
from stator.errors import JobFailed
from stator.sinks import CollectSink, FileSink
from stator.sources import list_source
from tests.helpers import stop_with_savepoint_after, with_overrides

WORDS = ["a", "b", "a", "c", "a", "b"] * 4  # 24 records, 4 per epoch


class Counts(KeyedProcessFunction):
    def open(self, ctx: RuntimeContext) -> None:
        self.seen = ctx.get_state(Value("seen", INT64))

    def process_element(self, value: Any, ctx: Context) -> Iterable[Any]:
        n = self.seen.value(0) + 1
        self.seen.update(n)
        yield (value, n)


def pipeline(raw: str | None = None) -> Pipeline:
    p = Pipeline("corrupt")
    words = p.source(list_source(WORDS), uid="words")
    if raw is not None:  # staged by the source tasks, before the keyed tasks restore
        words.sink(FileSink(raw), uid="raw")
    words.key_by(lambda w: w).process(Counts(), uid="counts").sink(CollectSink(), uid="out")
    return p


def test_corrupt_savepoint_ends_the_job_at_once(
    spark: Any, job_config: JobConfig, tmp_path: Path
) -> None:
    cfg = with_overrides(
        job_config,
        epoch={"max_records": 4},
        savepoint={"dir": f"file://{tmp_path}/sp"},
        restart={"attempts": 5, "delay_ms": 2000},
    )
    status = stop_with_savepoint_after(Job(pipeline(), cfg, spark), 2).run()
    location = str(status.stopped_with_savepoint)
    files = sorted(Path(location.removeprefix("file://")).rglob("kg-*.bin"))
    assert files
    for f in files:  # same sizes: only a restore can tell
        f.write_bytes(b"\x00" * f.stat().st_size)

    restored = with_overrides(cfg, name="corrupt-restored", restore={"source": location})
    driver = Job(pipeline(f"file://{tmp_path}/raw"), restored, spark)
    started = time.monotonic()
    with pytest.raises(JobFailed) as err:
        driver.run()
    elapsed = time.monotonic() - started
    text = str(err.value)
    assert "StatorRestoreError" in text and f"savepoint {location}" in text, text
    assert "cannot be restored; restore from another savepoint or checkpoint" in text
    assert driver.status.restarts == 0  # not through the restart strategy (5 x 2 s)
    assert driver.status.last_error and "StatorRestoreError" in driver.status.last_error
    assert elapsed < 60, elapsed
    raw = tmp_path / "raw"
    assert raw.is_dir()  # the source tasks staged a part there...
    assert not [p for p in raw.rglob("*") if p.is_file()]  # ...which was removed
