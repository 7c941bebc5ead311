"""Hostile pod templates and plain-text credentials are refused with the field and the rule;
the operator's own driver pod passes the restricted profile."""

from __future__ import annotations

from typing import Any

import pytest

from stator_operator.admission import check_job_config, check_pods
from stator_operator.naming import spark_app_id
from stator_operator.pipeline_spec import PipelineSpec, SpecError
from stator_operator.podsecurity import pod_violations
from stator_operator.resources import driver_pod, executor_pod_template
from tests.hostile_specs import HOSTILE

GOOD: dict[str, Any] = {
    "image": "stator-runtime:test",
    "entrypoint": "pipelines.counts:build",
    "checkpointing": {"storage": "file:///tmp/ck"},
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_spec_is_refused_with_field_and_rule(case: str) -> None:
    change, message = HOSTILE[case]
    spec = {**GOOD, **change}
    with pytest.raises(SpecError) as info:  # the reconciler's checks, in its order
        PipelineSpec.parse(spec)
        check_job_config(PipelineSpec.read(spec), "counts", "team")
        check_pods(PipelineSpec.read(spec), "counts", "team")
    assert message in str(info.value)


def test_the_operators_own_pods_are_restricted() -> None:
    body = {"metadata": {"name": "counts", "namespace": "team", "uid": "u"}}
    assert (
        pod_violations(driver_pod(body, PipelineSpec.read(GOOD), "1", "none", False), "driver")
        == []
    )
    template = executor_pod_template("counts", spark_app_id("team", "counts"))
    assert pod_violations(template, "executor") == []
    harmless = {
        **GOOD,
        "driver": {"podTemplate": {"spec": {"nodeSelector": {"disk": "ssd"}}}},
    }
    check_pods(PipelineSpec.read(harmless), "counts", "team")


def test_a_template_accepted_before_the_checks_still_makes_only_a_pod() -> None:
    """Issue 38: the merge copies only what a template may set, whatever got past admission
    (a spec accepted by an older operator): no kind, no foreign fields."""
    body = {"metadata": {"name": "counts", "namespace": "team", "uid": "u"}}
    change, _ = HOSTILE["RoleBinding through the pod template"]
    template = {
        **change["driver"]["podTemplate"],
        "metadata": {"labels": {"team": "a"}, "namespace": "kube-system"},
        "spec": {"priorityClassName": "x", "tolerations": [{"operator": "Exists"}]},
    }
    pod = driver_pod(
        body, PipelineSpec.read({**GOOD, "driver": {"podTemplate": template}}), "1", "none", False
    )
    assert (pod["apiVersion"], pod["kind"]) == ("v1", "Pod")
    assert "roleRef" not in pod and "subjects" not in pod
    assert pod["metadata"]["namespace"] == "team" and pod["metadata"]["labels"]["team"] == "a"
    assert "priorityClassName" not in pod["spec"]
    assert pod["spec"]["tolerations"] == [{"operator": "Exists"}]
