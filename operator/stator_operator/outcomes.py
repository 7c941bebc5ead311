"""The operator's outcome vocabulary: status phases, condition types and reasons, restore
sources, savepoint request results. StrEnums, so the status and event format is the
strings it always was."""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    """``status.phase``."""

    DEPLOYING = "Deploying"
    UPGRADING = "Upgrading"
    RESCALING = "Rescaling"
    SUSPENDING = "Suspending"
    RESTARTING = "Restarting"
    ROLLING_BACK = "RollingBack"
    DELETING = "Deleting"
    RUNNING = "Running"
    SUSPENDED = "Suspended"
    FINISHED = "Finished"  # a bounded job read all its input
    FAILED = "Failed"  # nothing runs: a spec that cannot, a job failure, restarts exhausted


class ConditionType(StrEnum):
    READY = "Ready"
    SPEC_VALID = "SpecValid"
    UPGRADE_SUCCEEDED = "UpgradeSucceeded"
    SAVEPOINT_SUCCEEDED = "SavepointSucceeded"


class Restore(StrEnum):
    """Restore sources that are not a savepoint's path (``operation.restore``,
    ``suspendedWith``, ``deployment.restoredFrom``)."""

    LATEST = "latest"  # the latest completed checkpoint (of the run, with a lineage)
    NONE = "none"  # empty state


class SavepointStatus(StrEnum):
    """A savepoint request's ``status`` in the driver's answer (``stator.control``)."""

    PENDING = "PENDING"
    IN_PROGRESS = "IN_PROGRESS"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"


class DriverState(StrEnum):
    """The driver states the operator acts on, as its control API reports them: the values
    of ``stator.driver.status.JobState`` (a unit test holds them together), named here so the
    operator does not import the driver's status module and all it imports."""

    CREATED = "CREATED"  # still starting
    STANDBY = "STANDBY"  # a pre-started driver waiting for the hand-over


class PodPhase(StrEnum):
    """The Kubernetes pod phases the operator acts on."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
