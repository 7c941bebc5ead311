"""One real-node bed per host: a second one is refused before it touches the host's network.

Nothing here starts a node or changes the host: every step of ``start`` past the lock is
replaced by one that fails the test, so a broken lock cannot disturb a bed that is running.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import NoReturn

import pytest

from tests.testbed import realnodes
from tests.testbed.kube import KubeCluster
from tests.testbed.realnodes import RealNodeError, RealNodes, hold_host


@pytest.fixture(autouse=True)
def lock_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "realnodes.lock"
    monkeypatch.setattr(realnodes, "LOCK_FILE", path)
    monkeypatch.setattr(realnodes, "STATE_FILE", tmp_path / "realnodes.state")
    return path


def test_a_second_holder_is_refused_and_told_who_holds_it(lock_file: Path) -> None:
    first = hold_host()
    try:
        with pytest.raises(RealNodeError, match=r"another real-node bed .* \(pid \d+"):
            hold_host()
    finally:
        first.close()
    hold_host().close()  # released with the file


def test_start_refuses_before_touching_the_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def touched(*_args: object, **_kw: object) -> NoReturn:
        raise AssertionError("a refused bed changed the host")

    for name in ("prepare_host", "_dnat_api", "_start_dns", "_pause_archive"):
        monkeypatch.setattr(RealNodes, name, touched)
    monkeypatch.setattr(realnodes, "_remove_rules", touched)
    monkeypatch.setattr(realnodes, "_run", touched)
    monkeypatch.setattr(shutil, "which", lambda _tool: "/usr/bin/true")
    (tmp_path / "cni").mkdir()
    (tmp_path / "cni" / "bridge").touch()
    monkeypatch.setattr(realnodes, "CNI_BIN", tmp_path / "cni")
    beds = RealNodes(KubeCluster(tmp_path / "kube"), tmp_path / "nodes")
    other = hold_host()
    try:
        with pytest.raises(RealNodeError, match="another real-node bed"):
            beds.start()
        beds.stop()  # the failed start's cleanup: leaves the running bed's state alone
    finally:
        other.close()


def test_a_start_failing_after_the_lock_undoes_its_rule_and_releases_the_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fails() -> NoReturn:
        raise OSError("cannot add the host address")

    removed: list[str] = []
    monkeypatch.setattr(RealNodes, "prepare_host", staticmethod(fails))
    monkeypatch.setattr(realnodes, "_remove_rules", lambda: removed.append("rules"))
    monkeypatch.setattr(shutil, "which", lambda _tool: "/usr/bin/true")
    (tmp_path / "cni").mkdir()
    (tmp_path / "cni" / "bridge").touch()
    monkeypatch.setattr(realnodes, "CNI_BIN", tmp_path / "cni")
    beds = RealNodes(KubeCluster(tmp_path / "kube"), tmp_path / "nodes")
    with pytest.raises(OSError, match="host address"):
        beds.start()
    assert removed == ["rules"]
    hold_host().close()  # the failed bed let go of the host


def test_a_killed_beds_leftovers_are_reclaimed_before_the_next_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bed killed with SIGKILL left its state file: the next start reclaims that bed's
    directory first, records its own, and a finished stop removes the record."""
    order: list[str] = []
    recorded: list[str] = []

    def prepare() -> NoReturn:
        order.append("prepare_host")
        recorded.append(realnodes.STATE_FILE.read_text().strip())
        raise OSError("stop here")

    monkeypatch.setattr(realnodes, "reclaim", lambda workdir: order.append(f"reclaim {workdir}"))
    monkeypatch.setattr(RealNodes, "prepare_host", staticmethod(prepare))
    monkeypatch.setattr(realnodes, "_remove_rules", lambda: None)
    monkeypatch.setattr(shutil, "which", lambda _tool: "/usr/bin/true")
    (tmp_path / "cni").mkdir()
    (tmp_path / "cni" / "bridge").touch()
    monkeypatch.setattr(realnodes, "CNI_BIN", tmp_path / "cni")
    realnodes.STATE_FILE.write_text("/tmp/stator-real-nodes-killed/nodes\n")
    beds = RealNodes(KubeCluster(tmp_path / "kube"), tmp_path / "nodes")
    with pytest.raises(OSError, match="stop here"):
        beds.start()
    assert order == ["reclaim /tmp/stator-real-nodes-killed/nodes", "prepare_host"]
    assert recorded == [str(tmp_path / "nodes")]
    assert not realnodes.STATE_FILE.exists()  # the failed start's stop finished
