"""The driver's memory of where keyed subtasks ran, and the locations it asks Spark for."""

from __future__ import annotations

from pathlib import Path

import pytest

from stator.driver import spark_session
from stator.driver.spark_session import placement_conf
from stator.epoch.reports import RestoreReport, RestoreSource, StateReport
from stator.epoch.spec import NODE_NAME_ENV, STATE_DIR_ENV
from stator.errors import ConfigError
from stator.locality import placement
from stator.locality.inventory import Holding, list_copies
from stator.locality.placement import (
    LocalRestore,
    PlacementTracker,
    Placer,
    standby_holdings,
    uses_placement,
)


def report(
    subtask: int, executor: str, host: str = "10.0.0.1", restored: str = RestoreSource.NONE
) -> StateReport:
    restore = RestoreReport(RestoreSource(restored))
    return StateReport("count", subtask, 1, 0, 0, 0, restore=restore, executor=executor, host=host)


def test_only_multi_executor_masters_use_placement() -> None:
    assert uses_placement("local-cluster[3,1,1024]")
    assert uses_placement("k8s://https://10.0.0.1:443")
    assert not uses_placement("local[*]") and not uses_placement("local[2,4]")
    assert placement_conf("local[*]", {}) == {}  # no jar, no settings: today's path


def test_prefers_the_executor_that_ran_the_subtask() -> None:
    t = PlacementTracker()
    assert t.locations("count", 2) == ["", ""]
    first = t.record([report(0, "1"), report(1, "2", "10.0.0.2")], {"count": 2})
    assert (first.local, first.total) == (2, 2)  # no state anywhere yet: wherever they ran
    assert t.locations("count", 2) == ["executor_10.0.0.1_1", "executor_10.0.0.2_2"]
    moved = t.record([report(0, "1"), report(1, "3", "10.0.0.2", "remote")], {"count": 2})
    assert (moved.local, moved.total) == (1, 2)
    assert t.locations("count", 2)[1] == "executor_10.0.0.2_3"
    assert t.locations("count", 3) == ["", "", ""]  # rescaled: no preferences


def test_tasks_without_an_executor_are_not_counted() -> None:
    t = PlacementTracker()
    assert t.record([report(0, "")], {"count": 1}).total == 0


def test_a_lost_executor_gives_way_to_its_host_then_to_anywhere() -> None:
    t = PlacementTracker()
    t.record([report(0, "1"), report(1, "2", "10.0.0.2")], {"count": 2})
    live = {"1": "10.0.0.1", "3": "10.0.0.2"}  # executor 2 is gone, its host has executor 3
    assert t.locations("count", 2, live) == ["executor_10.0.0.1_1", "10.0.0.2"]
    # Its host is gone too: the least loaded live executor (here the only one).
    assert t.locations("count", 2, {"1": "10.0.0.1"}) == ["executor_10.0.0.1_1"] * 2


def test_subtasks_without_state_are_spread_over_the_live_executors() -> None:
    t = PlacementTracker()
    live = {"1": "10.0.0.1", "2": "10.0.0.2", "10": "10.0.0.3"}
    assert (
        t.locations("count", 6, live)
        == [
            "executor_10.0.0.1_1",
            "executor_10.0.0.2_2",
            "executor_10.0.0.3_10",
        ]
        * 2
    )
    # Subtasks that have an executor keep it; the others fill the least loaded.
    t.record([report(0, "1"), report(1, "1"), report(2, "2", "10.0.0.2")], {"count": 4})
    assert t.locations("count", 4, live) == [
        "executor_10.0.0.1_1",
        "executor_10.0.0.1_1",
        "executor_10.0.0.2_2",
        "executor_10.0.0.3_10",
    ]


class ThreeExecutors:
    """A SparkContext of ``local-cluster[3,...]`` as far as a Placer asks."""

    master = "local-cluster[3,1,1024]"

    def getConf(self) -> dict[str, str]:
        return {}


def test_the_first_plan_waits_for_the_requested_executors_to_register(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Executors are listed one by one (Spark starts jobs before every block manager has
    registered): the first epoch's subtasks spread over all three, not the first two, and
    stay there; later plans never wait."""
    listed = [{"0": "h"}, {"0": "h", "1": "h"}, {"0": "h", "1": "h", "2": "h"}]
    calls: list[int] = []

    def live(sc: object) -> dict[str, str]:
        calls.append(1)
        return listed[min(len(calls), len(listed)) - 1]

    monkeypatch.setattr(placement, "live_executors", live)
    placer = Placer(ThreeExecutors(), "job", str(tmp_path), 20_000, False)
    first = placer.for_epoch({"count": 3}, None)
    assert first.by_operator["count"] == [f"executor_h_{e}" for e in "012"]
    assert len(calls) == 3
    placer.for_epoch({"count": 3}, None)
    assert len(calls) == 4  # once per later plan


def test_the_first_plan_spreads_over_those_registered_when_the_wait_runs_out(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(placement, "live_executors", lambda sc: {"0": "h", "1": "h"})
    placer = Placer(ThreeExecutors(), "job", str(tmp_path), 50, False)
    plan = placer.for_epoch({"count": 3}, None)
    assert plan.by_operator["count"] == ["executor_h_0", "executor_h_1", "executor_h_0"]


def test_without_a_jdk_the_job_runs_without_placement(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_javac() -> None:
        raise ConfigError("'javac' not found")

    monkeypatch.setattr(spark_session, "ensure_jar", no_javac)
    assert placement_conf("k8s://https://10.0.0.1:443", {}) == {}


def test_a_replacement_holding_the_local_copy_is_preferred_to_the_old_host() -> None:
    """Executor 2 died; executor 4 (same node and volume) holds subtask 1's copy of
    checkpoint 7: the subtask goes there. Executor 5 holds only a copy of another checkpoint
    or another parallelism, which does not count."""
    t = PlacementTracker()
    t.record([report(0, "1"), report(1, "2", "10.0.0.2")], {"count": 2})
    live = {"1": "10.0.0.1", "4": "10.0.0.4", "5": "10.0.0.2"}
    holdings = {
        "4": Holding("4", "10.0.0.4", "node-b", frozenset({("count", 1, 2, 7)})),
        "5": Holding(
            "5", "10.0.0.2", "node-a", frozenset({("count", 1, 2, 6), ("count", 1, 3, 7)})
        ),
    }
    restore = LocalRestore(7, frozenset({"count"}))
    assert t.locations("count", 2, live, holdings, restore) == [
        "executor_10.0.0.1_1",  # its executor lives: no restore at all
        "executor_10.0.0.4_4",
    ]
    # Without a restore of this job's checkpoint (a savepoint, a rescale) copies do not count.
    assert t.locations("count", 2, live, holdings, None)[1] == "10.0.0.2"
    assert t.locations("count", 2, live, holdings, LocalRestore(7, frozenset()))[1] == "10.0.0.2"


def test_a_new_driver_places_every_subtask_by_the_survey() -> None:
    t = PlacementTracker()  # nothing ran yet under this driver
    live = {"1": "10.0.0.1", "2": "10.0.0.2"}
    holdings = {
        "1": Holding("1", "10.0.0.1", "n1", frozenset({("count", 1, 2, 3)})),
        "2": Holding("2", "10.0.0.2", "n2", frozenset({("count", 0, 2, 3)})),
    }
    assert t.stranded({"count": 2}, live) == [("count", 0, 2), ("count", 1, 2)]
    restore = LocalRestore(3, frozenset({"count"}))
    assert t.locations("count", 2, live, holdings, restore) == [
        "executor_10.0.0.2_2",
        "executor_10.0.0.1_1",
    ]
    # Restored from those copies: they ran where their state was.
    placed = t.record(
        [report(0, "2", "10.0.0.2", "local"), report(1, "1", "10.0.0.1", "remote")], {"count": 2}
    )
    assert (placed.local, placed.total) == (1, 2)
    assert t.stranded({"count": 2}, live) == []


def test_a_lost_executors_subtasks_go_to_their_live_standby_executors_without_a_survey() -> None:
    t = PlacementTracker()
    t.record([report(0, "1", "10.0.0.1"), report(1, "1", "10.0.0.1")], {"count": 2})
    t.standby = {("count", 0, 2): ("2", "n2"), ("count", 1, 2): ("3", "n3")}
    live = {"2": "10.0.0.2", "3": "10.0.0.3"}  # executor 1 is lost
    stranded = t.stranded({"count": 2}, live)
    restore = LocalRestore(9, frozenset({"count"}))
    holdings = standby_holdings(t.standby, stranded, restore, live)
    assert holdings == {
        "2": Holding("2", "10.0.0.2", "n2", frozenset(), frozenset({("count", 0, 2, 9)})),
        "3": Holding("3", "10.0.0.3", "n3", frozenset(), frozenset({("count", 1, 2, 9)})),
    }
    planned = t.plan({"count": 2}, live, holdings, restore)
    assert planned.by_operator["count"] == ["executor_10.0.0.2_2", "executor_10.0.0.3_3"]
    # Sent to the executors that hold their state: a retry elsewhere waits, as after a survey.
    assert planned.pinned == {
        ("count", 0): "executor_10.0.0.2_2",
        ("count", 1): "executor_10.0.0.3_3",
    }


def test_a_subtask_without_a_live_standby_executor_makes_the_driver_survey() -> None:
    restore = LocalRestore(9, frozenset({"count"}))
    stranded = [("count", 0, 2), ("count", 1, 2)]
    live = {"2": "10.0.0.2"}
    both = {("count", 0, 2): ("2", "n2"), ("count", 1, 2): ("3", "n3")}
    assert standby_holdings(both, stranded, restore, live) is None  # executor 3 is gone too
    assert standby_holdings({("count", 0, 2): ("2", "n2")}, stranded, restore, live) is None


def test_executors_report_their_local_copies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The survey task reads the executor's own state directory (STATOR_STATE_DIR beats the
    job's state.local_dir) and its node."""
    own = tmp_path / "volume"
    for rel in ("job/count/0-of-2/chk-3", "job/count/0-of-2/chk-4", "job/count/1-of-3/chk-4"):
        (own / rel).mkdir(parents=True)
    (own / "job/count/0-of-2/db").mkdir()
    (own / "job/count/stray").mkdir()
    monkeypatch.setenv(STATE_DIR_ENV, str(own))
    monkeypatch.setenv(NODE_NAME_ENV, "node-1")
    [(executor, host, node, copies, standby)] = list(list_copies("job", "/nonexistent", []))
    assert (executor, host, node) == ("", "", "node-1")  # outside a Spark task: no executor
    assert copies == [("count", 0, 2, 3), ("count", 0, 2, 4), ("count", 1, 3, 4)]
    assert standby == []  # no standby copies (tests/unit/test_standby_copies.py)
    monkeypatch.delenv(STATE_DIR_ENV)
    assert next(list_copies("job", str(own), []))[3] == copies


def test_an_epoch_plan_pins_only_subtasks_sent_where_their_state_is() -> None:
    """Subtask 0's executor lives; subtask 1's is gone but executor 4 holds its local copy;
    subtask 2's is gone with no copy anywhere (it restores from the object store, wherever
    Spark runs it). Only 0 and 1 are pinned: a Spark retry of theirs elsewhere must not
    restore from the object store."""
    t = PlacementTracker()
    t.record([report(0, "1"), report(1, "2", "10.0.0.2"), report(2, "3", "10.0.0.3")], {"count": 3})
    live = {"1": "10.0.0.1", "4": "10.0.0.4"}
    holdings = {"4": Holding("4", "10.0.0.4", "node-b", frozenset({("count", 1, 3, 7)}))}
    plan = t.plan({"count": 3}, live, holdings, LocalRestore(7, frozenset({"count"})))
    assert plan("count", 3) == ["executor_10.0.0.1_1", "executor_10.0.0.4_4", plan("count", 3)[2]]
    assert plan("count", 3)[2] in ("executor_10.0.0.1_1", "executor_10.0.0.4_4")  # spread
    assert plan.pinned == {
        ("count", 0): "executor_10.0.0.1_1",
        ("count", 1): "executor_10.0.0.4_4",
    }
    # No local copy can serve the restore (local recovery off, a savepoint, a rescaled
    # operator): the driver would not wait for a replacement, so nothing is pinned.
    for restore in (None, LocalRestore(7, frozenset())):
        assert t.plan({"count": 3}, live, holdings, restore).pinned == {}


def test_a_keyed_stage_names_the_executors_that_alone_hold_each_subtasks_state() -> None:
    """What the JVM listener cancels an epoch on (``locality/state_holders.py``): a pinned subtask's
    executor and any standby holder of it; a subtask not pinned restores elsewhere."""
    from types import SimpleNamespace
    from typing import cast

    from stator.epoch.spec import EpochSpec, StandbyOrder
    from stator.keygroups import SubtaskId
    from stator.locality.state_holders import state_on

    spec = SimpleNamespace(
        pinned={SubtaskId("count", 0): "executor_h1_1", SubtaskId("count", 2): "executor_h2_2"},
        standby=SimpleNamespace(
            orders={
                "executor_h3_3": (StandbyOrder("count", 2, 4, 7, ()),),
                "executor_h1_1": (StandbyOrder("other", 2, 4, 7, ()),),
            }
        ),
    )
    held = state_on(cast(EpochSpec, spec), "count", 4)
    assert held == ["executor_h1_1", "", "executor_h2_2,executor_h3_3", ""]
    spec.standby = None
    assert state_on(cast(EpochSpec, spec), "count", 4)[2] == "executor_h2_2"
