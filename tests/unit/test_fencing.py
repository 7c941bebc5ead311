"""The driver's lease fences a replaced driver (stator.ha.fencing): against the in-memory
Lease API of lease_fakes, with real threads and short durations."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stator.checkpoint.coordinator import CheckpointCoordinator
from stator.config import LeaseConfig, load_config
from stator.driver.completion import PendingOutput
from stator.errors import ConfigError
from stator.ha import fencing
from stator.ha.lease import RELEASED_FOR
from stator.storage import open_store
from tests.helpers import wait_until
from tests.unit.lease_fakes import FakeLeases

ENV = {"STATOR_POD_NAME": "driver-a", "STATOR_POD_NAMESPACE": "team"}
CONFIG = LeaseConfig(name="lead", duration_ms=1000, renew_ms=200)


class Exited(Exception):
    pass


@pytest.fixture
def exits(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    codes: list[int] = []

    def fake_exit(code: int) -> None:
        codes.append(code)
        raise Exited(code)

    monkeypatch.setattr(fencing.os, "_exit", fake_exit)
    yield codes
    fencing.release()
    # A renewal thread that found the lease taken calls the fake exit on each round until
    # released; it must end before the real os._exit is back, or it ends pytest (exit 4).
    for thread in threading.enumerate():
        if thread.name.startswith("lease-"):
            thread.join(timeout=5)
            assert not thread.is_alive(), f"{thread.name} still renews after its release"


def test_without_a_lease_name_nothing_is_held_and_every_write_goes_on(exits: list[int]) -> None:
    assert fencing.hold(LeaseConfig(), ENV)
    fencing.guard("checkpoint 1")
    assert not exits and not fencing.took_over()


def test_a_held_lease_lets_writes_go_on_and_a_taken_one_ends_the_process(
    exits: list[int],
) -> None:
    api = FakeLeases()
    api.create_namespaced_lease("team", {"metadata": {"name": "lead"}, "spec": {}})
    assert fencing.hold(CONFIG, ENV, api=api)
    assert api.leases["lead"]["spec"]["holderIdentity"] == "driver-a"
    fencing.guard("checkpoint 1")  # valid: no wait
    time.sleep(1.5)  # longer than the lease: it is renewed meanwhile
    fencing.guard("checkpoint 2")
    assert not exits
    # Another driver takes it (as after the operator replaced this one): the renewal thread
    # ends the process; a guard of this holder would too.
    api.leases["lead"]["spec"]["holderIdentity"] = "driver-b"
    with pytest.raises(Exited):
        for _ in range(50):
            fencing.guard("checkpoint 3")
            time.sleep(0.1)
    assert fencing.LEASE_LOST_EXIT in exits


def test_an_unsure_holder_waits_for_a_renewal_instead_of_writing(exits: list[int]) -> None:
    api = FakeLeases()
    api.create_namespaced_lease("team", {"metadata": {"name": "lead"}, "spec": {}})
    assert fencing.hold(CONFIG, ENV, api=api)
    api.down = True  # the API server is away: renewals fail, the lease is not sure
    holder = fencing._holder
    assert holder is not None
    wait_until("the lease unsure", lambda: not holder.valid(), timeout=10)
    done = threading.Event()

    def write() -> None:
        fencing.guard("checkpoint 7")
        done.set()

    threading.Thread(target=write, daemon=True).start()
    assert not done.wait(0.8)  # no write while unsure
    api.down = False  # a renewal succeeds: nobody took it, the write goes on
    assert done.wait(3)
    assert not exits


def test_a_driver_waits_for_a_live_holder_and_takes_over_a_silent_one(exits: list[int]) -> None:
    api = FakeLeases()
    api.create_namespaced_lease(
        "team",
        {"metadata": {"name": "lead"}, "spec": {"holderIdentity": "old", "renewTime": None}},
    )
    api.leases["lead"]["spec"]["leaseDurationSeconds"] = 1
    started = time.monotonic()
    assert fencing.hold(CONFIG, ENV, api=api)
    assert 0.9 < time.monotonic() - started < 3  # one duration after it last saw a change
    assert fencing.took_over() and api.holder() == "driver-a"


def test_a_driver_that_took_over_skips_checkpoint_ids(tmp_path: Path, exits: list[int]) -> None:
    store = open_store(f"file://{tmp_path}/ck")
    store.put("chk-4/op/0/MANIFEST", b"x")  # a previous driver's, in flight
    fresh = CheckpointCoordinator(store)
    fresh.recover()
    assert fresh.next_id == 5
    api = FakeLeases()
    api.create_namespaced_lease(
        "team", {"metadata": {"name": "lead"}, "spec": {"holderIdentity": "old"}}
    )
    api.leases["lead"]["spec"]["leaseDurationSeconds"] = 1
    assert fencing.hold(CONFIG, ENV, api=api) and fencing.took_over()
    store.put("chk-4/op/0/MANIFEST", b"x")  # still in flight when the new driver starts
    taker = CheckpointCoordinator(store)
    taker.recover()
    assert taker.next_id == 5 + fencing.TAKEOVER_ID_GAP
    taker.recover()  # a later failover of the same driver stays above the old driver's ids
    assert taker.next_id == 5 + fencing.TAKEOVER_ID_GAP


def test_lease_timing_is_checked() -> None:
    with pytest.raises(ConfigError, match=r"lease.duration_ms .* at least twice"):
        load_config(overrides=["lease.duration_ms=1000", "lease.renew_ms=800"])
    with pytest.raises(ConfigError, match=r"lease\.renew_ms must be >= 1"):
        load_config(overrides=["lease.renew_ms=0"])


def test_a_lease_the_operator_released_for_a_lost_driver_counts_as_taken_over(
    exits: list[int],
) -> None:
    """The operator releases the Lease of a driver whose pod it removed (so the next driver
    need not wait), marking for whom: the next driver still skips checkpoint ids."""
    api = FakeLeases()
    api.create_namespaced_lease(
        "team",
        {
            "metadata": {"name": "lead", "annotations": {RELEASED_FOR: "old"}},
            "spec": {},
        },
    )
    started = time.monotonic()
    assert fencing.hold(CONFIG, ENV, api=api)
    assert time.monotonic() - started < 1 and fencing.took_over()
    assert RELEASED_FOR not in api.leases["lead"]["metadata"]["annotations"]


def test_a_prestarted_driver_prepares_its_lease_client_before_the_hand_over(
    exits: list[int],
) -> None:
    """Loading the Kubernetes client takes about a second: a pre-started driver does it while
    it waits, so the hand-over only acquires (``hold`` without a client of its own here would
    need KUBERNETES_SERVICE_HOST, which ENV lacks)."""
    api = FakeLeases()
    api.create_namespaced_lease("team", {"metadata": {"name": "lead"}, "spec": {}})
    fencing.prepare(CONFIG, ENV, api=api)
    assert fencing.hold(CONFIG, ENV)
    assert api.holder() == "driver-a"
    fencing.release()
    with pytest.raises(ConfigError, match="KUBERNETES_SERVICE_HOST is not"):
        fencing.hold(CONFIG, ENV)  # nothing prepared any more


def test_a_replaced_driver_discards_no_staged_output(exits: list[int]) -> None:
    # Its failover would delete what the new driver staged meanwhile (files.py deletes every
    # staged object after the epoch, whoever wrote it).
    from stator.api.nodes import SinkNode
    from tests.unit.epoch_fakes import RecordingSink

    sink = RecordingSink()
    output = PendingOutput({"out": SinkNode(1, [0], "out", "out", sink)})
    api = FakeLeases()
    api.create_namespaced_lease("team", {"metadata": {"name": "lead"}, "spec": {}})
    assert fencing.hold(CONFIG, ENV, api=api)
    output.rewind(3, {})
    assert sink.discards == [3]
    api.leases["lead"]["spec"]["holderIdentity"] = "driver-b"
    before: list[int] = []
    with pytest.raises(Exited):  # once this driver knows (its next renewal), it stops
        for _ in range(50):
            before = list(sink.discards)
            output.rewind(3, {})
            time.sleep(0.1)
    assert sink.discards == before, "the call that found the lease taken discarded nothing"
    with pytest.raises(Exited):
        output.discard_after(3)
    assert sink.discards == before
