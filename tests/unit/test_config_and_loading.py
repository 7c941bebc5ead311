"""Bad configuration and bad pipeline references get errors that name the fix."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import yaml

from stator import Pipeline
from stator.config import load_config, to_dict
from stator.errors import ConfigError, PipelineError, StorageError
from stator.loader import load_pipeline
from stator.sinks import CollectSink
from stator.sources import GeneratorSource
from stator.storage import open_store


def test_defaults_and_overrides(tmp_path: Path) -> None:
    cfg_file = tmp_path / "job.yaml"
    cfg_file.write_text("parallelism: 3\ncheckpoint:\n  retained: 5\n  storage: s3://b/p\n")
    cfg = load_config(
        cfg_file,
        ["checkpoint.retained=7", "epoch.max_records=1000", "state.rocksdb.compaction_style=level"],
    )
    assert cfg.parallelism == 3 and cfg.checkpoint.retained == 7
    assert cfg.checkpoint.storage == "s3://b/p" and cfg.epoch.max_records == 1000
    assert cfg.state.rocksdb.compaction_style == "level"


def test_unknown_key_suggests_the_right_one() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, ["checkpoint.retaned=3"])
    assert "unknown config key 'checkpoint.retaned'" in str(err.value)
    assert "did you mean 'checkpoint.retained'" in str(err.value)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("parallelism=two", "parallelism must be an integer, got 'two'"),
        ("checkpoint.incremental=maybe", "checkpoint.incremental must be true or false"),
        ("restart.strategy=sometimes", "restart.strategy must be one of"),
        ("parallelism=0", "parallelism must be >= 1"),
        ("state.rocksdb.compression=brotli", "state.rocksdb.compression must be"),
        ("checkpoint=5", "checkpoint must be a mapping"),
        ("nonsense", "expected KEY=VALUE"),
        ("checkpoint.min_pause_ms=-1", "checkpoint.min_pause_ms must be >= 0"),
        ("name=../victim", "name '../victim': a job name is letters"),
        ("savepoint.dir=relative/savepoints", "savepoint.dir: unsupported storage URI"),
        ("name=team/counts", "it names the job's directory"),
        ("control.port=99999999", "got 99999999"),
        ("spark.conf.spark.speculation=true", "spark.conf.spark.speculation: Stator runs with"),
        ("spark.conf.spark.python.worker.reuse=false", "remove the setting"),
        ("checkpoint.inline_max_bytes=-1", "checkpoint.inline_max_bytes must be 0 (off) to"),
        ("checkpoint.inline_max_bytes=2000000", "to 1048576 (1 MiB), got 2000000"),
        ("max_parallelism=0", "max_parallelism must be 1 to 32768"),
        ("max_parallelism=40000", "got 40000; leave it out"),
        ("epoch.idle_wait_ms=-1", "epoch.idle_wait_ms must be >= 0, got -1"),
        ("epoch.max_ms=-1", "epoch.max_ms must be >= 0, got -1"),
        ("epoch.tasks=forever", "epoch.tasks must be one of per-epoch, long-running, got"),
        ("control.linger_ms=-5", "control.linger_ms must be >= 0"),
        ("state.warm_cache_entries=-1", "state.warm_cache_entries must be >= 0"),
        ("control.stopped_exit_code=256", "a process exit status, 0 to 255, got 256"),
        ("spark.conf.spark.task.maxFailures=10", "from spark.task_attempts; set that instead"),
        ("spark.conf.spark.master=local[2]", "spark.conf.spark.master: Stator sets it from"),
        ("s3.max_concurrency=0", "s3.max_concurrency must be >= 1"),
        ("s3.read_timeout_s=0", "s3.read_timeout_s must be > 0"),
        ("state.rocksdb.max_background_jobs=0", "state.rocksdb.max_background_jobs must be"),
        ("state.rocksdb.max_open_files=0", "state.rocksdb.max_open_files must be -1"),
    ],
)
def test_ill_typed_values_name_the_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, [override])


def test_spark_conf_keys_keep_their_dots(tmp_path: Path) -> None:
    """``--set spark.conf.<Spark key>=v`` sets that Spark key, as the YAML form does."""
    cfg = load_config(None, ["spark.conf.spark.sql.shuffle.partitions=4", "spark.master=local[2]"])
    assert cfg.spark.conf == {"spark.sql.shuffle.partitions": "4"}
    assert cfg.spark.master == "local[2]"
    cfg_file = tmp_path / "job.yaml"
    cfg_file.write_text("spark:\n  conf:\n    spark.sql.shuffle.partitions: 4\n")
    assert load_config(cfg_file).spark.conf == cfg.spark.conf


def test_one_key_in_two_spellings_is_refused(tmp_path: Path) -> None:
    """'-' and '_' name the same key: in one file, one of the two would be dropped in
    silence; a --set joins (or replaces) what the file spells either way."""
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"epoch": {"max-records": 5, "max_records": 6}}))
    with pytest.raises(ConfigError, match=r"'epoch\.max_records' is given twice, as 'max-records'"):
        load_config(path)
    path.write_text(yaml.safe_dump({"local-recovery": {"executor-wait-ms": 5000}}))
    merged = load_config(path, ["local_recovery.standby=true", "local_recovery.executor_wait_ms=7"])
    assert (merged.local_recovery.executor_wait_ms, merged.local_recovery.standby) == (7, True)


def test_two_checkpoint_schedules_are_refused() -> None:
    with pytest.raises(ConfigError, match="are two schedules: set one"):
        load_config(None, ["checkpoint.every_epochs=5", "checkpoint.interval_ms=30000"])
    assert load_config(None, ["checkpoint.interval_ms=30000"]).checkpoint.interval_ms == 30000


def test_missing_or_broken_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_a_credential_of_the_wrong_type_is_not_echoed() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, ["s3.secret_access_key=123456789"])
    assert "s3.secret_access_key must be a string, got ***" in str(err.value)
    assert "123456789" not in str(err.value)


def test_credentials_never_printed() -> None:
    cfg = load_config(None, ["s3.secret_access_key=hunter2hunter2"])
    assert "hunter2" not in repr(cfg.s3) and "hunter2" not in str(to_dict(cfg))


def test_pipeline_reference_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(PipelineError, match="MODULE:FUNCTION"):
        load_pipeline("no_colon")
    with pytest.raises(PipelineError, match="no module named 'not_a_module_xyz'"):
        load_pipeline("not_a_module_xyz:build")
    mod = tmp_path / "mypipes.py"
    mod.write_text("def build_one():\n    return 42\n\ndef helper():\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PipelineError, match="has no function 'build'; it has: build_one, helper"):
        load_pipeline("mypipes:build")
    with pytest.raises(PipelineError, match="returned int, not a stator Pipeline"):
        load_pipeline("mypipes:build_one")
    with pytest.raises(PipelineError, match="does not exist"):
        load_pipeline(f"{tmp_path}/missing.py:build")


def test_graph_errors() -> None:
    with pytest.raises(PipelineError, match="needs uid"):
        Pipeline("p").source(GeneratorSource(), uid="has space")
    p = Pipeline("p")
    s = p.source(GeneratorSource(), uid="src")
    with pytest.raises(PipelineError, match="used twice"):
        p.source(GeneratorSource(), uid="src")
    s.map(lambda x: x)
    with pytest.raises(PipelineError, match="has no sink"):
        p.validate()
    s.sink(CollectSink(), uid="out")
    with pytest.raises(PipelineError, match="output of 'map' goes nowhere"):
        p.validate()
    with pytest.raises(PipelineError, match="maxParallelism must be in"):
        Pipeline("p", max_parallelism=0)


def test_storage_uris() -> None:
    with pytest.raises(StorageError, match="unsupported storage URI"):
        open_store("hdfs://x/y")
    with pytest.raises(StorageError, match="has no bucket"):
        open_store("s3:///path")


def test_file_store_refuses_escaping_keys(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/root")
    with pytest.raises(StorageError, match="escapes"):
        store.put("../outside", b"x")
    store.put("a/b", b"1")
    store.move("a/b", "c/d")
    store.move("a/b", "c/d")  # idempotent once moved
    assert store.get("c/d") == b"1" and store.listing() == [("c/d", 1)]


GRAPH = """
from stator import Pipeline
from stator.sinks import CollectSink
from stator.sources import GeneratorSource


def build():
    p = Pipeline("nested")
    p.source(GeneratorSource(), uid="events").sink(CollectSink(), uid="out")
    return p
"""


def test_files_and_packages_load_under_their_real_dotted_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stator.loader import load, module_name_of, parse_reference

    monkeypatch.setattr(sys, "path", list(sys.path))
    sub = tmp_path / "proj" / "top_pkg" / "sub"
    sub.mkdir(parents=True)
    (tmp_path / "proj" / "top_pkg" / "__init__.py").write_text("")
    (sub / "__init__.py").write_text("")
    (sub / "nested_pipe.py").write_text(GRAPH)
    assert module_name_of(sub / "nested_pipe.py") == ("top_pkg.sub.nested_pipe", tmp_path / "proj")
    ref = parse_reference(f"{sub}/nested_pipe.py:build")
    assert (ref.module, ref.root) == ("top_pkg.sub.nested_pipe", tmp_path / "proj")
    assert parse_reference(f"{sub}:build").module == "top_pkg.sub"
    assert parse_reference(f"{sub}/__init__.py:build").module == "top_pkg.sub"
    assert parse_reference("examples.keyed_count:build").root is None

    monkeypatch.chdir(tmp_path / "proj" / "top_pkg")  # the reference is relative to cwd
    loaded = load("sub/nested_pipe.py:build")
    assert loaded.pipeline.name == "nested"
    assert loaded.import_root == str(tmp_path / "proj")
    assert sys.path[0] == str(tmp_path / "proj")
    assert sys.modules["top_pkg.sub.nested_pipe"].__file__ == str(sub / "nested_pipe.py")
    for name in ("top_pkg.sub.nested_pipe", "top_pkg.sub", "top_pkg"):
        del sys.modules[name]


def test_installed_modules_need_no_worker_path() -> None:
    from stator.loader import _import_root

    assert _import_root(yaml) is None  # site-packages: workers have it already
    assert _import_root(json) is None  # the standard library
