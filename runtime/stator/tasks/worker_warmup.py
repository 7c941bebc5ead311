"""What Spark's Python daemon loads before it forks any worker, so that workers start warm.

PySpark forks each Python worker from the executor's daemon (``tasks/pydaemon.py``); a
worker begins with what the daemon had imported, and imports the rest inside its first task.
For a keyed task that first runs on an executor after a failure (a standby copy taking over,
a replacement pod) that was on the recovery's path: in the standby benchmark the first keyed
task on the surviving executor spent 1.3 s of its 1.7 s importing boto3 and building its
first S3 client for the sink, on a loaded machine, where later tasks took 0.3 s.

1. The task modules every Stator job runs (``tasks.source``, ``tasks.keyed`` and what they
   import: RocksDB, the operators, the checkpoint transfer).
2. Where the executor has S3 credentials in its environment (the operator sets them from
   the pipeline's Secret for ``s3://`` checkpoints), boto3 and the S3 models
   (``storage.warm_s3``).

The daemon pays this once, at its start (the executor's first Python task), instead of every
worker in its first task. Nothing here may stop the daemon: a failure is logged and workers
import what they need themselves, as before.
"""

from __future__ import annotations

import importlib
import logging
import os

log = logging.getLogger("stator.cluster")

TASK_MODULES = ("stator.tasks.source", "stator.tasks.keyed")
S3_CREDENTIALS_ENV = "AWS_ACCESS_KEY_ID"


def warm() -> list[str]:
    """Steps 1-2 of the module docstring; returns what was loaded, for tests."""
    loaded = []
    try:
        for name in TASK_MODULES:
            importlib.import_module(name)
            loaded.append(name)
        if os.environ.get(S3_CREDENTIALS_ENV):
            from ..storage import warm_s3  # noqa: PLC0415

            warm_s3()
            loaded.append("s3")
    except Exception as exc:  # a cold worker is slower, not wrong
        log.warning("Python workers start cold: loading %s failed: %s", TASK_MODULES, exc)
    return loaded
