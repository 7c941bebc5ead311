"""The operator's outcome vocabulary: status phases, condition types and reasons, event
reasons, restore sources, savepoint request results. StrEnums, so the status and event format
is the strings it always was (e2e tests and docs/operator.md match them)."""

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
    CHECKPOINTS_HEALTHY = "CheckpointsHealthy"


class ConditionReason(StrEnum):
    """The ``reason`` of a condition the operator sets."""

    VALID = "Valid"  # SpecValid
    INVALID_SPEC = "InvalidSpec"
    UNREADABLE_SAVEPOINT = "UnreadableSavepoint"  # spec.restore.initialSavepoint
    NAME_TAKEN = "NameTaken"  # an object of the pipeline's is someone else's
    DRIVER_READY = "DriverReady"  # Ready
    JOB_FAILED = "JobFailed"
    RESTARTS_EXHAUSTED = "RestartsExhausted"
    COMPLETED = "Completed"  # UpgradeSucceeded, SavepointSucceeded
    ROLLED_BACK = "RolledBack"  # UpgradeSucceeded: the new spec failed, the last stable runs
    NOT_STARTED = "NotStarted"  # UpgradeSucceeded: given up before the running job stopped
    FELL_BACK_TO_CHECKPOINT = "FellBackToCheckpoint"  # SavepointSucceeded
    CHECKPOINTS_COMPLETING = "CheckpointsCompleting"  # CheckpointsHealthy
    TOO_MANY_FAILED_CHECKPOINTS = "TooManyFailedCheckpoints"
    NO_CHECKPOINT_PROGRESS = "NoCheckpointProgress"
    FAILED_OVER = "FailedOver"  # the rules failed the job over; no checkpoint completed since


class EventReason(StrEnum):
    """The ``reason`` of a Kubernetes event the operator posts on a pipeline."""

    SPEC_CHANGED = "SpecChanged"
    INVALID_SPEC = "InvalidSpec"
    SUSPENDED = "Suspended"
    DRIVER_PRESTARTED = "DriverPrestarted"
    PRESTART_FAILED = "PrestartFailed"
    SAVEPOINT_COMPLETED = "SavepointCompleted"
    SAVEPOINT_FAILED = "SavepointFailed"
    DRIVER_CREATED = "DriverCreated"
    PROCESSING_AGAIN = "ProcessingAgain"
    UPGRADE_FAILED = "UpgradeFailed"
    DRIVER_FAILED = "DriverFailed"
    DRIVER_LOST = "DriverLost"
    JOB_FAILED = "JobFailed"
    CHECKPOINT_FAILOVER = "CheckpointFailover"  # the driver's checkpoint health failed it over
    FAILED = "Failed"  # restarts exhausted
    FINISHED = "Finished"
    STOPPED_OUTSIDE_OPERATOR = "StoppedOutsideOperator"
    EXECUTORS_MOVED = "ExecutorsMoved"
    CLAIMS_DELETED = "ClaimsDeleted"
    DELETE_TIMED_OUT = "DeleteTimedOut"
    CHECKPOINTS_NOT_RELEASED = "CheckpointsNotReleased"
    SAVEPOINTS_DISPOSED = "SavepointsDisposed"
    DELETED = "Deleted"
    # The autoscaler (autoscaling/autoscaler.py): a rescale it made, one it would make in a
    # dry run, one it recommends but holds back (not stable, or not paying off), and a
    # scale-up that did not deliver.
    AUTOSCALED = "Autoscaled"
    AUTOSCALE_RECOMMENDED = "AutoscaleRecommended"
    AUTOSCALE_HELD = "AutoscaleHeld"
    SCALING_INEFFECTIVE = "ScalingIneffective"
    # A flow moved on a step (flows.py ``_announce``): "<Kind>Step", for each operation kind.
    DEPLOY_STEP = "DeployStep"
    UPGRADE_STEP = "UpgradeStep"
    RESCALE_STEP = "RescaleStep"
    SUSPEND_STEP = "SuspendStep"
    RESUME_STEP = "ResumeStep"
    RESTART_STEP = "RestartStep"
    ROLLBACK_STEP = "RollbackStep"
    SAVEPOINT_STEP = "SavepointStep"
    DELETE_STEP = "DeleteStep"
    # A flow's driver is ready: "<Kind>Completed", for each kind that brings a driver up.
    DEPLOY_COMPLETED = "DeployCompleted"
    UPGRADE_COMPLETED = "UpgradeCompleted"
    RESCALE_COMPLETED = "RescaleCompleted"
    RESUME_COMPLETED = "ResumeCompleted"
    RESTART_COMPLETED = "RestartCompleted"
    ROLLBACK_COMPLETED = "RollbackCompleted"


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
