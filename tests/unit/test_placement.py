"""The driver's memory of where keyed subtasks ran, and the locations it asks Spark for."""

from __future__ import annotations

import pytest

from stator.cluster import session
from stator.cluster.placement import PlacementTracker, uses_placement
from stator.cluster.session import placement_conf
from stator.epoch.reports import StateReport
from stator.errors import ConfigError


def report(subtask: int, executor: str, host: str = "10.0.0.1") -> StateReport:
    return StateReport("count", subtask, 1, 0, 0, 0, executor=executor, host=host)


def test_only_multi_executor_masters_use_placement() -> None:
    assert uses_placement("local-cluster[3,1,1024]")
    assert uses_placement("k8s://https://10.0.0.1:443")
    assert not uses_placement("local[*]") and not uses_placement("local[2,4]")
    assert placement_conf("local[*]", {}) == {}  # no jar, no settings: today's path


def test_prefers_the_executor_that_ran_the_subtask() -> None:
    t = PlacementTracker()
    assert t.locations("count", 2) == ["", ""]
    first = t.record([report(0, "1"), report(1, "2", "10.0.0.2")], {"count": 2})
    assert (first.local, first.total) == (0, 2)
    assert t.locations("count", 2) == ["executor_10.0.0.1_1", "executor_10.0.0.2_2"]
    moved = t.record([report(0, "1"), report(1, "3", "10.0.0.2")], {"count": 2})
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
    assert t.locations("count", 2, {"1": "10.0.0.1"}) == ["executor_10.0.0.1_1", ""]


def test_without_a_jdk_the_job_runs_without_placement(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_javac() -> None:
        raise ConfigError("'javac' not found")

    monkeypatch.setattr(session, "ensure_jar", no_javac)
    assert placement_conf("k8s://https://10.0.0.1:443", {}) == {}
