"""``stator run`` with bad input fails before Spark starts: one ``stator: error:`` line that
names the field or path, exit code 2, nothing written anywhere.

Each case runs the CLI's ``main()`` in-process with Spark's session factory replaced by one
that fails the test: every refusal here must happen before a SparkSession exists.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import stator.driver.spark_session
from stator.checkpoint.metadata import CheckpointMetadata, metadata_key
from stator.cli.main import main
from stator.savepoint.metadata import OperatorSavepoint, SavepointMetadata
from stator.storage import open_store
from tests.testbed.procs import free_port

GOOD = """
import os
from stator import KeyedProcessFunction, Pipeline
from stator.sinks import FileSink
from stator.sources import GeneratorSource, KeyedEvents


class Totals(KeyedProcessFunction):
    def process_element(self, value, ctx):
        yield value


def build(pinned=None):
    p = Pipeline("good-pipe", max_parallelism=32)
    (
        p.source(GeneratorSource(KeyedEvents(num_keys=5), count=10), uid="events")
        .key_by(lambda e: e[0])
        .process(Totals(), uid="totals", parallelism=pinned)
        .sink(FileSink(os.environ["STATOR_TEST_OUT"]), uid="out")
    )
    return p
"""

BUILDERS = """
from stator import Pipeline
from stator.sources import GeneratorSource
from good import build


def raises():
    raise ValueError("no price column")


def returns_int():
    return 3


def needs_argument(x):
    return x


def no_sink():
    p = Pipeline("no-sink")
    p.source(GeneratorSource(), uid="events")
    return p


def pinned_too_high():
    return build(pinned=40)
"""

FILES = {
    "good.py": GOOD,
    "builders.py": BUILDERS,
    "json.py": GOOD,  # its module name is taken (the standard library's json)
    "my-pipe.py": GOOD,  # not a valid module name
    "notes.txt": GOOD,
    "import_raises.py": 'raise RuntimeError("broken at import")\n',
    "syntax_error.py": "def build(:\n    pass\n",
    "missing_dep.py": "import no_such_dependency_xyz\n",
    "broken.yaml": "checkpoint: [unclosed\n",
    "plainfile": "a file, not a directory\n",
    "plaindir/pipe.py": GOOD,
}


def _savepoint(location: Path, max_parallelism: int = 32, **operators: OperatorSavepoint) -> None:
    meta = SavepointMetadata(
        "good-pipe", 3, 1_700_000_000_000, max_parallelism, operators, {}, 0, "zlib"
    )
    open_store(f"file://{location}").put("_savepoint.json", meta.to_json())


def _op(uid: str, key_groups: dict[int, dict[str, object]] | None = None) -> OperatorSavepoint:
    return OperatorSavepoint(uid, 1, {}, key_groups or {}, 0)


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bad-inputs")
    for name, text in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    kg = {0: {"file": "totals/kg-00000.bin", "bytes": 10, "entries": 1}}
    _savepoint(root / "sp-maxp64", 64, totals=_op("totals"))
    _savepoint(root / "sp-gone-operator", 32, totals=_op("totals"), gone=_op("gone"))
    _savepoint(root / "sp-missing-file", 32, totals=_op("totals", kg))
    _savepoint(root / "sp-truncated", 32, totals=_op("totals", kg))
    (root / "sp-truncated/totals").mkdir()
    (root / "sp-truncated/totals/kg-00000.bin").write_bytes(b"12345")
    (root / "sp-corrupt").mkdir()
    (root / "sp-corrupt/_savepoint.json").write_text("{not json")
    chk = CheckpointMetadata(1, 4, "good-pipe", 1_700_000_000_000, 64, True, {}, {}, {}, 0)
    open_store(f"file://{root}/ckroot/good-pipe").put(metadata_key(1), chk.to_json())
    (root / "sp-array").mkdir()
    (root / "sp-array/_savepoint.json").write_text("[]")
    _savepoint(root / "sp-bytes-zz", 32, totals=_op("totals", {0: {**kg[0], "bytes": "zz"}}))
    wrong_shape = json.loads(chk.to_json()) | {"checkpoint_id": 2, "operators": []}
    newest = open_store(f"file://{root}/ckshape/good-pipe")
    newest.put(metadata_key(1), chk.to_json())
    newest.put(metadata_key(2), json.dumps(wrong_shape).encode())
    return root


def _files(*roots: Path) -> dict[str, float]:
    return {
        str(p): p.stat().st_mtime
        for root in roots
        for p in root.rglob("*")
        if "__pycache__" not in p.parts
    }


@pytest.fixture
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    def no_spark(*_: object) -> None:
        raise AssertionError("a SparkSession was created: the error was found too late")

    monkeypatch.setattr(stator.driver.spark_session, "create_session", no_spark)
    monkeypatch.setenv("STATOR_TEST_OUT", f"file://{tmp_path}/out")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "a")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-value")
    path, modules = list(sys.path), set(sys.modules)
    yield tmp_path
    sys.path[:] = path
    for name in set(sys.modules) - modules:
        if name in ("good", "builders"):
            del sys.modules[name]


GOOD_REF = "{f}/good.py:build"

# (case id, argv after "run" with {f} = fixtures and {t} = this test's directory,
#  the text the error line must contain, a traceback must follow the error line)
CASES: list[tuple[str, list[str], str, bool]] = [
    # pipeline references
    ("no-colon", ["good"], "must be MODULE:FUNCTION", False),
    (
        "no-module",
        ["no.such.module:build"],
        "cannot import pipeline module 'no.such.module'",
        False,
    ),
    ("bad-module-name", ["no such:build"], "is not a dotted module name", False),
    (
        "missing-file",
        ["{f}/missing.py:build"],
        "pipeline file {f}/missing.py does not exist",
        False,
    ),
    ("not-python", ["{f}/notes.txt:build"], "is not a .py file", False),
    ("not-a-package", ["{f}/plaindir:build"], "is not a package (no __init__.py)", False),
    (
        "invalid-name",
        ["{f}/my-pipe.py:build"],
        "'my-pipe', which is not a valid module name",
        False,
    ),
    ("name-taken", ["{f}/json.py:build"], "is already taken by", False),
    ("no-function", ["{f}/good.py:nope"], "has no function 'nope'; it has: Totals, build", False),
    ("bad-function", ["{f}/good.py:build-it"], "must be MODULE:FUNCTION", False),
    # pipeline modules and build functions that fail
    (
        "import-raises",
        ["{f}/import_raises.py:build"],
        "failed to import: RuntimeError: broken at import",
        True,
    ),
    ("syntax-error", ["{f}/syntax_error.py:build"], "failed to import: SyntaxError", True),
    (
        "missing-dependency",
        ["{f}/missing_dep.py:build"],
        "failed to import: ModuleNotFoundError: No module named 'no_such_dependency_xyz'",
        True,
    ),
    (
        "build-raises",
        ["{f}/builders.py:raises"],
        "builders.py:raises: raises() raised ValueError: no price column",
        True,
    ),
    (
        "build-needs-argument",
        ["{f}/builders.py:needs_argument"],
        "needs_argument() raised TypeError",
        False,
    ),
    (
        "build-returns-int",
        ["{f}/builders.py:returns_int"],
        "returned int, not a stator Pipeline",
        False,
    ),
    ("graph-without-sink", ["{f}/builders.py:no_sink"], "has no sink", False),
    # configuration
    (
        "parallelism-above-max",
        [GOOD_REF, "-s", "parallelism=40"],
        "parallelism (spec.replicas) is 40, but max_parallelism is 32",
        False,
    ),
    (
        "pinned-above-max",
        ["{f}/builders.py:pinned_too_high"],
        "operator 'totals': parallelism must be in [1, maxParallelism=32], got 40",
        False,
    ),
    ("max-parallelism-disagrees", [GOOD_REF, "-s", "max_parallelism=64"], "they must agree", False),
    (
        "misspelled-key",
        [GOOD_REF, "-s", "checkpoint.retaind=2"],
        "did you mean 'checkpoint.retained'",
        False,
    ),
    (
        "wrong-type",
        [GOOD_REF, "-s", "epoch.max_records=lots"],
        "epoch.max_records must be an integer",
        False,
    ),
    (
        "bad-choice",
        [GOOD_REF, "-s", "restart.strategy=sometimes"],
        "restart.strategy must be one of",
        False,
    ),
    (
        "zero-retained",
        [GOOD_REF, "-s", "checkpoint.retained=0"],
        "checkpoint.retained must be >= 1",
        False,
    ),
    (
        "negative-attempts",
        [GOOD_REF, "-s", "restart.attempts=-1"],
        "restart.attempts must be >= 0",
        False,
    ),
    ("section-as-value", [GOOD_REF, "-s", "spark=3"], "spark must be a mapping", False),
    ("set-without-value", [GOOD_REF, "-s", "nonsense"], "expected KEY=VALUE", False),
    (
        "missing-config-file",
        [GOOD_REF, "-c", "{f}/missing.yaml"],
        "config file {f}/missing.yaml does not exist",
        False,
    ),
    ("invalid-yaml", [GOOD_REF, "-c", "{f}/broken.yaml"], "is not valid YAML", False),
    # restore sources
    (
        "restore-nothing-there",
        [GOOD_REF, "--restore", "file://{t}/nope"],
        "restore.source 'file://{t}/nope' is neither a savepoint",
        False,
    ),
    (
        "restore-not-a-checkpoint",
        [GOOD_REF, "--restore", "file://{f}/ckroot/good-pipe/chk-0000000099"],
        "is neither a savepoint",
        False,
    ),
    (
        "restore-corrupt-metadata",
        [GOOD_REF, "--restore", "file://{f}/sp-corrupt"],
        "savepoint metadata",
        False,
    ),
    (
        "restore-a-file",
        [GOOD_REF, "--restore", "file://{f}/plainfile"],
        "restore.source 'file://{f}/plainfile' is neither a savepoint",
        False,
    ),
    (
        "restore-checkpoint-metadata-file",
        [GOOD_REF, "--restore", "file://{f}/ckroot/good-pipe/chk-0000000001/_metadata"],
        "checkpoint 1 (epoch 4) at file://{f}/ckroot/good-pipe was written with maxParallelism=64",
        False,
    ),
    (
        "restore-savepoint-metadata-file",
        [GOOD_REF, "--restore", "file://{f}/sp-maxp64/_savepoint.json"],
        "savepoint file://{f}/sp-maxp64 (epoch 3) was written with maxParallelism=64",
        False,
    ),
    (
        "restore-metadata-not-an-object",
        [GOOD_REF, "--restore", "file://{f}/sp-array"],
        "savepoint metadata file://{f}/sp-array/_savepoint.json is unusable: the document must "
        "be a JSON object, got an array",
        False,
    ),
    (
        "restore-size-not-a-number",
        [GOOD_REF, "--restore", "file://{f}/sp-bytes-zz"],
        'operators.totals.key_groups.0.bytes must be an integer, got "zz"',
        False,
    ),
    (
        "latest-skips-metadata-of-the-wrong-shape",
        [GOOD_REF, "-s", "checkpoint.storage=file://{f}/ckshape"],
        "checkpoint 1 (epoch 4) at file://{f}/ckshape/good-pipe was written with maxParallelism=64",
        False,
    ),
    (
        "restore-max-parallelism",
        [GOOD_REF, "--restore", "file://{f}/sp-maxp64"],
        "was written with maxParallelism=64",
        False,
    ),
    (
        "restore-dropped-operator",
        [GOOD_REF, "--restore", "file://{f}/sp-gone-operator"],
        "restore.allow_non_restored_state=true",
        False,
    ),
    (
        "restore-missing-file",
        [GOOD_REF, "--restore", "file://{f}/sp-missing-file"],
        "totals/kg-00000.bin is missing",
        False,
    ),
    (
        "restore-truncated-file",
        [GOOD_REF, "--restore", "file://{f}/sp-truncated"],
        "has 5 bytes, its metadata says 10",
        False,
    ),
    (
        "restore-none-over-checkpoints",
        [GOOD_REF, "-s", "checkpoint.storage=file://{f}/ckroot", "--restore", "none"],
        "restore.source=none but job 'good-pipe' has checkpoints",
        False,
    ),
    (
        "latest-checkpoint-incompatible",
        [GOOD_REF, "-s", "checkpoint.storage=file://{f}/ckroot"],
        "checkpoint 1 (epoch 4) at file://{f}/ckroot/good-pipe was written with maxParallelism=64",
        False,
    ),
    (
        "restore-storage-unreachable",
        [
            GOOD_REF,
            "--restore",
            "s3://bucket/sp/savepoint-1",
            "-s",
            "s3.endpoint_url=http://127.0.0.1:{port}",
            "-s",
            "s3.max_attempts=1",
            "-s",
            "s3.connect_timeout_s=1",
        ],
        "restore.source 's3://bucket/sp/savepoint-1' cannot be read",
        False,
    ),
    # a pre-started driver: the hand-over names the restore source, over the control API
    (
        "await-handover-with-restore",
        [GOOD_REF, "--await-handover", "--restore", "latest", "-s", "control.port=0"],
        "--await-handover and --restore exclude each other",
        False,
    ),
    (
        "await-handover-without-control-api",
        [GOOD_REF, "--await-handover"],
        "--await-handover needs the control API to receive the hand-over, but control.port is -1",
        False,
    ),
    # storage
    (
        "storage-scheme",
        [GOOD_REF, "-s", "checkpoint.storage=ftp://x/y"],
        "unsupported storage URI 'ftp://x/y'",
        False,
    ),
    (
        "storage-not-a-directory",
        [GOOD_REF, "-s", "checkpoint.storage=file://{f}/plainfile/ck"],
        "checkpoint.storage file://{f}/plainfile/ck/good-pipe: cannot write",
        False,
    ),
    ("storage-no-bucket", [GOOD_REF, "-s", "checkpoint.storage=s3:///ck"], "has no bucket", False),
    (
        "savepoint-dir-not-a-directory",
        [GOOD_REF, "-s", "savepoint.dir=file://{f}/plainfile/sp"],
        "savepoint.dir file://{f}/plainfile/sp/good-pipe: cannot write",
        False,
    ),
    (
        "storage-unreachable",
        [
            GOOD_REF,
            "-s",
            "checkpoint.storage=s3://bucket/ck",
            "-s",
            "s3.endpoint_url=http://127.0.0.1:{port}",
            "-s",
            "s3.max_attempts=1",
            "-s",
            "s3.connect_timeout_s=1",
        ],
        "S3 endpoint http://127.0.0.1:{port} is unreachable",
        False,
    ),
]


@pytest.mark.parametrize(
    ("args", "message", "traceback"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input_fails_before_spark(
    args: list[str],
    message: str,
    traceback: bool,
    fixtures: Path,
    isolated: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    port = str(free_port())
    fill = {"f": str(fixtures), "t": str(isolated), "port": port}
    argv = [
        "run",
        *(a.format(**fill) for a in args),
        "--set",
        f"state.local_dir={isolated}/state",
    ]
    if not any(a.startswith("checkpoint.storage=") for a in argv):
        argv += ["--set", f"checkpoint.storage=file://{isolated}/ck"]
    if not any(a.startswith("savepoint.dir=") for a in argv):
        argv += ["--set", f"savepoint.dir=file://{isolated}/sp"]
    before = _files(fixtures, isolated)

    code = main(argv)

    err = capsys.readouterr().err
    lines = err.splitlines()
    errors = [line for line in lines if line.startswith("stator: error:")]
    assert code == 2, err
    assert len(errors) == 1, err
    assert message.format(**fill) in errors[0], err
    assert lines[0] == errors[0], err  # nothing before it
    assert ("Traceback (most recent call last)" in err) is traceback, err
    assert "secret-value" not in err
    assert _files(fixtures, isolated) == before, "the refused job wrote files"


def test_enough_cases() -> None:
    assert len(CASES) >= 25 and len({c[0] for c in CASES}) == len(CASES)


def test_the_error_line_is_the_termination_message_in_a_container(
    isolated: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    log = isolated / "termination-log"
    log.write_text("")  # Kubernetes creates it; the CLI only writes where it exists
    monkeypatch.setenv("STATOR_TERMINATION_LOG", str(log))
    assert main(["run", "no.such.module:build"]) == 2
    line = capsys.readouterr().err.splitlines()[0]
    assert log.read_text() == line and "cannot import pipeline module" in line
    monkeypatch.setenv("STATOR_TERMINATION_LOG", str(isolated / "absent"))
    assert main(["run", "no.such.module:build"]) == 2
    assert not (isolated / "absent").exists()
