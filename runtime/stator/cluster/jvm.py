"""The small JVM part of Stator: its Java source ships with the package, and is compiled
against the installed PySpark's jars the first time a session needs it.

The jar is cached outside the work tree, under ``$STATOR_CACHE/jars/<hash>.jar`` (default
``~/.cache/stator``), keyed by a hash of the sources and the Spark version, so a changed
source or another Spark builds a new jar and an unchanged one is reused.

Building (``ensure_jar``):

1. Hash the sources and the Spark version; a jar of that name exists -> done.
2. Compile with ``javac`` into a temporary directory next to the cache, then pack with ``jar``.
3. Move the jar into place with one rename, so a concurrent or interrupted build never leaves
   a partial jar under the final name (a failure leaves only the temporary directory, removed).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from ..errors import ConfigError

log = logging.getLogger("stator.cluster")

SOURCES = Path(__file__).parent / "jvm"
JAR_PREFIX = "stator-jvm-"
# Task local properties set by stator.jvm.PreferredLocationsRDD.compute (same names there).
EXECUTOR_ID_PROPERTY = "stator.executor.id"
EXECUTOR_HOST_PROPERTY = "stator.executor.host"
RETRY_PROPERTY = "stator.task.retry"
SENT_TO_GONE_PROPERTY = "stator.task.sent_to_gone"


def cache_dir() -> Path:
    explicit = os.environ.get("STATOR_CACHE")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "stator"


def _spark_home() -> Path:
    import pyspark  # noqa: PLC0415 - heavy, and only needed here

    return Path(pyspark.__file__).parent


def _spark_version() -> str:
    import pyspark  # noqa: PLC0415

    return str(pyspark.__version__)


def java_tool(name: str, purpose: str) -> str:
    """A JDK tool (``java``, ``javac``, ``jar``) from JAVA_HOME if set, else from PATH;
    ``purpose`` says in the error what needs it."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / name).exists():
        return str(Path(home) / "bin" / name)
    found = shutil.which(name)
    if found is None:
        raise ConfigError(
            f"'{name}' not found: {purpose} needs a JDK (17+); install one or set JAVA_HOME"
        )
    return found


_HELPER = "task placement on several executors (Stator's JVM helper, built once)"


def ensure_jar() -> Path:
    """Steps 1-3 of the module docstring; returns the jar's path."""
    sources = sorted(SOURCES.rglob("*.java"))
    digest = hashlib.sha256(_spark_version().encode())
    for src in sources:
        digest.update(src.relative_to(SOURCES).as_posix().encode())
        digest.update(src.read_bytes())
    jar = cache_dir() / "jars" / f"{JAR_PREFIX}{digest.hexdigest()[:16]}.jar"
    if jar.exists():
        return jar
    jar.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=jar.parent, prefix=".build-") as tmp:
        classes = Path(tmp) / "classes"
        classpath = str(_spark_home() / "jars" / "*")
        _run(
            [java_tool("javac", _HELPER), "-nowarn", "-d", str(classes), "-cp", classpath]
            + [str(s) for s in sources]
        )
        packed = Path(tmp) / "out.jar"
        _run([java_tool("jar", _HELPER), "cf", str(packed), "-C", str(classes), "."])
        os.replace(packed, jar)
    return jar


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ConfigError(
            f"building Stator's JVM helper failed ({' '.join(cmd[:1])}):\n{done.stderr[-2000:]}"
        )


def _has_helper(sc: Any) -> bool:
    from py4j.java_gateway import JavaClass  # noqa: PLC0415

    return isinstance(sc._jvm.stator.jvm.PreferredLocationsRDD, JavaClass)


def load_helper(sc: Any) -> bool:
    """Whether the driver's JVM has the helper; without it the job runs without placement
    rather than failing.

    ``spark.jars`` reaches the driver's class path only when its JVM starts. A session
    created after another one in the same process (tests, a notebook) ships the jar to its
    executors but not to the driver, so the helper jar named in ``spark.jars`` is added to
    the driver's class loader here (Spark's own ``MutableURLClassLoader``)."""
    if _has_helper(sc):
        return True
    jars = [j for j in sc.getConf().get("spark.jars", "").split(",") if JAR_PREFIX in j]
    loader = sc._jvm.java.lang.Thread.currentThread().getContextClassLoader()
    if not jars or not loader.getClass().getName().endswith("MutableURLClassLoader"):
        return False
    for jar in jars:
        url = jar if jar.startswith("file:") else sc._jvm.java.io.File(jar).toURI().toString()
        loader.addURL(sc._jvm.java.net.URI(url).toURL())
    return _has_helper(sc)


def fail_futile_retries(sc: Any) -> None:
    """Fail a job at its first task that raised ``StateMismatchError`` (a rewind is needed:
    no attempt of that task can succeed) rather than after all of Spark's attempts
    (``stator.jvm.FutileRetryListener``; once per SparkContext). Needs the helper loaded."""
    sc._jvm.stator.jvm.FutileRetryListener.install(sc._jsc.sc())


def watch_lost_pods(sc: Any) -> bool:
    """Remove an executor from Spark as soon as its pod is deleted or restarts in place, not
    at Spark's next pod list (``stator.jvm.LostPodWatcher``; once per SparkContext; False
    where executors are not pods, or the watch could not start: Spark's list still notices
    the loss, later). Needs the helper loaded."""
    from py4j.protocol import Py4JError  # noqa: PLC0415

    try:
        return bool(sc._jvm.stator.jvm.LostPodWatcher.install(sc._jsc.sc()))
    except Py4JError as exc:
        java = getattr(exc, "java_exception", None)  # Py4JJavaError: the Java error's own line
        log.warning(
            "executor pods are not watched for deletions (%s): Spark's pod list notices a "
            "lost executor instead, seconds later. The driver's service account needs list "
            "and watch on pods in its namespace",
            java.toString() if java is not None else str(exc).splitlines()[0],
        )
        return False


def prefer_locations(
    sc: Any, rdd: Any, locations: list[str], state_on: list[str] | None = None
) -> Any:
    """``rdd`` (a PySpark RDD) wrapped one-to-one so that partition ``i`` prefers
    ``locations[i]`` (comma-separated Spark locations, "" for anywhere). ``state_on[i]``: the
    executor locations that alone hold partition ``i``'s state ("" where a retry elsewhere
    may restore it): once all are lost mid-job, the job is cancelled at once
    (``FutileRetryListener``)."""
    from pyspark import RDD  # noqa: PLC0415

    wrapped = sc._jvm.stator.jvm.PreferredLocationsRDD(
        rdd._jrdd.rdd(), _strings(sc, locations), _strings(sc, state_on or [])
    )
    return RDD(wrapped.toJavaRDD(), sc, rdd._jrdd_deserializer)


def _strings(sc: Any, values: list[str]) -> Any:
    array = sc._gateway.new_array(sc._jvm.java.lang.String, len(values))
    for i, value in enumerate(values):
        array[i] = value
    return array


def executor_location(host: str, executor: str) -> str:
    """Spark's location string for one executor (process-local), as the JVM RDD takes it."""
    return f"executor_{host}_{executor}"


def task_location() -> tuple[str, str]:
    """In a task of a wrapped RDD: (executor id, host) as the JVM RDD recorded them;
    ("", "") when the stage is not wrapped (``local[*]``) or outside Spark."""
    try:
        from pyspark import TaskContext  # noqa: PLC0415 - executors have pyspark loaded
    except ImportError:  # pragma: no cover - tasks always run under pyspark
        return "", ""
    ctx: Any = TaskContext.get()
    if ctx is None:
        return "", ""
    executor = ctx.getLocalProperty(EXECUTOR_ID_PROPERTY) or ""
    host = ctx.getLocalProperty(EXECUTOR_HOST_PROPERTY) or ""
    return str(executor), str(host)


def task_is_retry() -> bool:
    """In a task of a wrapped RDD: whether it runs again, as the JVM RDD recorded it (a later
    attempt of its task, or any attempt of a stage Spark resubmitted after a fetch failure,
    as when a lost executor held shuffle output: its tasks count attempts from 0 again)."""
    return _task_flag(RETRY_PROPERTY)


def task_sent_to_gone() -> bool:
    """In a task of a wrapped RDD: whether it is a first attempt that runs away from the
    executor the driver sent it to because that executor is gone (lost after the epoch was
    planned, before its stage started), as the JVM RDD found it."""
    return _task_flag(SENT_TO_GONE_PROPERTY)


def _task_flag(name: str) -> bool:
    """A true/false local property the JVM RDD set on the running task (False outside one)."""
    from pyspark import TaskContext  # noqa: PLC0415 - only inside a task

    ctx: Any = TaskContext.get()
    return ctx is not None and ctx.getLocalProperty(name) == "true"


def live_executors(sc: Any) -> dict[str, str]:
    """Executor id -> host of the executors registered now (from the block manager master;
    the driver's own entry left out)."""
    status = sc._jsc.sc().env().blockManager().master().getMemoryStatus()
    ids = sc._jvm.scala.jdk.javaapi.CollectionConverters.asJava(status.keySet())
    return {str(bm.executorId()): str(bm.host()) for bm in ids if str(bm.executorId()) != "driver"}
