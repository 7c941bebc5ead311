"""Issue 37's pipeline on Spark: a value state holding the timer a key registered, cleared in
``on_timer`` and read again in a later epoch, with subtasks moving between Spark's Python
workers (four subtasks on ``local[2]``, the warm cache on, so caches travel through the warm
cache file). Before the fix the read came back as a bare ``object`` and the job failed in
epoch 3. The output must equal the plain-Python model's, record for record per key."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from stator import BoundedOutOfOrderness, Pipeline
from stator.config import JobConfig
from stator.sinks import CollectSink
from stator.sources import list_source
from tests.helpers import run_job, with_overrides
from tests.state_model import Program, Record, model, record_times

EPOCH, DELAY = 40, 5


def records(n: int, keys: int, seed: int = 37) -> list[Record]:
    """Mostly the report's pattern (keep the latest due time, register a timer when it
    grows), with reads and clears of the other states mixed in."""
    rng = random.Random(seed)
    out: list[Record] = []
    for seq in range(n):
        ts = seq // 4 + rng.randrange(4)
        ops: list[tuple[Any, ...]] = [("v.due", ts + rng.randrange(1, 12))]
        roll = rng.random()
        if roll < 0.2:
            ops += [("r.add", 1), ("l.add", seq % 5)]
        elif roll < 0.3:
            ops += [("l.clear",), ("r.get",), ("m.put", seq % 3, seq)]
        elif roll < 0.35:
            ops += [("v.clear",), ("v.get",), ("m.items",)]
        out.append((f"u{rng.randrange(keys)}", seq, ts, tuple(ops)))
    return out


def test_a_cleared_value_reads_as_absent_after_subtasks_move_between_workers(
    spark: Any, job_config: JobConfig
) -> None:
    events = records(600, keys=40)
    sink = CollectSink()
    p = Pipeline("profile", max_parallelism=16)
    (
        p.source(
            list_source(events),
            uid="in",
            timestamps=lambda r: r[2],
            watermarks=BoundedOutOfOrderness(DELAY),
        )
        .key_by(lambda r: r[0])
        .process(Program(), uid="profile", parallelism=4)
        .sink(sink, uid="out")
    )
    config = with_overrides(job_config, epoch={"max_records": EPOCH})
    assert config.state.warm_cache_entries > 0
    status = run_job(p, config, spark)
    assert status.finished, status.last_error

    got: dict[str, list[Any]] = {}
    for epoch in sorted(sink.by_epoch):
        for key, item in sink.by_epoch[epoch]:
            got.setdefault(key, []).append(item)
    expected = model(events, EPOCH, DELAY, record_times(got))
    assert got == expected
    fired = sum(1 for items in expected.values() for item in items if item[0] == "fire")
    assert fired > 100, "the timers fired (and cleared the value) throughout the run"
    # Subtasks moved between the two Python workers: their caches went through the file.
    assert list(Path(config.state.local_dir).rglob("warm.pickle")), "no subtask moved"
