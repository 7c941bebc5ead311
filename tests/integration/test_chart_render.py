"""The operator chart as Helm renders it: what a values change does to the Deployment, and
the monitoring it adds when asked (the Grafana dashboard, a monitor per pipeline's driver)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from stator_operator.naming import CONTROL_TOKEN_KEY, read_secret_name
from stator_operator.pipeline_spec import PipelineSpec
from stator_operator.resources import driver_pod, service
from tests.dashboard import load
from tests.testbed.kube import KubeCluster

CHART = Path(__file__).resolve().parents[2] / "charts" / "stator-operator"
MONITOR_KINDS = {"ConfigMap", "PodMonitor", "ServiceMonitor", "NetworkPolicy"}


def _render(kube: KubeCluster, *sets: str) -> list[dict[str, Any]]:
    args = [a for s in sets for a in ("--set", s)]
    rendered = kube.helm("template", "stator", str(CHART), "--namespace", "ops", *args).stdout
    return [d for d in yaml.safe_load_all(rendered) if d]


def _refusal(kube: KubeCluster, *sets: str) -> str:
    args = [a for s in sets for a in ("--set", s)]
    proc = kube.helm("template", "stator", str(CHART), "-n", "ops", *args, check=False)
    assert proc.returncode != 0, proc.stdout
    return proc.stderr


def _deployment(kube: KubeCluster, *sets: str) -> dict[str, Any]:
    (deploy,) = [d for d in _render(kube, *sets) if d["kind"] == "Deployment"]
    return deploy


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


# ------------------------------------------------------------------ monitoring

PIPELINES = (
    "monitoring.pipelines[0].name=clicks",
    "monitoring.pipelines[0].namespace=analytics",
    "monitoring.pipelines[1].name=payments",
    "monitoring.pipelines[1].namespace=billing",
)


def _driver(name: str, namespace: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The driver pod and Service the operator makes for pipeline ``name``."""
    body = {"metadata": {"name": name, "namespace": namespace, "uid": "u"}}
    spec = PipelineSpec.read(
        {"image": "i:1", "entrypoint": "m:build", "checkpointing": {"storage": "file:///ck"}}
    )
    return driver_pod(body, spec, "1", "none", False), service(body)


def test_no_dashboard_monitor_or_policy_by_default(kube: KubeCluster) -> None:
    """The monitors' kinds need the Prometheus Operator's CRDs: nothing unless asked."""
    assert not [d for d in _render(kube) if d["kind"] in MONITOR_KINDS]


def test_the_dashboard_configmap_carries_the_dashboard_with_the_sidecars_label(
    kube: KubeCluster,
) -> None:
    (cm,) = [
        d for d in _render(kube, "monitoring.dashboard.enabled=true") if d["kind"] in MONITOR_KINDS
    ]
    assert cm["kind"] == "ConfigMap"
    assert cm["metadata"]["namespace"] == "ops"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert "annotations" not in cm["metadata"]
    (text,) = cm["data"].values()
    assert json.loads(text) == load(), "the file, byte for byte as JSON"

    (cm,) = [
        d
        for d in _render(
            kube,
            "monitoring.dashboard.enabled=true",
            "monitoring.dashboard.namespace=grafana",
            "monitoring.dashboard.labels.grafana_dashboard=null",
            "monitoring.dashboard.labels.dashboards=stator",
            "monitoring.dashboard.annotations.grafana_folder=Stator",
        )
        if d["kind"] in MONITOR_KINDS
    ]
    assert cm["metadata"]["namespace"] == "grafana"
    assert "grafana_dashboard" not in cm["metadata"]["labels"]
    assert cm["metadata"]["labels"]["dashboards"] == "stator"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "Stator"}


def test_a_pod_monitor_per_pipeline_scrapes_its_driver_with_its_token(kube: KubeCluster) -> None:
    docs = _render(
        kube, "monitoring.podMonitor.enabled=true", "monitoring.labels.release=prom", *PIPELINES
    )
    monitors = {d["metadata"]["name"]: d for d in docs if d["kind"] in MONITOR_KINDS}
    assert set(monitors) == {"clicks-stator-driver", "payments-stator-driver"}
    for name, namespace in (("clicks", "analytics"), ("payments", "billing")):
        monitor = monitors[f"{name}-stator-driver"]
        assert monitor["kind"] == "PodMonitor"
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert monitor["metadata"]["namespace"] == namespace, "where the token's Secret is"
        assert monitor["metadata"]["labels"]["release"] == "prom"
        pod, _ = _driver(name, namespace)
        other, _ = _driver("clicks" if name == "payments" else "payments", namespace)
        selector = monitor["spec"]["selector"]["matchLabels"]
        assert selector.items() <= pod["metadata"]["labels"].items()
        assert not selector.items() <= other["metadata"]["labels"].items()
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        assert endpoint["port"] in ports and endpoint["path"] == "/metrics"
        assert endpoint["interval"] == "30s"
        assert endpoint["authorization"] == {
            "type": "Bearer",
            "credentials": {"name": read_secret_name(name), "key": CONTROL_TOKEN_KEY},
        }
        # The metrics' own label job (the Stator job) is kept as job.
        relabel, drop = endpoint["metricRelabelings"]
        assert (relabel["sourceLabels"], relabel["targetLabel"]) == (["exported_job"], "job")
        assert drop == {"regex": "exported_job", "action": "labeldrop"}


def test_a_service_monitor_selects_the_drivers_service(kube: KubeCluster) -> None:
    docs = _render(kube, "monitoring.serviceMonitor.enabled=true", *PIPELINES[:2])
    (monitor,) = [d for d in docs if d["kind"] in MONITOR_KINDS]
    assert monitor["kind"] == "ServiceMonitor"
    _, svc = _driver("clicks", "analytics")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in svc["spec"]["ports"]}
    assert endpoint["authorization"]["credentials"]["name"] == "clicks-read"


def test_prometheus_elsewhere_is_admitted_to_the_drivers_control_port(kube: KubeCluster) -> None:
    docs = _render(
        kube,
        "monitoring.podMonitor.enabled=true",
        "monitoring.prometheus.namespace=monitoring",
        "monitoring.prometheus.podLabels.app=prometheus",
        *PIPELINES[:2],
    )
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert policy["metadata"]["name"] == "clicks-stator-prometheus"
    assert policy["metadata"]["namespace"] == "analytics"
    pod, _ = _driver("clicks", "analytics")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    (rule,) = policy["spec"]["ingress"]
    assert rule["from"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
            "podSelector": {"matchLabels": {"app": "prometheus"}},
        }
    ]
    ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
    assert [p["port"] for p in rule["ports"]] == ["control"] and "control" in ports


def test_monitoring_values_that_would_do_nothing_or_twice_are_refused(kube: KubeCluster) -> None:
    both = ("monitoring.podMonitor.enabled=true", "monitoring.serviceMonitor.enabled=true")
    assert "not both" in _refusal(kube, *both, *PIPELINES[:2])
    assert "list the pipelines to scrape" in _refusal(kube, "monitoring.podMonitor.enabled=true")
    assert "enable monitoring.podMonitor" in _refusal(kube, *PIPELINES[:2])
    assert "monitoring.prometheus" in _refusal(kube, "monitoring.prometheus.namespace=mon")
    assert "pipelines[0].namespace is required" in _refusal(
        kube, "monitoring.podMonitor.enabled=true", "monitoring.pipelines[0].name=x"
    )
    assert "analytics is not in watchNamespaces" in _refusal(
        kube, "monitoring.podMonitor.enabled=true", "watchNamespaces={billing}", *PIPELINES
    )
