"""``stator savepoint`` / ``checkpoints`` / ``job`` given wrong paths, stored metadata of the
wrong shape and wrong arguments: one ``stator: error:`` line (or argparse's, naming the flag),
never a traceback; a listing reports an unusable entry and goes on; nothing stored changes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stator.checkpoint.metadata import CheckpointMetadata, metadata_key
from stator.cli.main import main
from stator.storage import open_store
from tests.unit.savepoints import write_savepoint


@pytest.fixture
def stored(tmp_path: Path) -> Path:
    write_savepoint(f"file://{tmp_path}/sp/good", epoch=3)
    good = json.loads((tmp_path / "sp/good/_savepoint.json").read_text())
    created = json.dumps(good | {"created_ms": 1e30})  # no date can be made of it
    for name, text in {"array": "[]", "null": "null", "created": created}.items():
        open_store(f"file://{tmp_path}/sp/{name}").put("_savepoint.json", text.encode())
    chk = CheckpointMetadata(1, 4, "counts", 1_700_000_000_000, 64, True, {}, {}, {}, 0)
    store = open_store(f"file://{tmp_path}/ck/counts")
    store.put(metadata_key(1), chk.to_json())
    store.put(metadata_key(2), json.dumps(json.loads(chk.to_json()) | {"operators": []}).encode())
    store.put(metadata_key(3), json.dumps(json.loads(chk.to_json()) | {"created_ms": "x"}).encode())
    (tmp_path / "plain").write_text("a file")
    return tmp_path


def _files(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    (line,) = err.splitlines()
    assert line.startswith("stator: error: ")
    return line


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["savepoint", "show", "{t}/plain"], "{t}/plain is not a savepoint"),
        (["savepoint", "show", "{t}/sp/array"], "the document must be a JSON object, got an array"),
        (["savepoint", "show", "{t}/sp/created"], "created_ms must be an integer, got 1e+30"),
        (["savepoint", "dispose", "{t}/plain"], "cannot list file://{t}/plain: it is a file"),
        (["savepoint", "list", "{t}/plain"], "cannot list file://{t}/plain: it is a file"),
        (["checkpoints", "list", "{t}/plain"], "cannot list file://{t}/plain: it is a file"),
        (["checkpoints", "show", "{t}/plain"], "{t}/plain/_metadata: it does not exist"),
        (["checkpoints", "show", "{t}/ck/counts/chk-0000000002"], "operators must be a JSON"),
        (["checkpoints", "show", "{t}/ck/counts/chk-0000000003"], "created_ms must be an integer"),
        (["job", "http://[::1"], "'http://[::1' is not a valid control API URL"),
    ],
)
def test_wrong_paths_and_stored_metadata_are_one_error_line(
    argv: list[str], message: str, stored: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _files(stored)
    line = _error([a.format(t=stored) for a in argv], capsys)
    assert message.format(t=stored) in line
    assert _files(stored) == before


def test_a_metadata_files_path_names_its_directory(
    stored: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["savepoint", "show", f"{stored}/sp/good/_savepoint.json"]) == 0
    assert json.loads(capsys.readouterr().out)["location"] == f"{stored}/sp/good"
    assert main(["checkpoints", "show", f"{stored}/ck/counts/chk-0000000001/_metadata/"]) == 0
    assert capsys.readouterr().out.startswith("id=1  status=completed")
    open_store(f"file://{stored}/sp/gone").put("_savepoint.json", b"{}")
    assert main(["savepoint", "dispose", f"{stored}/sp/gone/_savepoint.json", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["disposed"] == f"{stored}/sp/gone"
    assert not (stored / "sp/gone/_savepoint.json").exists()


def test_listings_report_unusable_entries_and_go_on(
    stored: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["savepoint", "list", f"{stored}/sp", "--json"]) == 0
    rows = {r["location"].rpartition("/")[2]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["good"]["epoch"] == 3
    assert "got an array" in rows["array"]["error"]
    assert "got null" in rows["null"]["error"]
    assert "created_ms must be an integer" in rows["created"]["error"]

    assert main(["checkpoints", "list", f"{stored}/ck/counts", "--json"]) == 0
    status = {r["id"]: r["status"] for r in json.loads(capsys.readouterr().out)}
    assert status[1] == "completed"
    assert "operators must be a JSON object" in status[2]
    assert "created_ms must be an integer" in status[3]


@pytest.mark.parametrize("wait", ["-5", "nan", "soon"])
def test_a_negative_wait_is_refused_naming_the_flag(
    wait: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["savepoint", "trigger", "http://127.0.0.1:1", "--wait", wait])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --wait: " in err and repr(wait) in err and "Traceback" not in err
