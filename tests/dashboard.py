"""The chart's Grafana dashboard (``charts/stator-operator/dashboards/stator.json``) as its
queries and the metric names they read, for the tests that hold it to what a driver exports:
a panel naming a metric nobody exports stays empty forever (a dead panel)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

DASHBOARD = (
    Path(__file__).resolve().parents[1]
    / "charts"
    / "stator-operator"
    / "dashboards"
    / "stator.json"
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
# A PromQL identifier; a metric name is one not followed by "(" (a function) outside strings.
_IDENT = re.compile(r"(?<![\w:$])([A-Za-z_:][\w:]*)(?!\w)(\s*\()?")


def load(path: Path = DASHBOARD) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows included."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every panel target and every query template variable."""
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target.get('refId', '')}", target["expr"]
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            query = var["query"]
            yield f"variable {var['name']!r}", query["query"] if isinstance(query, dict) else query


def metric_names(expr: str, prefix: str = "stator_") -> set[str]:
    """The metric names ``expr`` reads that start with ``prefix``, as exposed (a histogram's
    ``_bucket``/``_sum``/``_count`` series, a counter's ``_total``): identifiers outside
    string literals that are not function calls."""
    bare = _STRING.sub('""', expr)
    return {
        m.group(1)
        for m in _IDENT.finditer(bare)
        if m.group(2) is None and m.group(1).startswith(prefix)
    }


def exposed(scrape: str) -> set[str]:
    """The sample names in a Prometheus text scrape that have at least one sample."""
    return {s.name for family in text_string_to_metric_families(scrape) for s in family.samples}


def dead_metrics(dashboard: dict[str, Any], scrape: str) -> dict[str, list[str]]:
    """Each metric the dashboard reads that ``scrape`` has no sample of, with where."""
    have = exposed(scrape)
    dead: dict[str, list[str]] = {}
    for where, expr in queries(dashboard):
        for name in sorted(metric_names(expr) - have):
            dead.setdefault(name, []).append(where)
    return dead
