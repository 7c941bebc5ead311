"""The chart's Grafana dashboard as a file: the metric names its queries read (what the
no-dead-panels test, tests/integration/test_dashboard_metrics.py, holds against a running
driver's scrape), and a shape Grafana loads with every panel following the variables."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tests.dashboard import dead_metrics, load, metric_names, panels, queries

SCRAPE = """\
# HELP stator_records_in_total Records read from sources
# TYPE stator_records_in_total counter
stator_records_in_total{job="j"} 10.0
# HELP stator_epoch_duration_seconds Wall time of each epoch
# TYPE stator_epoch_duration_seconds histogram
stator_epoch_duration_seconds_bucket{job="j",le="0.5"} 1.0
stator_epoch_duration_seconds_bucket{job="j",le="+Inf"} 2.0
stator_epoch_duration_seconds_sum{job="j"} 1.5
stator_epoch_duration_seconds_count{job="j"} 2.0
# HELP stator_source_lag_records Records not yet read
# TYPE stator_source_lag_records gauge
"""


def test_metric_names_are_the_identifiers_read_not_functions_labels_or_strings() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (job, le)"
        ' (rate(stator_epoch_duration_seconds_bucket{job=~"$job"}[5m])))'
        " / sum(stator_records_in_total) + stator_running"
        ' + count(up{job="stator_not_a_metric"}) + on(job) stator_state_bytes[1m]'
    )
    assert metric_names(expr) == {
        "stator_epoch_duration_seconds_bucket",
        "stator_records_in_total",
        "stator_running",
        "stator_state_bytes",
    }
    assert metric_names('label_values(stator_running{namespace=~"$namespace"}, job)') == {
        "stator_running"
    }


def test_a_panel_naming_a_metric_no_driver_exports_is_reported_dead() -> None:
    dashboard: dict[str, Any] = {
        "panels": [
            {
                "title": "fine",
                "targets": [
                    {"refId": "A", "expr": "rate(stator_records_in_total[5m])"},
                    {"refId": "B", "expr": "rate(stator_epoch_duration_seconds_sum[5m])"},
                ],
            },
            {
                "title": "typo",
                "type": "row",
                "panels": [
                    {
                        "title": "inner",
                        "targets": [{"refId": "A", "expr": "rate(stator_records_in[5m])"}],
                    }
                ],
                "targets": [{"refId": "A", "expr": "stator_source_lag_records"}],
            },
        ],
        "templating": {"list": [{"type": "query", "name": "v", "query": "stator_nope"}]},
    }
    assert dead_metrics(dashboard, SCRAPE) == {
        # a counter's family name without the _total that prometheus_client appends
        "stator_records_in": ["panel 'inner' A"],
        # a family with a HELP line but no sample
        "stator_source_lag_records": ["panel 'typo' A"],
        "stator_nope": ["variable 'v'"],
    }


def test_the_dashboard_loads_and_every_panel_follows_the_variables() -> None:
    dashboard = load()
    names = [v["name"] for v in dashboard["templating"]["list"]]
    assert names == ["datasource", "namespace", "job"]
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    for panel in panels(dashboard):
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"], panel["title"]
    for where, expr in queries(dashboard):
        if where.startswith("variable"):
            continue
        found = metric_names(expr)
        assert found, f"{where} reads no stator metric"
        # every selector filters by both variables, so a panel shows the chosen jobs only
        selected = re.findall(r'(stator_\w+)\{namespace=~"\$namespace", job=~"\$job"\}', expr)
        assert sorted(selected) == sorted(re.findall(r"stator_\w+", expr)), where


def test_the_dashboard_has_the_panels_the_docs_list() -> None:
    """docs/operator.md ("Monitoring") names each panel; a renamed or removed one shows."""
    docs = (Path(__file__).resolve().parents[2] / "docs" / "operator.md").read_text()
    section = docs.split("## Monitoring", 1)[1].split("\n## ", 1)[0]
    titles = {p["title"] for p in panels(load()) if p["type"] != "row"}
    listed = set(re.findall(r"^  - \*\*([^*]+)\*\*", section, re.M))  # the panels, by row
    assert titles == listed
