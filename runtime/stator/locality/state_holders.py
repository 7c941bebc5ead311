"""Which executors alone hold a keyed subtask's state in an epoch: what Spark is told so
that losing all of them cancels the job at once (``stator.jvm.FutileRetryListener``), for a
Spark job per epoch (``driver/sparkjob.py``) and a run of long-running tasks
(``longrun/driver.py``) alike."""

from __future__ import annotations

from ..epoch.spec import EpochSpec
from ..keygroups import SubtaskId


def state_on(spec: EpochSpec, uid: str, parallelism: int) -> list[str]:
    """Per subtask, the executors that alone hold its state: the one it is pinned to (a
    retry elsewhere is refused: ``locality/restore.py``) and any keeping a standby copy of
    it; "" for a subtask not pinned (a retry elsewhere restores from the object store)."""
    standby: dict[int, list[str]] = {}
    for location, orders in (spec.standby.orders if spec.standby else {}).items():
        for order in orders:
            if order.uid == uid:
                standby.setdefault(order.subtask, []).append(location)
    out = []
    for i in range(parallelism):
        pinned = spec.pinned.get(SubtaskId(uid, i))
        out.append(",".join([pinned, *standby.get(i, [])]) if pinned else "")
    return out
