"""Small helpers shared by runtime tests."""

from __future__ import annotations

import itertools
import time
from typing import Any

import psutil

from stator import EpochResult, Job, JobStatus
from stator.api.pipeline import Pipeline
from stator.config import JobConfig, build


def with_overrides(config: JobConfig, **sections: dict[str, Any] | Any) -> JobConfig:
    """A copy of ``config`` with nested keys replaced, e.g. epoch={"max_records": 3}."""
    import dataclasses

    data = dataclasses.asdict(config)
    for key, value in sections.items():
        if isinstance(value, dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    result: JobConfig = build(JobConfig, data, "")
    return result


def run_job(pipeline: Pipeline, config: JobConfig, spark: Any) -> JobStatus:
    return pipeline.run(config, spark)


def stop_with_savepoint_after(driver: Job, epoch: int) -> Job:
    """Make ``driver`` request a stop-with-savepoint right after ``epoch`` completes."""

    def stop_after(result: EpochResult) -> None:
        if result.epoch == epoch and not result.savepoint:
            driver.request_savepoint(stop=True)

    driver.on_epoch(stop_after)
    return driver


class SparkSessions:
    """The one SparkContext a process may have, switched between the configurations tests
    ask for. A module that needs another master or retry count (``local-cluster``, fewer task
    attempts) asks for it here; the next test that wants the shared ``local[2]`` session gets
    a new one instead of the stopped one (stopping a session obtained with ``getOrCreate``
    used to stop every later test's session too)."""

    def __init__(self) -> None:
        self._config: object = None
        self._session: Any = None

    def get(self, config: Any, app_name: str) -> Any:
        from stator.driver.spark_session import create_session

        alive = self._session is not None and self._session.sparkContext._jsc is not None
        if alive and self._config == config:
            return self._session
        self.stop()
        self._session = create_session(_with_connector_on_first_launch(config), app_name)
        self._config = config
        return self._session

    def stop(self) -> None:
        if self._session is not None:
            self._session.stop()
        self._session, self._config = None, None


def _with_connector_on_first_launch(config: Any) -> Any:
    """``config`` with the test bed's Kafka connector on the driver's class path if this
    session launches the process's JVM. Spark finds a data source on the class path the JVM
    was launched with; ``spark.jars`` given to a later session reaches its tasks but not the
    driver, so whichever module happens to start the JVM first must bring the connector."""
    import dataclasses

    from pyspark import SparkContext

    from tests.testbed.spark import kafka_connector_jars

    if SparkContext._gateway is not None:
        return config
    class_path = ":".join(str(j) for j in kafka_connector_jars())
    conf = {**config.conf, "spark.driver.extraClassPath": class_path}
    return dataclasses.replace(config, conf=conf)


def executor_process(app_id: str, executor: str) -> psutil.Process:
    """One of this test's executor JVMs (``local-cluster`` starts them as children of the
    test's own JVM), found by application and executor id."""
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "org.apache.spark.executor.CoarseGrainedExecutorBackend" not in cmd:
            continue
        args = dict(itertools.pairwise(cmd))
        if args.get("--app-id") == app_id and args.get("--executor-id") == executor:
            return proc
    raise AssertionError(f"no executor {executor} of {app_id}")


def wait_until(what: str, check: Any, timeout: float = 120) -> Any:
    """Poll ``check`` every 0.2 s until it returns something truthy, and return that; raise
    ``TimeoutError(what)`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise TimeoutError(what)


PYTHON_DAEMON = "stator.tasks.pydaemon"  # the module Spark starts its Python workers from


def python_workers(pid: int) -> list[psutil.Process]:
    """PySpark's forked Python workers under process ``pid`` (a ``stator run``): children of
    the daemon process (Stator's, ``stator.tasks.pydaemon``), with its command line."""
    found = []
    for p in psutil.Process(pid).children(recursive=True):
        try:
            cmd, parent = " ".join(p.cmdline()), p.parent()
            if PYTHON_DAEMON in cmd and parent and PYTHON_DAEMON in " ".join(parent.cmdline()):
                found.append(p)
        except psutil.NoSuchProcess:
            continue
    return found
