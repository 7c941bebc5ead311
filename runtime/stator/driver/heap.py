"""The driver's long-lived heap out of the cyclic garbage collector's view, once a job runs.

After start-up a driver's heap is mostly what lives as long as the process: PySpark, py4j,
boto3's models, the pipeline and its functions (about 95,000 objects in the latency
benchmark's driver). Every full collection traversed all of it, and a collection stops the
epoch loop where it happens: with epochs of 20 ms (long-running tasks) its pauses, up to
70 ms, were a tail of the latency. So once the first epoch of a job on Spark ran, that heap is
collected once and frozen (``gc.freeze``): later collections look only at what came after.
Once per process: what a later job (a test session's next one) leaves is collected as ever.
"""

from __future__ import annotations

import gc

_FROZEN: list[bool] = []


def freeze_startup_heap() -> None:
    if _FROZEN:
        return
    _FROZEN.append(True)
    gc.collect()
    gc.freeze()
