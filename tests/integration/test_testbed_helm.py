"""The test bed's Helm lints and renders charts, and the API server accepts what it renders."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.testbed.kube import KubeCluster
from tests.testbed.versions import PINS

CHART = Path(__file__).parent.parent / "data" / "charts" / "minimal"


def test_helm_version_is_stamped(kube: KubeCluster) -> None:
    assert kube.helm("version", "--short").stdout.startswith(PINS.helm)


def test_lint_template_and_apply(kube: KubeCluster, namespace: str) -> None:
    lint = kube.helm("lint", "--strict", str(CHART))
    assert "1 chart(s) linted, 0 chart(s) failed" in lint.stdout

    rendered = kube.helm(
        "template", "demo", str(CHART), "--namespace", namespace, "--set", "message=rendered"
    ).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    assert sorted(d["kind"] for d in docs) == ["ConfigMap", "Deployment"]
    info = next(d for d in docs if d["kind"] == "ConfigMap")
    # The version stamp makes `helm template` assume the test bed's Kubernetes, not 1.20.
    _, minor, _ = PINS.kubernetes.lstrip("v").split(".")
    assert info["data"]["kubeVersion"] == f"v1.{minor}.0"

    kube.kubectl("apply", "-n", namespace, "-f", "-", input=rendered)
    stored = kube.kubectl_json("get", "configmap", "demo-info", "-n", namespace)
    assert stored["data"]["message"] == "rendered"
    deploy = kube.kubectl_json("get", "deployment", "demo-app", "-n", namespace)
    assert deploy["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def test_lint_reports_a_broken_chart(kube: KubeCluster, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    (broken / "templates").mkdir(parents=True)
    (broken / "Chart.yaml").write_text("apiVersion: v2\nname: broken\nversion: 0.1.0\n")
    (broken / "templates" / "cm.yaml").write_text(
        "kind: ConfigMap\nmetadata: {{ .Values.nope.x }}\n"
    )
    result = kube.helm("lint", str(broken), check=False)
    assert result.returncode != 0
    assert "nil pointer" in result.stdout + result.stderr
