"""The operator chart as Helm renders it: what a values change does to the Deployment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.testbed.kube import KubeCluster

CHART = Path(__file__).resolve().parents[2] / "charts" / "stator-operator"


def _deployment(kube: KubeCluster, *sets: str) -> dict[str, Any]:
    args = [a for s in sets for a in ("--set", s)]
    rendered = kube.helm("template", "stator", str(CHART), "--namespace", "ops", *args).stdout
    (deploy,) = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Deployment"]
    return deploy  # type: ignore[no-any-return]


def test_the_standby_is_spread_to_another_node_by_default(kube: KubeCluster) -> None:
    """Two replicas on one node go together when it is lost: the leader and its standby
    are spread by hostname (softly: a one-node cluster still runs both)."""
    deploy = _deployment(kube)
    assert deploy["spec"]["replicas"] == 2
    spec = deploy["spec"]["template"]["spec"]
    (spread,) = spec["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway"
    labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert spread["labelSelector"]["matchLabels"].items() <= labels.items()
    assert "affinity" not in spec


def test_spreading_can_be_turned_off_or_replaced(kube: KubeCluster) -> None:
    off = _deployment(kube, "spreadAcrossNodes=false")["spec"]["template"]["spec"]
    assert "topologySpreadConstraints" not in off
    own = _deployment(
        kube,
        "spreadAcrossNodes=false",
        "topologySpreadConstraints[0].maxSkew=1",
        "topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone",
        "topologySpreadConstraints[0].whenUnsatisfiable=DoNotSchedule",
    )["spec"]["template"]["spec"]
    assert [c["topologyKey"] for c in own["topologySpreadConstraints"]] == [
        "topology.kubernetes.io/zone"
    ]
