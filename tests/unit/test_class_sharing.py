"""Which JVM maps which class-data archive (``stator.cluster.cds``): the settings only, the
archives themselves are made and used by ``make install`` and every Spark test."""

from __future__ import annotations

from pathlib import Path

import pytest

from stator.cluster import cds
from stator.driver.spark_session import class_sharing_conf

DRIVER_KEY, EXECUTOR_KEY = "spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"


@pytest.fixture
def prefix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An installation prefix with both archives (empty files: only their presence counts)."""
    archives = cds.archive_dir(str(tmp_path))
    archives.mkdir(parents=True)
    for role in (cds.DRIVER, cds.EXECUTOR):
        (archives / f"{role}.jsa").write_bytes(b"")
    monkeypatch.setattr(cds.sys, "prefix", str(tmp_path))
    return archives


def test_no_archive_no_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cds.sys, "prefix", str(tmp_path))
    assert cds.java_option(cds.DRIVER, str(tmp_path)) == ""
    assert class_sharing_conf("k8s://https://10.0.0.1:443", {}) == {}


def test_each_jvm_maps_the_archive_of_its_classpath(prefix: Path) -> None:
    driver = f"-XX:SharedArchiveFile={prefix / 'driver.jsa'}"
    executor = f"-XX:SharedArchiveFile={prefix / 'executor.jsa'}"
    assert class_sharing_conf("local[*]", {}) == {DRIVER_KEY: driver}
    # local-cluster executors are started by Spark's worker with the driver's classpath
    assert class_sharing_conf("local-cluster[3,1,1024]", {}) == {
        DRIVER_KEY: driver,
        EXECUTOR_KEY: driver,
    }
    # executor pods run the image entrypoint's classpath
    assert class_sharing_conf("k8s://https://10.0.0.1:443", {}) == {
        DRIVER_KEY: driver,
        EXECUTOR_KEY: executor,
    }


def test_the_users_java_options_are_kept_and_come_last(prefix: Path) -> None:
    """The JVM takes the last of a repeated -XX option: an archive the user names wins."""
    conf = {DRIVER_KEY: "-XX:SharedArchiveFile=/mine.jsa -Dx=1"}
    out = class_sharing_conf("local[2]", conf)
    assert out[DRIVER_KEY] == (
        f"-XX:SharedArchiveFile={prefix / 'driver.jsa'} -XX:SharedArchiveFile=/mine.jsa -Dx=1"
    )
