"""Executors as pods: a StatefulPipeline with ``spec.executor`` runs Spark's Kubernetes
backend in client mode from its driver pod; executor pods (run by the node agent through the
runtime image's entrypoint) are owned by the driver pod, and the output is exact."""

from __future__ import annotations

from typing import Any

from tests.e2e.conftest import Space
from tests.e2e.test_operator import assert_exact, committed

COUNT = 12_000


def test_executor_pods_owned_by_the_driver_exact_output(space: Space) -> None:
    name = "pods"
    manifest = space.manifest(name, replicas=4, env={"COUNT": COUNT, "RATE": 1500})
    env = {e["name"]: e["value"] for e in manifest["spec"]["driver"]["env"]}
    manifest["spec"]["executor"] = {
        "cores": 2,
        "memory": "512m",
        # The executors write sink output and checkpoints to the same S3 endpoint.
        "env": [{"name": "AWS_ENDPOINT_URL_S3", "value": env["AWS_ENDPOINT_URL_S3"]}],
    }
    space.apply(manifest)
    status = space.wait(
        name,
        "running with three checkpoints",
        lambda s: (
            s.get("phase") in ("Running", "Finished")
            and s.get("latestCheckpoint", {}).get("id", 0) >= 3
        ),
        timeout=300,
    )
    assert status["replicas"] == 4
    driver = space.driver_pods(name)[0]
    executors: list[dict[str, Any]] = space.kube.kubectl_json(
        "get", "pods", "-n", space.name, "-l", f"stator.dev/pipeline={name},spark-role=executor"
    )["items"]
    # replicas 4, two cores each: ceil(4 / 2) = 2 executor pods, owned by the driver pod.
    assert len(executors) == 2, [p["metadata"]["name"] for p in executors]
    nodes = sorted(p["spec"]["nodeName"] for p in executors)
    assert len(set(nodes)) == 2, f"executors not spread over the nodes: {nodes}"
    for pod in executors:
        owners = pod["metadata"]["ownerReferences"]
        assert [(o["kind"], o["name"]) for o in owners] == [("Pod", driver["metadata"]["name"])]
        assert pod["metadata"]["labels"]["stator.dev/component"] == "executor"
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    # Only the pipeline's own pods, and the operator's namespace on the control port, may
    # reach them (enforced where the network plugin implements NetworkPolicy).
    policy = space.kube.kubectl_json("get", "networkpolicy", f"{name}-stator", "-n", space.name)
    operator_ns = policy["spec"]["ingress"][1]["from"][0]["namespaceSelector"]["matchLabels"]
    assert operator_ns == {"kubernetes.io/metadata.name": "stator-system"}
    space.wait(name, "finished", lambda s: s.get("phase") == "Finished", timeout=300)
    assert_exact(committed(space, name), COUNT)
