"""The Python workers' process setup: the daemon's path trimming and the paused collector."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from stator.tasks import gc_pause, worker_warmup
from stator.tasks.gc_pause import gc_paused, resume_after_each_task
from stator.tasks.pydaemon import redundant_archives


def _package(root: Path, name: str, version: str) -> str:
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text("")
    (root / name / "version.py").write_text(f"__version__ = {version!r}\n")
    return str(root)


def _zipped(path: Path, files: dict[str, str]) -> str:
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return str(path)


def test_the_daemon_drops_only_archives_no_import_needs(tmp_path: Path) -> None:
    site = _package(tmp_path / "site", "pyspark", "4.0.0")
    _package(tmp_path / "site", "py4j", "0.10.9.9")
    same = _zipped(
        tmp_path / "pyspark.zip",
        {"pyspark/__init__.py": "", "pyspark/version.py": "__version__ = '4.0.0'\n"},
    )
    py4j = _zipped(
        tmp_path / "py4j-0.10.9.9-src.zip",
        {"py4j/__init__.py": "", "py4j/version.py": "__version__ = '0.10.9.9'\n"},
    )
    jar = _zipped(tmp_path / "spark-core.jar", {"org/apache/spark/A.class": "x"})
    pyjar = _zipped(tmp_path / "with-python.jar", {"pkg/__init__.py": ""})
    path = [same, py4j, jar, pyjar, site]
    assert redundant_archives(path) == [same, py4j, jar]


@pytest.mark.parametrize("installed", [None, "3.5.1"])
def test_the_daemon_keeps_a_zip_that_is_the_only_or_another_version(
    tmp_path: Path, installed: str | None
) -> None:
    zipped = _zipped(
        tmp_path / "pyspark.zip",
        {"pyspark/__init__.py": "", "pyspark/version.py": "__version__ = '4.0.0'\n"},
    )
    path = [zipped]
    if installed is not None:
        path.append(_package(tmp_path / "site", "pyspark", installed))
    assert redundant_archives(path) == []


def test_a_task_runs_with_the_collector_paused_and_restores_it() -> None:
    seen: list[bool] = []

    @gc_paused
    def task(fail: bool) -> int:
        seen.append(gc.isenabled())
        if fail:
            raise RuntimeError("user code failed")
        return 7

    assert gc.isenabled()
    assert task(False) == 7
    with pytest.raises(RuntimeError):
        task(True)
    assert seen == [False, False] and gc.isenabled()
    gc.disable()
    try:
        task(False)  # someone else switched it off: it stays off
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_in_a_spark_worker_the_collector_resumes_once_the_pyspark_task_has_ended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The task's output is pickled after it returns: collecting then traverses all of it."""
    monkeypatch.setattr(gc_pause._PAUSE, "at_task_end", False)
    monkeypatch.setattr(gc_pause._PAUSE, "frozen", True)  # this test process stays unfrozen
    seen: list[bool] = []

    @gc_paused
    def task() -> list[int]:
        seen.append(gc.isenabled())
        return [1, 2]

    def pyspark_task(fail: bool) -> None:
        task()
        seen.append(gc.isenabled())  # PySpark serializing the output
        if fail:
            raise RuntimeError("the worker failed")

    run = resume_after_each_task(pyspark_task)
    run(False)
    assert seen == [False, False] and gc.isenabled()
    with pytest.raises(RuntimeError):
        run(True)
    assert seen == [False, False, False, False] and gc.isenabled()
    gc.disable()  # a task that did not pause it leaves a collector someone else paused
    try:
        resume_after_each_task(lambda: None)()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_worker_freezes_what_its_first_task_loaded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gc_pause._PAUSE, "at_task_end", False)
    monkeypatch.setattr(gc_pause._PAUSE, "frozen", False)
    frozen: list[int] = []
    monkeypatch.setattr(gc, "freeze", lambda: frozen.append(1))  # the test process stays whole
    run = resume_after_each_task(lambda: None)
    run()
    run()
    assert frozen == [1] and gc_pause._PAUSE.frozen


def _in_fresh_python(code: str, env: dict[str, str]) -> list[str]:
    """Run ``code`` in a new interpreter (nothing imported yet); its printed lines."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**clean, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return done.stdout.split()


WARM_THEN_BUILD = """
    import sys
    from stator.tasks.worker_warmup import warm
    print(",".join(warm()))
    print("boto3" in sys.modules)
    from stator import storage
    warmed = storage._session
    client = storage._s3_client(storage.S3Options(endpoint_url="http://127.0.0.1:9"))
    print(warmed is not None and storage._session is warmed)
    print(client.meta.service_model.service_name)
"""


def test_the_daemon_loads_the_task_modules_and_s3_before_it_forks_workers() -> None:
    """With S3 credentials in the environment, a worker's first client is built from the
    session the daemon loaded the S3 models into."""
    lines = _in_fresh_python(
        WARM_THEN_BUILD, {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    )
    assert lines == ["stator.tasks.source,stator.tasks.keyed,s3", "True", "True", "s3"]


def test_without_s3_credentials_the_daemon_does_not_load_boto3() -> None:
    code = """
        import sys
        from stator.tasks.worker_warmup import warm
        print(",".join(warm()))
        print("boto3" in sys.modules)
    """
    assert _in_fresh_python(code, {}) == ["stator.tasks.source,stator.tasks.keyed", "False"]


def test_a_warm_up_that_fails_leaves_the_workers_cold_and_the_daemon_running(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(worker_warmup, "TASK_MODULES", ("stator.tasks.keyed", "no_such_module"))
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    assert worker_warmup.warm() == ["stator.tasks.keyed"]
    assert "Python workers start cold" in caplog.text
    assert "no_such_module" in caplog.text
