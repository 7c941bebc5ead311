"""The operator's mirror of a driver's answer into a StatefulPipeline's status: its names are
derived from the control API schema's field names (camelCase), and they must stay the ones the
CRD, ``kubectl get`` and the end-to-end tests read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from stator.control.schema import JobInfo
from stator_operator.pipeline_status import MIRRORED as STATUS_MIRRORED
from stator_operator.reconciler import _job_fields

ROOT = Path(__file__).resolve().parents[2]
CRDS = [
    ROOT / "crds" / "statefulpipelines.stator.dev.yaml",
    ROOT / "charts" / "stator-operator" / "crds" / "statefulpipelines.stator.dev.yaml",
]

# Every status field the mirror writes, as it wrote them before the schema module existed.
MIRRORED = {
    "epoch",
    "jobState",
    "parallelism",
    "lagRecords",
    "lagMs",
    "lastError",
    "latestCheckpoint.id",
    "latestCheckpoint.epoch",
    "latestCheckpoint.time",
    "latestCheckpoint.stateBytes",
    "latestCheckpoint.incrementalBytes",
    "standbyCopies.copies",
    "standbyCopies.bytes",
    "standbyCopies.failed",
    "restores.local",
    "restores.remote",
    "restores.localBytes",
    "restores.remoteBytes",
    "restores.latest[].operator",
    "restores.latest[].subtask",
    "restores.latest[].checkpointId",
    "restores.latest[].source",
    "restores.latest[].localBytes",
    "restores.latest[].remoteBytes",
    "restores.latest[].node",
    "regions[].id",
    "regions[].state",
    "regions[].epoch",
    "regions[].restarts",
    "regions[].latestCheckpoint",
    "regions[].lastError",
    "placement.keyedTasks",
    "placement.keyedTasksLocal",
    "placement.subtasks[].operator",
    "placement.subtasks[].subtask",
    "placement.subtasks[].node",
    "placement.subtasks[].executor",
    "placement.subtasks[].keyGroups",
    "placement.subtasks[].checkpointId",
    "placement.subtasks[].standby.executor",
    "placement.subtasks[].standby.node",
    "metrics.processingLatencyP99Ms",
    "metrics.committedLatencyP99Ms",
    "metrics.epochDurationP99Ms",
    "metrics.maxBusyRatio",
    "metrics.busiestSubtask",
    "metrics.eventTimeDelayMs",
    "checkpointHealth.healthy",
    "checkpointHealth.consecutiveFailures",
    "checkpointHealth.failovers",
    "checkpointHealth.lastFailover",
    "checkpointHealth.lastFailoverMs",
}

ANSWER: dict[str, Any] = {
    "job": "team.counts",
    "checkpoint_health": {
        "healthy": True,
        "consecutive_failures": 1,
        "tolerable_failures": 3,
        "progress_window_ms": 0,
        "waiting_ms": 10,
        "failovers": 1,
        "last_failover": "4 consecutive checkpoints failed",
        "last_failover_ms": 1_699_999_000_000,
        "problem": None,
    },
    "state": "RUNNING",
    "epoch": 12,
    "parallelism": {"count": 2},
    "lag_records": 42,
    "lag_ms": 1500,
    "last_error": "region 'in-a': a task failed once",
    "latest_checkpoint": {
        "id": 5,
        "epoch": 11,
        "created_ms": 1_700_000_000_000,
        "state_bytes": 1000,
        "incremental_bytes": 100,
        "duration_ms": 3,
        "incremental": True,
    },
    "standby_copies": {"copies": 1, "bytes": 50, "failed": 0},
    "restores": {
        "local": 1,
        "remote": 0,
        "local_bytes": 10,
        "remote_bytes": 0,
        "latest": [
            {
                "operator": "count",
                "subtask": 0,
                "checkpoint_id": 4,
                "source": "local",
                "local_bytes": 10,
                "remote_bytes": 0,
                "node": "n1",
            }
        ],
    },
    "regions": [
        {
            "id": "in-a",
            "state": "RUNNING",
            "epoch": 12,
            "restarts": 1,
            "latest_checkpoint": {"id": 5, "epoch": 11, "created_ms": 1_700_000_000_000},
            "last_error": "a task failed once",
        }
    ],
    "metrics": {
        "epoch_duration": {"count": 12, "p99_ms": 800},
        "operators": {"count": {"kind": "keyed", "records_in": 100}},
        "processing_latency_p99_ms": 450,
        "committed_latency_p99_ms": 2100,
        "max_busy_ratio": 0.75,
        "busiest_subtask": "count/1",
        "event_time_delay_ms": 3000,
    },
    "placement": {
        "keyed_tasks": 2,
        "keyed_tasks_local": 1,
        "subtasks": {
            "count": [
                {
                    "subtask": 0,
                    "parallelism": 2,
                    "executor": "1",
                    "node": "n1",
                    "key_groups": [0, 64],
                    "checkpoint_id": 5,
                    "standby": {"executor": "2", "node": "n2"},
                }
            ]
        },
    },
}


def paths(value: Any, prefix: str = "") -> set[str]:
    """The field paths of status data (a list's entries as ``[]``; a map of operator uids,
    ``parallelism``, and a list of numbers are one field)."""
    if isinstance(value, dict) and prefix != "parallelism":
        return {p for k, v in value.items() for p in paths(v, f"{prefix}.{k}".lstrip("."))}
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return set().union(*(paths(v, prefix + "[]") for v in value))
    return {prefix}


def test_the_mirror_writes_exactly_the_status_fields_it_always_wrote() -> None:
    fields = _job_fields(JobInfo.from_wire(ANSWER))
    assert paths(fields) == MIRRORED
    assert set(fields) == set(STATUS_MIRRORED), "the fields PipelineStatus.mirrored reads back"
    assert fields["latestCheckpoint"]["time"] == "2023-11-14T22:13:20Z"
    assert fields["placement"]["subtasks"][0]["keyGroups"] == [0, 64], "JSON data: lists"
    assert (fields["lagRecords"], fields["lagMs"]) == (42, 1500)
    assert fields["metrics"]["maxBusyRatio"] == 0.75
    assert fields["metrics"]["epochDurationP99Ms"] == 800, "per operator detail stays out"


@pytest.mark.parametrize("crd", CRDS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_crds_status_schema_keeps_every_mirrored_field(crd: Path) -> None:
    """The API server prunes status fields its schema does not know: each mirrored field is
    declared, or the status keeps unknown fields; the printer columns read mirrored ones."""
    doc = yaml.safe_load(crd.read_text())
    for version in doc["spec"]["versions"]:
        status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
        declared = set(status.get("properties") or {})
        tops = {p.split(".")[0].split("[")[0] for p in MIRRORED}
        assert status.get("x-kubernetes-preserve-unknown-fields") or tops <= declared
        columns = [c["jsonPath"] for c in version.get("additionalPrinterColumns", [])]
        mirrored_columns = [c for c in columns if c.startswith(".status.latestCheckpoint")]
        assert {c.removeprefix(".status.") for c in mirrored_columns} <= MIRRORED
        assert mirrored_columns, "kubectl get shows the latest checkpoint's time"
        assert ".status.lagRecords" in columns, "kubectl get shows the sources' lag"
