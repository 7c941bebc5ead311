"""The operator's kopf handlers: one slow pipeline holds at most one worker (issue 38)."""

from __future__ import annotations

import time

import pytest

from stator_operator import handlers


def test_a_pipeline_whose_call_still_runs_is_skipped_not_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    body = {"metadata": {"uid": "u-1", "namespace": "team", "name": "slow"}}

    def no_api() -> None:
        raise AssertionError("a skipped call reaches nothing")

    monkeypatch.setattr(handlers, "kube", no_api)
    lock = handlers._lock(body)
    with lock:  # its previous call is stuck on a slow endpoint
        started = time.monotonic()
        assert handlers._advance(body) == 0.0
        assert time.monotonic() - started < 0.1
    assert not lock.locked()


def test_kopf_runs_sync_handlers_in_a_bounded_pool() -> None:
    import kopf

    settings = kopf.OperatorSettings()
    handlers.configure(settings)
    assert settings.execution.max_workers == handlers.MAX_WORKERS
