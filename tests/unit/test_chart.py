"""The Helm chart and the CRD as files: what a render or an API server would not report (a
key given twice, an option nothing serves, a comment naming a file that is not there)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "stator-operator"
CRD = ROOT / "crds" / "statefulpipelines.stator.dev.yaml"


class _UniqueKeys(yaml.SafeLoader):
    """A YAML loader that refuses a mapping key given twice (PyYAML keeps the last)."""


def _unique_mapping(loader: _UniqueKeys, node: yaml.MappingNode) -> dict[Any, Any]:
    keys = [loader.construct_object(key) for key, _ in node.value]
    twice = sorted({str(k) for k in keys if keys.count(k) > 1})
    assert not twice, f"line {node.start_mark.line + 1}: {', '.join(twice)} given twice"
    return loader.construct_mapping(node)


_UniqueKeys.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def test_the_crd_gives_each_key_once_and_the_chart_ships_the_same_file() -> None:
    yaml.load(CRD.read_text(), _UniqueKeys)  # noqa: S506 - a SafeLoader subclass
    assert (CHART / "crds" / CRD.name).resolve() == CRD.resolve()


def test_the_operator_pod_advertises_no_metrics_endpoint() -> None:
    """The operator's port serves kopf's liveness path only: no scrape annotations."""
    template = (CHART / "templates" / "deployment.yaml").read_text()
    assert "prometheus.io" not in template
    assert "metrics" not in yaml.safe_load((CHART / "values.yaml").read_text())


def test_every_values_reference_is_defined() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for template in (CHART / "templates").iterdir():
        for ref in re.findall(r"\.Values\.([\w.]+)", template.read_text()):
            node = values
            for part in ref.split("."):
                assert isinstance(node, dict) and part in node, f"{template.name}: .Values.{ref}"
                node = node[part]


def test_files_named_in_the_chart_exist() -> None:
    for path in CHART.rglob("*.yaml"):
        for named in re.findall(r"\b(?:operator|runtime)/[\w/]+\.py\b", path.read_text()):
            assert (ROOT / named).is_file(), f"{path.relative_to(ROOT)} names {named}"
