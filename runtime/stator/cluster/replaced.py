"""Executors replaced in their pods: tell Spark at once that the old one is gone.

With executors as pods (``restartPolicy: Always``, Spark's ``statefulset`` allocator), a
crashed executor's container restarts in the same pod, which keeps its IP, and the new
process registers as a new executor. Spark's Kubernetes backend learns of the old one's end
only from missed heartbeats (``spark.storage.blockManagerHeartbeatTimeoutMs``): until then its
tasks stay assigned to it and the epoch waits. A pod runs one executor, so once a newer
executor registers from the same pod IP, every older one there is certainly dead: a watcher
thread in the driver removes it (as a loss not caused by the application: its tasks are
resubmitted and not counted as task failures).

Only for the ``k8s://`` master: in ``local-cluster`` all executors share one host.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from .jvm import live_executors

log = logging.getLogger("stator.cluster")


def replaced(live: dict[str, str]) -> list[str]:
    """Executors (id -> host) that share their host with a newer executor (a higher id)."""
    newest: dict[str, int] = {}
    for executor, host in live.items():
        if executor.isdigit():
            newest[host] = max(newest.get(host, -1), int(executor))
    return sorted((e for e, host in live.items() if e.isdigit() and int(e) < newest[host]), key=int)


class ReplacedExecutorWatcher:
    def __init__(self, sc: Any, interval_s: float = 0.5) -> None:
        self.sc, self.interval_s = sc, interval_s
        self._removed: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="stator-replaced", daemon=True)

    def start(self) -> ReplacedExecutorWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.check()
            except Exception as exc:  # the SparkContext may be stopping: try again, quietly
                log.debug("checking for replaced executors failed: %s", exc)

    def check(self) -> list[str]:
        """Remove the executors replaced since the last look; returns their ids."""
        live = live_executors(self.sc)
        gone = [e for e in replaced(live) if e not in self._removed]
        if not gone:
            return []
        jvm = self.sc._jvm
        backend = self.sc._jsc.sc().schedulerBackend()
        for executor in gone:
            reason = jvm.org.apache.spark.scheduler.ExecutorProcessLost(
                "its pod restarted it: a newer executor registered from the same pod",
                jvm.scala.Option.apply(None),
                False,
            )
            backend.removeExecutor(executor, reason)
            self._removed.add(executor)
            log.info(
                "executor %s on %s was replaced in its pod by executor %s: removed",
                executor,
                live[executor],
                max((e for e, h in live.items() if h == live[executor]), key=int),
            )
        return gone
