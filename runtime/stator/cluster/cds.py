"""Class-data sharing (AppCDS) for Spark's JVMs: a shorter start for the driver and every
executor.

A Spark JVM parses and verifies several thousand classes from Spark's jars before it runs
anything: on a 2-core machine that is most of a driver's session start (a local session and
its first job: 8.5-10 s without an archive, 4.9-5.5 s with one) and seconds of every
executor's, which a replacement executor and a rescale's new driver pay. An archive made once
per installation holds those classes parsed; a JVM maps it instead.

An archive belongs to one JVM build and one classpath (the jars' paths, sizes and times), so
there are two, under ``<sys.prefix>/share/stator/cds/`` (built by ``python -m
stator.cluster.cds``: ``make install`` and the runtime image do it):

- ``driver.jsa``: Spark's launcher's classpath, which the driver (``pyspark`` starts it with
  ``spark-submit``) and ``local-cluster`` executors run with;
- ``executor.jsa``: the runtime image's entrypoint's classpath, which executor pods run with.

Each is made by running a small local job (a shuffle through Python workers) in a JVM with
that classpath and ``-XX:ArchiveClassesAtExit``. A JVM given an archive that does not match
it (another JDK, other jars) warns once on stderr and runs without it (``-Xshare:auto``, the
default): sharing never changes what runs, only how fast it starts.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ..errors import ConfigError
from .jvm import java_tool

log = logging.getLogger("stator.cluster")

DRIVER, EXECUTOR = "driver", "executor"

# The job each archive is made from: what a Stator JVM loads first (a session, an RDD job
# with a shuffle through Python workers, a DataFrame).
# It also writes the module options Spark's launcher gives every JVM it starts (executor pods
# get them from the driver): the executor archive's JVM, started without the launcher, needs
# them too.
_WORKLOAD = """
import sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.appName("stator-cds").getOrCreate()
rdd = spark.sparkContext.parallelize(range(1000), 2).map(lambda x: (x % 7, 1))
assert sum(n for _, n in rdd.reduceByKey(lambda a, b: a + b).collect()) == 1000
assert spark.range(100).selectExpr("sum(id)").collect()[0][0] == 4950
options = spark._jvm.org.apache.spark.launcher.JavaModuleOptions.defaultModuleOptions()
open(sys.argv[1], "w").write(options)
spark.stop()
"""


def archive_dir(prefix: str | None = None) -> Path:
    """Where this installation's archives are (``prefix``: default ``sys.prefix``)."""
    return Path(prefix or sys.prefix) / "share" / "stator" / "cds"


def java_option(role: str, prefix: str | None = None) -> str:
    """The JVM option that maps the archive of ``role`` (``DRIVER`` or ``EXECUTOR``), or ""
    if this installation has none."""
    path = archive_dir(prefix) / f"{role}.jsa"
    return f"-XX:SharedArchiveFile={path}" if path.is_file() else ""


def with_option(existing: str | None, option: str) -> str:
    """``option`` added to a ``spark.*.extraJavaOptions`` value (the user's come last, so
    that an archive they name themselves wins)."""
    return " ".join(o for o in (option, existing or "") if o)


def build(out: Path | None = None, java: str | None = None) -> list[Path]:
    """Make both archives (replacing older ones); returns their paths. Each is written next
    to its final name and moved there once complete, so a JVM never maps half an archive."""
    import pyspark  # noqa: PLC0415

    out = out or archive_dir()
    out.mkdir(parents=True, exist_ok=True)
    spark_home = os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__)
    java = java or _java()
    made = []
    with tempfile.TemporaryDirectory(prefix="stator-cds-") as work:
        script = Path(work) / "workload.py"
        script.write_text(_WORKLOAD)
        env = {
            **os.environ,
            "SPARK_HOME": spark_home,
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1",
        }
        local = ["--master", "local[2]", "--conf", "spark.ui.enabled=false"]
        options = Path(work) / "module-options"
        for role in (DRIVER, EXECUTOR):  # in this order: the driver's run writes ``options``
            partial = out / f".{role}.jsa.{os.getpid()}"
            dump = f"-XX:ArchiveClassesAtExit={partial}"
            if role == DRIVER:  # through Spark's launcher, as pyspark starts a driver
                submit = Path(spark_home) / "bin" / "spark-submit"
                argv = [str(submit), *local, "--driver-java-options", dump, str(script)]
            else:  # the classpath of images/runtime/entrypoint.sh
                classpath = f"{spark_home}/jars/*"
                submit_main = "org.apache.spark.deploy.SparkSubmit"
                module = options.read_text().split()
                argv = [java, *module, dump, "-cp", classpath, submit_main, *local, str(script)]
            argv.append(str(options))
            proc = subprocess.run(
                argv, env=env, cwd=work, capture_output=True, text=True, check=False
            )
            if proc.returncode != 0 or not partial.is_file():
                partial.unlink(missing_ok=True)
                raise RuntimeError(
                    f"making the {role} class-data archive failed (exit {proc.returncode}): "
                    f"{proc.stderr[-2000:]}"
                )
            final = out / f"{role}.jsa"
            os.replace(partial, final)
            made.append(final)
    return made


def _java() -> str:
    return java_tool("java", "making Spark's class-data archives")


def jdk_archive() -> Path:
    """The JDK's own archive (its core classes), which every JVM maps without Stator's: the
    baseline ``bench --only spark_start`` compares with."""
    return Path(os.path.realpath(_java())).parent.parent / "lib" / "server" / "classes.jsa"


def main() -> int:
    """``python -m stator.cluster.cds [DIR]``: make the archives (default: this
    installation's). A failure leaves Spark to start without them; the exit code says so."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    try:
        for path in build(out):
            log.info("class-data archive %s (%.0f MB)", path, path.stat().st_size / 1e6)
    except (RuntimeError, OSError, ConfigError) as exc:
        log.warning("no class-data archives: %s (Spark's JVMs start without them)", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
