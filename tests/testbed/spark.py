"""What a local Spark needs from the test bed: the Kafka connector jars and loopback settings."""

from __future__ import annotations

import sys
from pathlib import Path

from .build import ensure
from .procs import LOOPBACK


def kafka_connector_jars() -> list[Path]:
    """Spark's Kafka connector and the jars it needs beyond pyspark's own, for ``spark.jars``."""
    return sorted(ensure("spark-kafka").path("lib").glob("*.jar"))


def local_spark_env() -> dict[str, str]:
    """Workers run the driver's interpreter, and Spark binds to loopback only."""
    return {
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": LOOPBACK,
        "SPARK_LOCAL_HOSTNAME": "localhost",
    }
