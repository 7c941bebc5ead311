"""Local PersistentVolumes for the test bed's nodes, as the local static provisioner offers
them: a StorageClass with no provisioner bound when the first pod using a claim is scheduled
(so the real scheduler pins that pod to the node of its claim's volume), PVs with node
affinity, and a released volume wiped and offered again. Both node kinds use it: the node
agent (pods as processes) and the real nodes (kubelets)."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any

from kubernetes import client

LOCAL_VOLUME_LABEL = "testbed.stator.dev/local-volume"


def volume_node(pv: Any) -> str | None:
    """The node a local PersistentVolume's node affinity names."""
    affinity = pv.spec.node_affinity
    if affinity is None or affinity.required is None:
        return None
    for term in affinity.required.node_selector_terms or []:
        for expr in term.match_expressions or []:
            if expr.key == "kubernetes.io/hostname" and expr.values:
                return str(expr.values[0])
    return None


def provide(
    api: client.CoreV1Api,
    storage: client.StorageV1Api,
    storage_class: str,
    nodes: Iterable[str],
    per_node: int,
    path_of: Callable[[str, int], str],
    capacity: str = "20Gi",
) -> None:
    """The StorageClass and ``per_node`` PVs on each node; ``path_of(node, i)`` is the
    volume's path as the node sees it."""
    sc = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": storage_class},
        "provisioner": "kubernetes.io/no-provisioner",
        "volumeBindingMode": "WaitForFirstConsumer",
        "reclaimPolicy": "Retain",
    }
    with contextlib.suppress(client.ApiException):
        storage.create_storage_class(sc)
    for node in nodes:
        for i in range(per_node):
            hostname = {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
            pv = {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {
                    "name": f"{storage_class}-{node}-{i}",
                    "labels": {LOCAL_VOLUME_LABEL: storage_class},
                },
                "spec": {
                    "capacity": {"storage": capacity},
                    "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": storage_class,
                    "local": {"path": path_of(node, i)},
                    "nodeAffinity": {
                        "required": {"nodeSelectorTerms": [{"matchExpressions": [hostname]}]}
                    },
                },
            }
            try:
                api.create_persistent_volume(pv)
            except client.ApiException as exc:
                if exc.status != 409:
                    raise


def recycle_released(
    api: client.CoreV1Api,
    host_path: Callable[[str, str], Path],
    nodes: Collection[str],
    unavailable: Collection[str] = (),
) -> None:
    """Wipe released local volumes and offer them again; a volume on an unavailable (lost)
    node waits for it. ``host_path(node, path)``: where the volume's files are here."""
    for pv in api.list_persistent_volume(label_selector=LOCAL_VOLUME_LABEL).items:
        if pv.status.phase != "Released" or pv.spec.local is None:
            continue
        node = volume_node(pv)
        if node is None or node not in nodes or node in unavailable:
            continue
        target = host_path(node, pv.spec.local.path)
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True, exist_ok=True)
        api.patch_persistent_volume(pv.metadata.name, {"spec": {"claimRef": None}})
