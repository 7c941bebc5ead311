"""Executors replaced in their pods: tell Spark at once that the old one is gone.

With executors as pods (``restartPolicy: Always``, Spark's ``statefulset`` allocator), a
crashed executor's container restarts in the same pod, which keeps its IP, and the new
process registers as a new executor. Spark's Kubernetes backend learns of the old one's end
only from missed heartbeats (``spark.storage.blockManagerHeartbeatTimeoutMs``): until then its
tasks stay assigned to it and the epoch waits. A pod runs one executor, so once a newer
executor registers from the same pod IP, every older one there is certainly dead: a watcher
thread in the driver removes it (as a loss not caused by the application: its tasks are
resubmitted and not counted as task failures).

An executor whose pod is deleted (``kubectl delete pod``, an eviction, a node drain) is the
same story with a new pod, which has a new IP. So the watcher also lists the application's
executor pods: an executor whose IP no executor pod has any more (missing for ``grace_s``
running, so that a pod whose IP the API server has not published yet is not taken for gone)
is removed as well. A failed look at the API server removes nothing.

Only for the ``k8s://`` master: in ``local-cluster`` all executors share one host.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from .jvm import live_executors
from .kubernetes import executor_pod_ips

log = logging.getLogger("stator.cluster")


def replaced(live: dict[str, str]) -> list[str]:
    """Executors (id -> host) that share their host with a newer executor (a higher id)."""
    newest: dict[str, int] = {}
    for executor, host in live.items():
        if executor.isdigit():
            newest[host] = max(newest.get(host, -1), int(executor))
    return sorted((e for e, host in live.items() if e.isdigit() and int(e) < newest[host]), key=int)


def orphaned(live: dict[str, str], pod_ips: set[str]) -> list[str]:
    """Executors (id -> host) whose host is no executor pod's IP any more."""
    return sorted((e for e, host in live.items() if host not in pod_ips), key=str)


class ReplacedExecutorWatcher:
    def __init__(
        self,
        sc: Any,
        interval_s: float = 0.5,
        grace_s: float = 2.0,
        pod_ips: Callable[[], set[str]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        live: Callable[[], dict[str, str]] | None = None,
    ) -> None:
        self.sc, self.interval_s, self.grace_s, self.clock = sc, interval_s, grace_s, clock
        self.pod_ips = pod_ips or self._api_pod_ips
        self.live = live or (lambda: live_executors(self.sc))
        self._removed: set[str] = set()
        self._missing_since: dict[str, float] = {}
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

    def _api_pod_ips(self) -> set[str]:
        conf = dict(self.sc.getConf().getAll())
        return executor_pod_ips(conf, str(self.sc.applicationId))

    def check(self) -> list[str]:
        """Remove the executors replaced or whose pod is gone since the last look; returns
        their ids."""
        live = {e: h for e, h in self.live().items() if e not in self._removed}
        gone = {
            e: "its pod restarted it: a newer executor registered from the same pod"
            for e in replaced(live)
        }
        try:
            ips = self.pod_ips()
        except Exception as exc:  # no answer is not "no pods"
            log.debug("listing executor pods failed: %s", exc)
            ips = None
        if ips is not None:
            now = self.clock()
            missing = set(orphaned(live, ips))
            for executor in list(self._missing_since):
                if executor not in missing:
                    del self._missing_since[executor]
            for executor in missing:
                since = self._missing_since.setdefault(executor, now)
                if now - since >= self.grace_s and executor not in gone:
                    gone[executor] = "its pod is gone (deleted, evicted or replaced)"
        for executor, why in sorted(gone.items()):
            self._remove(executor, why)
            log.info("executor %s on %s: %s; removed", executor, live[executor], why)
        return sorted(gone)

    def _remove(self, executor: str, why: str) -> None:
        jvm = self.sc._jvm
        reason = jvm.org.apache.spark.scheduler.ExecutorProcessLost(
            why, jvm.scala.Option.apply(None), False
        )
        self.sc._jsc.sc().schedulerBackend().removeExecutor(executor, reason)
        self._removed.add(executor)
        self._missing_since.pop(executor, None)
