"""The SparkSession a Stator job runs on, with the settings the runtime depends on."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from typing import Any

from ..config import SparkConfig
from .kubernetes import MASTER, in_cluster_conf

# Settings Stator needs whatever the user configures: a speculative duplicate of a keyed
# task would open the same RocksDB twice; workers are reused across epochs.
REQUIRED = {
    "spark.speculation": "false",
    "spark.python.worker.reuse": "true",
}


def effective_master(cfg: SparkConfig) -> str:
    """``local[N]`` never retries a failed task; add the configured attempts."""
    m = re.fullmatch(r"local\[(\*|\d+)\]", cfg.master.strip())
    if m:
        return f"local[{m.group(1)},{cfg.task_attempts}]"
    if cfg.master.strip() == "local":
        return f"local[1,{cfg.task_attempts}]"
    return cfg.master


def create_session(cfg: SparkConfig, app_name: str) -> Any:
    # Workers must run this interpreter (and see this environment's packages).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession  # noqa: PLC0415 - starting a JVM is expensive

    master = effective_master(cfg)
    cluster: dict[str, str] = {}
    if master == MASTER:  # executors as pods, from inside the driver pod
        cluster = in_cluster_conf(os.environ)
        master = cluster.pop("spark.master")
    builder = SparkSession.builder.master(master).appName(app_name)
    builder = builder.config("spark.ui.enabled", str(cfg.ui).lower()).config(
        "spark.ui.showConsoleProgress", "false"
    )
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = builder.config("spark.driver.host", "127.0.0.1").config(
            "spark.driver.bindAddress", "127.0.0.1"
        )
    if master.startswith("local"):
        builder = builder.config("spark.task.maxFailures", str(cfg.task_attempts))
    for key, value in {**cluster, **cfg.conf}.items():
        builder = builder.config(key, value)
    for key, value in REQUIRED.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


def share_python_path(spark: Any, entries: Sequence[str]) -> None:
    """Put ``entries`` first on the Python path of every Python worker Spark starts from now.

    The pipeline's module is pickled by name (``loader.py``), so workers must import it from
    the same root as the driver, whatever their working directory. ``sc.environment`` is the
    environment PySpark gives the workers of every RDD it creates (``spark.executorEnv.*``
    lands there too), and the worker factory prepends its ``PYTHONPATH`` to the workers' path.
    It works for a session that is already running, and with executors elsewhere as long as
    the code is at the same path there (the runtime image, or a volume).
    """
    if not entries:
        return
    env = spark.sparkContext.environment
    current = [p for p in str(env.get("PYTHONPATH", "")).split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([*entries, *current]))
