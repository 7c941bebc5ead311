"""Two-input operators on real Spark (local[2]): keyed streams connected by key with a side
output, and a broadcast stream, with exact output (the in-process tests in
``tests/unit/test_multi_input.py`` cover failures and replays)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from stator.config import JobConfig
from stator.sinks import CollectSink
from tests.helpers import run_job, with_overrides
from tests.pipelines.multi_input import (
    RULES,
    broadcast_counts,
    connected,
    expected_balances,
    expected_broadcast_counts,
    expected_match,
)


def test_connected_streams_with_a_side_output(spark: Any, job_config: JobConfig) -> None:
    out, big = CollectSink(), CollectSink()
    config = with_overrides(job_config, parallelism=3, epoch={"max_records": 16})
    status = run_job(connected(out, big), config, spark)
    assert status.finished
    main, side = expected_match()
    assert Counter(r for r in out.results if r[0] != "balance") == main
    assert Counter(big.results) == side
    assert sorted(r[1:3] for r in out.results if r[0] == "balance") == expected_balances()


def test_a_broadcast_stream_on_every_subtask(spark: Any, job_config: JobConfig) -> None:
    out = CollectSink()
    config = with_overrides(job_config, parallelism=2, epoch={"max_records": 20})
    status = run_job(broadcast_counts(out), config, spark)
    assert status.finished
    acks = Counter(r[1:] for r in out.results if r[0] == "ack")
    assert acks == Counter((rule, s) for rule in RULES for s in range(2))
    assert Counter(r for r in out.results if r[0] == "count") == expected_broadcast_counts()
