"""The SparkSession a Stator job runs on, with the settings the runtime depends on."""

from __future__ import annotations

import functools
import logging
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from ..cluster import cds, quick_ack
from ..cluster.jvm import ensure_jar
from ..cluster.kubernetes import MASTER, in_cluster_conf
from ..config import SPARK_REQUIRED, SparkConfig
from ..errors import ConfigError
from ..locality.placement import uses_placement

log = logging.getLogger("stator.cluster")


# Defaults a user's ``spark.conf`` may override: Python workers forked by a daemon that
# drops Spark's zipped copies of pyspark and py4j where they are also installed
# (``pydaemon.py``: they cost every task a re-read of a 3 MB zip's directory).
DEFAULTS = {
    "spark.python.daemon.module": "stator.tasks.pydaemon",
}


def effective_master(cfg: SparkConfig) -> str:
    """``local[N]`` never retries a failed task; add the configured attempts."""
    m = re.fullmatch(r"local\[(\*|\d+)\]", cfg.master.strip())
    if m:
        return f"local[{m.group(1)},{cfg.task_attempts}]"
    if cfg.master.strip() == "local":
        return f"local[1,{cfg.task_attempts}]"
    return cfg.master


# With several executors a keyed task that misses its executor restores (or, between
# checkpoints, rewinds the job), which costs far more than waiting for a busy executor.
# The first epoch waits for every executor to register (at most Spark's 30 s), so that keyed
# subtasks spread over them instead of all landing on the first one and staying there.
PLACEMENT_DEFAULTS = {
    "spark.locality.wait.process": "30s",
    "spark.scheduler.minRegisteredResourcesRatio": "1.0",
}


def placement_conf(master: str, conf: dict[str, str]) -> dict[str, str]:
    """Settings a multi-executor master needs for state-aware placement: the JVM helper jar
    (built once, ``jvm.py``) added to ``spark.jars``, a longer process-locality wait unless
    configured and, for ``local-cluster``, executors whose Python workers find Stator."""
    if not uses_placement(master):
        return {}
    try:
        jar = ensure_jar()
    except ConfigError as exc:  # e.g. a JRE without javac: run, but without placement
        log.warning("state-aware placement of keyed tasks is off: %s", exc)
        return {}
    jars = [j for j in conf.get("spark.jars", "").split(",") if j]
    out = {"spark.jars": ",".join([*jars, str(jar)])}
    out.update({k: v for k, v in PLACEMENT_DEFAULTS.items() if k not in conf})
    if master.startswith("local-cluster"):
        path = os.environ.get("PYTHONPATH")
        if path and "spark.executorEnv.PYTHONPATH" not in conf:
            out["spark.executorEnv.PYTHONPATH"] = path
    return out


def class_sharing_conf(master: str, conf: dict[str, str]) -> dict[str, str]:
    """The JVM options that map this installation's class-data archives (``cds.py``): the
    driver's, and the executors' (``local-cluster`` executors run with the driver's
    classpath, executor pods with the image entrypoint's)."""
    out = {}
    roles = {"spark.driver.extraJavaOptions": cds.DRIVER}
    if master.startswith("local-cluster"):
        roles["spark.executor.extraJavaOptions"] = cds.DRIVER
    elif master.startswith("k8s://"):
        roles["spark.executor.extraJavaOptions"] = cds.EXECUTOR
    for key, role in roles.items():
        option = cds.java_option(role)
        if option:
            out[key] = cds.with_option(conf.get(key), option)
    return out


def create_session(cfg: SparkConfig, app_name: str) -> Any:
    # Workers must run this interpreter (and see this environment's packages).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession  # noqa: PLC0415 - starting a JVM is expensive

    quick_ack.install()  # the driver's reads from its JVM: no delayed acknowledgements

    master = effective_master(cfg)
    cluster: dict[str, str] = {}
    if master == MASTER:  # executors as pods, from inside the driver pod
        cluster = in_cluster_conf(os.environ)
        master = cluster.pop("spark.master")
    if master.startswith("local-cluster"):  # executors are started from SPARK_HOME
        import pyspark  # noqa: PLC0415

        os.environ.setdefault("SPARK_HOME", os.path.dirname(pyspark.__file__))
    builder = SparkSession.builder.master(master).appName(app_name)
    builder = builder.config("spark.ui.enabled", str(cfg.ui).lower()).config(
        "spark.ui.showConsoleProgress", "false"
    )
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = builder.config("spark.driver.host", "127.0.0.1").config(
            "spark.driver.bindAddress", "127.0.0.1"
        )
    builder = builder.config("spark.task.maxFailures", str(cfg.task_attempts))
    conf = {**DEFAULTS, **cluster, **cfg.conf}
    conf.update(placement_conf(master, conf))
    conf.update(class_sharing_conf(master, conf))
    for key, value in conf.items():
        builder = builder.config(key, value)
    for key, (value, _) in SPARK_REQUIRED.items():  # the config refuses other values
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


def starts_executor_pods(cfg: SparkConfig) -> bool:
    """Whether this session's executors are pods (Spark's Kubernetes backend)."""
    return effective_master(cfg) == MASTER or cfg.master.startswith("k8s://")


def warm_python_workers(spark: Any, connect: Sequence[Callable[[], None]] = ()) -> None:
    """Start Python workers (one per core), with the modules keyed tasks import and the
    connections ``connect`` builds (``ObjectStore.connect``, ``Sink.connect``), and run a
    shuffle through them, so that the first epoch pays for none of it. Call it after
    :func:`share_python_path`: Spark keeps a pool of workers per environment, and the job's
    tasks must find these ones. Spark stops a worker that idled for a minute: call it again
    while waiting longer."""
    sc = spark.sparkContext
    # More tasks than cores: a worker goes back to the end of Spark's idle queue, so these
    # reach every idle worker of a pool that already has more than one per core.
    tasks = 4 * max(1, int(sc.defaultParallelism))
    warm = functools.partial(_warm_worker, tuple(connect))
    pairs = sc.parallelize(range(tasks), tasks).mapPartitions(warm)
    pairs.partitionBy(tasks).mapPartitions(warm).count()


def _warm_worker(connect: tuple[Callable[[], None], ...], items: Iterable[Any]) -> Iterator[Any]:
    import stator.tasks.keyed  # noqa: PLC0415 - the import is the work
    import stator.tasks.source  # noqa: F401, PLC0415

    for c in connect:
        c()
    for item in items:
        yield item, item
