"""The operator's kopf handlers: one slow pipeline holds at most one worker (issue 38)."""

from __future__ import annotations

import time

import pytest

from stator_operator import handlers


def test_a_pipeline_whose_call_still_runs_is_skipped_not_waited_for() -> None:
    body = {"metadata": {"uid": "u-1", "namespace": "team", "name": "slow"}}

    class NoApi:
        def __getattr__(self, name: str) -> None:
            raise AssertionError("a skipped call reaches nothing")

    state = handlers.Shared(kube=NoApi())  # type: ignore[arg-type]
    lock = state.lock(body)
    with lock:  # its previous call is stuck on a slow endpoint
        started = time.monotonic()
        assert handlers._advance(state, body) == 0.0
        assert time.monotonic() - started < 0.1
    assert not lock.locked()


def test_kopf_runs_sync_handlers_in_a_bounded_pool() -> None:
    import kopf

    settings = kopf.OperatorSettings()
    handlers.configure(settings)
    assert settings.execution.max_workers == handlers.MAX_WORKERS


def test_handlers_share_one_state_set_up_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    import kopf

    monkeypatch.setattr(handlers, "Kube", lambda: "the client")
    monkeypatch.setenv("STATOR_REQUIRE_RESTRICTED", "false")
    memo = kopf.Memo()
    handlers.setup(memo)
    state = handlers.shared(memo)
    assert state.kube == "the client" and state.require_restricted is False
    body = {"metadata": {"uid": "u-1"}}
    assert state.lock(body) is handlers.shared(kopf.Memo(memo)).lock(body)
