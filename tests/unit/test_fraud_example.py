"""``examples/fraud_detection.py`` (two inputs joined, broadcast limits, a session window,
late records to a side output, state TTL) against its plain-Python model, record for
record, through the real driver loop and tasks in this process: failure-free, and with task
attempts failing and the job failing over. The same job on Spark, killed and rescaled, is
``tests/integration/test_fraud_example.py``."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from examples.fraud_detection import build
from stator.sinks.collect import CollectSink
from tests.pipelines.fraud_model import expected
from tests.unit.inprocess_job import Faults, InProcessJob
from tests.unit.inprocess_longrun import LongRunningInProcess
from tests.unit.inprocess_run import run_in_process

TRANSACTIONS = 16_000  # 53 minutes of event time: late transactions after 40
EPOCH = 3_000  # 1,000 transactions (200 s of event time) per epoch and source


@pytest.mark.parametrize("failures", [False, True])
@pytest.mark.parametrize("long_running", [False, True], ids=["per-epoch", "long-running"])
def test_the_fraud_example_equals_its_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failures: bool, long_running: bool
) -> None:
    alerts, sessions, late = CollectSink(), CollectSink(), CollectSink()
    faults = Faults(
        before_commit={(3, "limits-check", 1)},
        after_return={(4, "after-account-change", 0)},
        job_fails={6: 2},
        disk_lost={6},
    )
    run_in_process(
        build(alerts, sessions, late, transactions=TRANSACTIONS, max_parallelism=16),
        tmp_path,
        monkeypatch,
        "parallelism=2",
        f"epoch.max_records={EPOCH}",
        harness=(
            LongRunningInProcess(monkeypatch, faults=faults if failures else Faults())
            if long_running
            else InProcessJob(faults=faults if failures else Faults())
        ),
    )
    want_alerts, want_sessions, want_late = expected(TRANSACTIONS)
    assert len(want_late) > 0 and len(want_alerts) > 100  # the case exercises every part
    assert {a.kind for a in want_alerts} == {"after-account-change", "over-limit", "daily-limit"}
    assert Counter(late.results) == want_late
    assert Counter(sessions.results) == want_sessions
    assert Counter(alerts.results) == want_alerts
