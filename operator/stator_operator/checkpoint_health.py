"""The driver's checkpoint health, as a pipeline's status shows it: the ``CheckpointsHealthy``
condition and the ``checkpointHealth`` status field, from the driver's ``/v1/job`` answer
(``stator.control.schema.CheckpointHealthInfo``; the rules are the driver's:
``stator.driver.checkpoint_health``).

The driver acts on its rules itself (it fails over to its latest checkpoint, through its
restart strategy); the operator reports it: the condition is False while a rule is broken and
after a failover the rules caused, until a checkpoint completes again; each such failover is a
Warning event (``CheckpointFailover``) with its reason. The driver's verdict is spent once it
acts, so a rule that stays broken means its loop cannot act (an epoch that does not end): past
``failover.readinessTimeoutSeconds`` the operator restarts the driver (:func:`stuck`), as the
Flink operator restarts a job whose checkpoints do not progress.

Everything here is computed from the answer's numbers, and the messages the operator writes
are its own (stable between observations: a condition is rewritten only when it changes),
except the failover's reason, which is the driver's text, cut.
"""

from __future__ import annotations

from dataclasses import dataclass

from stator.control.schema import CheckpointHealthInfo, JobInfo, mirror
from stator.control.wire import Json

from .outcomes import ConditionReason
from .pipeline_status import Condition
from .status import age_s

MAX_REASON = 1000  # characters of the driver's failover reason in a condition or an event

# The status field's parts (camelCase in status): what a user needs to see why.
FIELDS = ("healthy", "consecutive_failures", "failovers", "last_failover", "last_failover_ms")


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: ConditionReason
    message: str


def status_field(h: CheckpointHealthInfo) -> dict[str, Json]:
    """``status.checkpointHealth`` (the caller bounds it, as every mirrored field)."""
    return mirror(h, *FIELDS)


def condition(job: JobInfo) -> Verdict | None:
    """The ``CheckpointsHealthy`` condition for this answer (None: a driver that does not
    report checkpoint health)."""
    h = job.checkpoint_health
    if h is None:
        return None
    limit = "without limit" if h.tolerable_failures is None else f"up to {h.tolerable_failures}"
    if not h.healthy:
        tolerable = h.tolerable_failures
        if tolerable is not None and h.consecutive_failures > tolerable:
            return Verdict(
                False,
                ConditionReason.TOO_MANY_FAILED_CHECKPOINTS,
                f"{h.consecutive_failures} checkpoints failed in a row, {limit} tolerated "
                f"(checkpointing.tolerableFailures): the job fails over to its latest checkpoint",
            )
        return Verdict(
            False,
            ConditionReason.NO_CHECKPOINT_PROGRESS,
            f"an epoch's output has waited more than {h.progress_window_ms / 1000:g} s for a "
            f"checkpoint (checkpointing.progressWindowSeconds): the job fails over to its "
            f"latest checkpoint",
        )
    latest = job.latest_checkpoint
    since = h.last_failover_ms
    if since is not None and (latest is None or latest.created_ms < since):
        return Verdict(
            False,
            ConditionReason.FAILED_OVER,
            f"failed over to the latest checkpoint, none completed since: "
            f"{(h.last_failover or '')[:MAX_REASON]}",
        )
    window = (
        f", an epoch's output waits at most {h.progress_window_ms / 1000:g} s for one"
        if h.progress_window_ms
        else ""
    )
    return Verdict(
        True,
        ConditionReason.CHECKPOINTS_COMPLETING,
        f"checkpoints complete: failures in a row are tolerated {limit}{window}",
    )


def new_failover(h: CheckpointHealthInfo | None, before: object) -> str | None:
    """The event message of a failover the rules caused since the answer mirrored as
    ``before`` (the stored ``checkpointHealth``), if there was one."""
    if h is None or h.last_failover_ms is None:
        return None
    seen = before.get("lastFailoverMs") if isinstance(before, dict) else None
    if seen == h.last_failover_ms:
        return None
    return (
        f"the job failed over to its latest checkpoint (failover {h.failovers} of this "
        f"driver): {(h.last_failover or '')[:MAX_REASON]}"
    )


def stuck(held: Condition | None, limit_s: float) -> str | None:
    """Why the driver must be restarted: its checkpoint health has been broken (the
    condition ``held``, as stored) for more than ``limit_s`` without it failing over."""
    broken = (ConditionReason.TOO_MANY_FAILED_CHECKPOINTS, ConditionReason.NO_CHECKPOINT_PROGRESS)
    if held is None or held.ok or held.reason not in broken:
        return None
    waited = age_s(held.last_transition_time)
    if waited <= limit_s:
        return None
    return (
        f"the driver's checkpoints have been unhealthy for {waited:.0f} s without it failing "
        f"over (failover.readinessTimeoutSeconds is {limit_s:g}): {held.message}"
    )
