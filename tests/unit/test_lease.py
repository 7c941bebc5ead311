"""One holder of a Lease at a time (stator.ha.lease: operator replicas, drivers), against
an in-memory Lease API that refuses updates with a stale resourceVersion, as the API server
does."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from urllib3.exceptions import MaxRetryError

from stator.ha.lease import LeaseHolder
from tests.helpers import wait_until
from tests.unit.lease_fakes import FakeLeases


def elector(api: FakeLeases, name: str, duration: int = 1) -> LeaseHolder:
    return LeaseHolder(
        "ops", "lead", identity=name, duration_s=duration, renew_s=0.1, retry_s=0.05, api=api
    )


def test_one_replica_leads_and_a_standby_takes_over_when_it_stops_renewing() -> None:
    api = FakeLeases()
    a, b = elector(api, "a"), elector(api, "b")
    a.acquire()
    assert api.holder() == "a"
    assert not b._try_acquire()  # held and fresh: b waits
    lost: list[str] = []
    a.keep_renewing(lost.append)
    time.sleep(1.5)  # longer than the lease: a renews, so b still cannot take it
    assert not b._try_acquire() and api.holder() == "a" and not lost
    a._stop.set()  # a dies without releasing
    started = time.monotonic()
    b.acquire()
    waited = time.monotonic() - started
    assert api.holder() == "b"
    assert 0.5 < waited < 3, waited  # about one lease duration after a's last renewal
    assert api.leases["lead"]["spec"]["leaseTransitions"] == 1


def test_a_released_lease_is_taken_at_once() -> None:
    api = FakeLeases()
    a, b = elector(api, "a", duration=30), elector(api, "b", duration=30)
    a.acquire()
    a.release()
    assert api.holder() is None
    started = time.monotonic()
    b.acquire()
    assert time.monotonic() - started < 1 and api.holder() == "b"


def test_two_standbys_racing_for_one_lease_never_both_win() -> None:
    api = FakeLeases()
    elector(api, "old").acquire()
    api.leases["lead"]["spec"]["holderIdentity"] = None  # released
    racers = [elector(api, f"r{i}") for i in range(8)]
    won: list[str] = []
    barrier = threading.Barrier(len(racers))

    def race(e: LeaseHolder) -> None:
        barrier.wait()
        if e._try_acquire():
            won.append(e.identity)

    threads = [threading.Thread(target=race, args=(e,)) for e in racers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and api.holder() == won[0]


@pytest.mark.parametrize("how", ["taken", "unreachable"])
def test_a_leader_that_may_have_lost_the_lease_gives_up(how: str) -> None:
    api = FakeLeases()
    a = elector(api, "a", duration=1)
    a.acquire()
    lost: list[str] = []
    done = threading.Event()
    a.keep_renewing(lambda reason: (lost.append(reason), done.set()))
    if how == "taken":
        api.leases["lead"]["spec"]["holderIdentity"] = "b"
    else:
        api.down = True
    assert done.wait(5)
    assert ("held by b" if how == "taken" else "could not renew") in lost[0]


def test_a_holder_whose_credentials_are_revoked_knows_it_was_replaced() -> None:
    """A pod's service-account token dies with the pod: a driver whose pod was removed (it was
    replaced) and that runs on behind a partition gets 401 once it is no longer sure."""
    api = FakeLeases()
    a = elector(api, "a", duration=1)
    a.give_up_unrenewed = False  # as a driver: unsure is not lost
    a.acquire()
    lost: list[str] = []
    done = threading.Event()
    a.keep_renewing(lambda reason: (lost.append(reason), done.set()))
    api.down = True  # 503: not sure, but not lost either
    time.sleep(1.5)
    assert not a.valid() and not lost
    api.down, api.refuse = False, True
    assert done.wait(5)
    assert "refuses this holder (401)" in lost[0]


def test_an_api_server_not_yet_reachable_is_waited_for() -> None:
    api = FakeLeases()
    calls = [0]
    read = api.read_namespaced_lease

    def flaky(name: str, namespace: str, _request_timeout: float | None = None) -> Any:
        calls[0] += 1
        if calls[0] <= 2:
            raise MaxRetryError(None, "/lease", "connection refused")  # type: ignore[arg-type]
        return read(name, namespace, _request_timeout)

    api.read_namespaced_lease = flaky  # type: ignore[method-assign]
    a = elector(api, "a")
    a.acquire()
    assert api.holder() == "a" and calls[0] == 3


def test_the_published_duration_covers_the_holders_whole_write_window() -> None:
    # The holder writes until duration - renew after its renewal; a contender waits the
    # published whole seconds: rounded down, 10.4 s would be 10 s, 0.1 s of two writers.
    api = FakeLeases()
    holder = LeaseHolder(
        "ops", "lead", identity="a", duration_s=10.4, renew_s=0.3, retry_s=0.05, api=api
    )
    holder.acquire()
    assert api.leases["lead"]["spec"]["leaseDurationSeconds"] == 11


def test_every_lease_call_has_a_request_timeout() -> None:
    """Issue 38: a hung connection to the API server must not outlast the Lease it renews."""
    api = FakeLeases()
    holder = LeaseHolder("ops", "lead", duration_s=3, renew_s=1, api=api)
    assert holder.acquire()
    acquired = api.version
    holder.keep_renewing(lambda reason: None)
    wait_until("a renewal", lambda: api.version > acquired, timeout=10)
    holder.release()
    assert getattr(api, "untimed", 0) == 0
