"""Stored metadata that parses as JSON but has the wrong shape (hand-edited, truncated into
``null``, written by something else) is refused when read, naming the file and the field: it
never crashes the command or the listing that meets it, nor a later check that uses a field."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from stator.checkpoint.metadata import (
    CheckpointMetadata,
    RemoteFile,
    SubtaskSnapshot,
    metadata_key,
)
from stator.errors import CheckpointNotFoundError, UnknownVersionError
from stator.lineage import list_checkpoints, list_savepoints
from stator.savepoint.metadata import OperatorSavepoint, SavepointMetadata
from stator.storage import open_store

KG = {"file": "totals/kg-00000.bin", "bytes": 10, "entries": 1}
CHECKSUM = "xxh3:0123456789abcdef"
STATE = {"kind": "value", "serializer": "pickle", "version": 1}


def _savepoint() -> dict[str, Any]:
    op = OperatorSavepoint("totals", 2, {"sum": STATE}, {0: KG}, 5)
    meta = SavepointMetadata("team.counts", 3, 1_700_000_000_000, 32, {"totals": op}, {}, 0, "z")
    raw: dict[str, Any] = json.loads(meta.to_json())
    return raw


def _checkpoint() -> dict[str, Any]:
    raw: dict[str, Any] = json.loads(
        CheckpointMetadata(1, 4, "counts", 1_700_000_000_000, 32, True, {}, {}, {}, 0).to_json()
    )
    raw["operators"] = {
        "totals": {
            "uid": "totals",
            "parallelism": 1,
            "states": {},
            "subtasks": [
                {
                    "index": 0,
                    "parallelism": 1,
                    "key_groups": [0, 31],
                    "epoch": 4,
                    "files": [
                        {
                            "name": "a.sst",
                            "key": "shared/a.sst",
                            "size": 3,
                            "shared": True,
                            "inline": "",
                            "checksum": CHECKSUM,
                        }
                    ],
                    "incremental_bytes": 3,
                    "commit": "",
                    "operator_state": "",
                }
            ],
        }
    }
    raw["sinks"] = {"out": [{"epoch": 4, "parts": ["p"]}]}
    return raw


def _edit(raw: dict[str, Any], path: str, value: object) -> bytes:
    """``raw`` with the field at dotted ``path`` set to ``value`` ("" replaces it all)."""
    if not path:
        return json.dumps(value).encode()
    *parents, last = path.split(".")
    node: Any = raw
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    node[int(last) if isinstance(node, list) else last] = value
    return json.dumps(raw).encode()


SAVEPOINT_CASES = [
    ("", [], "the document must be a JSON object, got an array"),
    ("", None, "the document must be a JSON object, got null"),
    ("operators", [], "operators must be a JSON object, got an array"),
    ("operators.totals", "x", 'operators.totals must be a JSON object, got "x"'),
    ("created_ms", "x", 'created_ms must be an integer, got "x"'),
    ("created_ms", 1e30, "created_ms must be an integer, got 1e+30"),
    ("created_ms", 10**30, "created_ms is not a time in epoch milliseconds"),
    ("epoch", True, "epoch must be an integer, got true"),
    ("job", 7, "job must be a string, got 7"),
    ("operators.totals.key_groups.0.bytes", "zz", 'key_groups.0.bytes must be an integer, got "z'),
    ("operators.totals.key_groups.0.file", None, "key_groups.0.file must be a string, got null"),
    ("operators.totals.key_groups", {"x": KG}, "'x' is not a key-group number"),
    ("operators.totals.states.sum", [], "states.sum must be a JSON object"),
    ("operators.totals.states.sum.version", "1", "states.sum.version must be an integer"),
    ("sources", {"events": []}, "sources.events must be a JSON object"),
    ("region_epochs", {"r": "3"}, "region_epochs.r must be an integer"),
    ("region_uids", {"r": "events"}, "region_uids.r must be a JSON array"),
    ("operators.totals.commits", {"0": 5}, "commits.0 must be a string, got 5"),
    ("operators.totals.commits", {"2": "ab"}, "'2' is not a subtask below 2"),
    ("operators.totals.commits", {"x": "ab"}, "'x' is not a subtask below 2"),
    ("operators.totals.operator_states", {"2": ""}, "'2' is not a subtask below 2"),
    ("operators.totals.operator_states", {"0": "YW*j"}, "operator_states.0 is not base64"),
    ("operators.totals.operator_states", {"0": "YWJjZGVmZ2g="}, "not a non-keyed state blob"),
]


@pytest.mark.parametrize(("path", "value", "message"), SAVEPOINT_CASES)
def test_savepoint_metadata_of_the_wrong_shape_is_unusable(
    path: str, value: object, message: str
) -> None:
    _assert_unusable(_savepoint(), path, value, message)


def _assert_unusable(raw: dict[str, Any], path: str, value: object, message: str) -> None:
    """``raw`` with ``path`` set to ``value`` is refused, naming the file and ``message``."""
    with pytest.raises(CheckpointNotFoundError) as info:
        SavepointMetadata.from_json(_edit(raw, path, value), "s3://b/sp/_savepoint.json")
    assert "savepoint metadata s3://b/sp/_savepoint.json is unusable" in str(info.value)
    assert message in str(info.value)


CHECKPOINT_CASES = [
    ("", [], "the document must be a JSON object, got an array"),
    ("", None, "the document must be a JSON object, got null"),
    ("operators", [], "operators must be a JSON object, got an array"),
    ("created_ms", "x", 'created_ms must be an integer, got "x"'),
    ("created_ms", 1e30, "created_ms must be an integer"),
    ("incremental", "yes", 'incremental must be true or false, got "yes"'),
    ("operators.totals.subtasks", {}, "subtasks must be a JSON array, got an object"),
    ("operators.totals.subtasks.0.key_groups", [0], "key_groups must be [first, last]"),
    ("operators.totals.subtasks.0.files.0.size", "zz", "files[0].size must be an integer"),
    ("operators.totals.subtasks.0.files.0.size", -1, "files[0].size must be >= 0"),
    ("operators.totals.subtasks.0.files.0", {"name": "a"}, "files[0].key is missing"),
    ("operators.totals.subtasks.0.files.0.name", "..", "is not a database file's name"),
    ("operators.totals.subtasks.0.files.0.name", "a/b.sst", "is not a database file's name"),
    ("sinks.out", {}, "sinks.out must be a JSON array"),
    ("sinks.out.0.parts", 3, "sinks.out[0].parts must be a JSON array"),
    ("operators.totals.subtasks.0.commit", None, "subtasks[0].commit must be a string, got null"),
    ("operators.totals.subtasks.0.files.0.inline", "AAAA", "has both a key and inline bytes"),
    ("operators.totals.subtasks.0.files.0.key", "", "files[0].inline holds 0 bytes, its size is 3"),
    ("operators.totals.subtasks.0.files.0.checksum", "", "files[0].checksum '' is not an xxh3"),
    ("format_version", "3", 'format_version must be an integer, got "3"'),
    ("operators.totals.subtasks.0.operator_state", 5, "operator_state must be a string, got 5"),
    ("operators.totals.subtasks.0.operator_state", "U1RPUwE=AA", "is not base64"),
    ("operators.totals.subtasks.0.operator_state", "U1RPUwEAAAA=", "is truncated"),
]

# Every field of the one version is required (none is read a second way, nor defaulted).
CHECKPOINT_FIELDS = [
    ("", "lineage"),
    ("", "duration_ms"),
    ("", "format_version"),
    ("operators.totals", "states"),
    ("operators.totals.subtasks.0", "incremental_bytes"),
    ("operators.totals.subtasks.0", "commit"),
    ("operators.totals.subtasks.0", "operator_state"),
    ("operators.totals.subtasks.0.files.0", "inline"),
    ("operators.totals.subtasks.0.files.0", "checksum"),
]


@pytest.mark.parametrize(("path", "value", "message"), CHECKPOINT_CASES)
def test_checkpoint_metadata_of_the_wrong_shape_is_corrupt(
    path: str, value: object, message: str
) -> None:
    with pytest.raises(CheckpointNotFoundError) as info:
        CheckpointMetadata.from_json(_edit(_checkpoint(), path, value), "file:///ck/_metadata")
    assert "checkpoint metadata file:///ck/_metadata is corrupt" in str(info.value)
    assert message in str(info.value)


@pytest.mark.parametrize(("parent", "key"), CHECKPOINT_FIELDS)
def test_checkpoint_metadata_without_a_field_is_corrupt(parent: str, key: str) -> None:
    raw = _checkpoint()
    node: Any = raw
    for part in parent.split(".") if parent else []:
        node = node[int(part)] if isinstance(node, list) else node[part]
    del node[key]
    with pytest.raises(CheckpointNotFoundError, match=f"{key} is missing"):
        CheckpointMetadata.from_json(json.dumps(raw).encode(), "file:///ck/_metadata")


@pytest.mark.parametrize("version", [1, 2, 4, 0])
def test_checkpoint_metadata_of_another_version_is_refused_by_its_version(version: int) -> None:
    raw = _checkpoint()
    assert raw["format_version"] == 3
    raw["format_version"] = version
    with pytest.raises(UnknownVersionError) as info:
        CheckpointMetadata.from_json(json.dumps(raw).encode(), "file:///ck/_metadata")
    assert info.value.version == version
    assert str(info.value).startswith(
        f"checkpoint metadata file:///ck/_metadata has format version {version}, "
        "this Stator reads version 3 only: restore it with the Stator version that wrote it"
    )


def test_well_formed_metadata_still_reads() -> None:
    sp = SavepointMetadata.from_json(json.dumps(_savepoint()).encode())
    assert sp.operators["totals"].key_groups == {0: KG} and sp.state_bytes == 10
    assert SavepointMetadata.from_json(sp.to_json()) == sp
    ck = CheckpointMetadata.from_json(json.dumps(_checkpoint()).encode())
    assert ck.state_bytes == 3 and ck.sinks["out"][0].parts == ("p",)
    assert ck.incremental_bytes == 3 and ck.files()[0].checksum == CHECKSUM
    assert CheckpointMetadata.from_json(ck.to_json()) == ck


def test_restore_sources_name_the_commit_each_subtask_must_be() -> None:
    """Local state is kept only if it is the commit the restore source was taken from
    (``locality/restore.py``, step 1): for the subtasks of an operator at the parallelism
    the source was taken at; a subtask whose commit is empty names none."""
    from stator.lineage import Target

    store = open_store("file:///tmp/unused-commits")
    raw = _checkpoint()
    raw["operators"]["totals"]["subtasks"][0]["commit"] = "c0"
    ck = CheckpointMetadata.from_json(json.dumps(raw).encode())
    assert Target(ck, store).commits({"totals": 1}) == {("totals", 0): "c0"}
    assert Target(ck, store).commits({"totals": 2}) == {}  # rescaled: other directories
    assert (
        Target(CheckpointMetadata.from_json(json.dumps(_checkpoint()).encode()), store).commits(
            {"totals": 1}
        )
        == {}
    )
    sp = _savepoint()
    sp["operators"]["totals"]["commits"] = {"0": "s0", "1": ""}
    meta = SavepointMetadata.from_json(json.dumps(sp).encode())
    assert meta.operators["totals"].commits == {0: "s0", 1: ""}
    assert SavepointMetadata.from_json(meta.to_json()) == meta
    assert Target(meta, store).commits({"totals": 2}) == {("totals", 0): "s0"}
    assert Target(meta, store).commits({"totals": 3}) == {}
    none = SavepointMetadata.from_json(json.dumps(_savepoint()).encode())
    assert none.operators["totals"].commits == {}
    assert Target(none, store).commits({"totals": 2}) == {}


def test_listings_report_a_wrong_shape_and_go_on(tmp_path: Path) -> None:
    sp_root = f"file://{tmp_path}/sp"
    open_store(f"{sp_root}/good").put("_savepoint.json", json.dumps(_savepoint()).encode())
    open_store(f"{sp_root}/list").put("_savepoint.json", b"[]")
    open_store(f"{sp_root}/null").put("_savepoint.json", b"null")
    entries = {e.location.rpartition("/")[2]: e for e in list_savepoints(sp_root)}
    assert entries["good"].metadata is not None
    assert entries["list"].metadata is None and "unusable" in (entries["list"].error or "")
    assert entries["null"].metadata is None and "got null" in (entries["null"].error or "")

    ck = open_store(f"file://{tmp_path}/ck")
    ck.put(metadata_key(1), json.dumps(_checkpoint()).encode())
    ck.put(metadata_key(2), _edit(_checkpoint(), "operators", []))
    listed = list_checkpoints(ck.uri)
    assert [e.id for e in listed] == [1, 2] and listed[0].metadata is not None
    assert "operators must be a JSON object" in (listed[1].problem or "")


def _native() -> dict[str, Any]:
    """A native savepoint: each subtask's database files, as a checkpoint names them."""
    parts = tuple(
        SubtaskSnapshot(
            i,
            2,
            (16 * i, 16 * i + 16),
            3,
            (RemoteFile("1.sst", f"totals/{i}/t/1.sst", 7, False, checksum=CHECKSUM),),
        )
        for i in range(2)
    )
    op = OperatorSavepoint("totals", 2, {"sum": STATE}, {}, 5, parts)
    meta = SavepointMetadata(
        "team.counts", 3, 1_700_000_000_000, 32, {"totals": op}, {}, 0, "rocksdb"
    )
    raw: dict[str, Any] = json.loads(replace(meta, format_type="native").to_json())
    return raw


NATIVE_CASES = [
    ("format_type", "sst", "format_type 'sst' is not one of ('canonical', 'native')"),
    ("operators.totals.subtasks", {}, "subtasks must be a JSON array, got an object"),
    ("operators.totals.subtasks.0.files.0.size", -1, "files[0].size must be >= 0"),
    ("operators.totals.subtasks.1.index", 0, "subtasks must hold subtasks 0..1"),
    ("operators.totals.parallelism", 3, "subtasks must hold subtasks 0..2"),
    ("operators.totals.subtasks.1.parallelism", 3, "subtasks must all have parallelism 2"),
    ("operators.totals.subtasks.1.key_groups", [17, 32], "do not cover [0, 32) once"),
    ("operators.totals.subtasks.1.key_groups", [16, 31], "do not cover [0, 32) once"),
    ("operators.totals.subtasks.0.files.0.name", "../../x", "is not a database file's name"),
    ("operators.totals.subtasks.0.files.0.name", "/etc/x", "is not a database file's name"),
]


@pytest.mark.parametrize(("path", "value", "message"), NATIVE_CASES)
def test_native_savepoint_metadata_of_the_wrong_shape_is_unusable(
    path: str, value: object, message: str
) -> None:
    _assert_unusable(_native(), path, value, message)


def test_native_savepoints_read_back_and_restore_as_checkpoints_do() -> None:
    """Same parallelism: each subtask downloads its own files; another: the overlapping
    databases are rescaled. A canonical savepoint is unchanged."""
    from stator.driver.restore import restore_task
    from stator.lineage import Target

    meta = SavepointMetadata.from_json(json.dumps(_native()).encode())
    assert meta.native and meta.state_bytes == 14
    assert SavepointMetadata.from_json(meta.to_json()) == meta
    store = open_store("file:///tmp/unused-native-savepoint")
    same = restore_task(Target(meta, store), {"totals": 2})
    assert same.savepoint is meta and same.checkpoint_id == 0 and not same.local_copies
    assert sorted(same.snapshots) == [("totals", 0), ("totals", 1)] and not same.rescale
    other = restore_task(Target(meta, store), {"totals": 3})
    assert not other.snapshots and [s.index for s in other.rescale["totals"]] == [0, 1]
    raw = _savepoint()
    assert (raw["format_type"], raw["format_version"]) == ("canonical", 3)
    canonical = SavepointMetadata.from_json(json.dumps(raw).encode())
    assert not canonical.native
    task = restore_task(Target(canonical, store), {"totals": 3})
    assert task.savepoint is canonical and not task.snapshots and not task.rescale


# Every field of the one version is required, of either format type.
SAVEPOINT_FIELDS = [
    "format_type",
    "region_epochs",
    "region_uids",
    "duration_ms",
    "operators.totals.commits",
    "operators.totals.operator_states",
    "operators.totals.key_groups.0.entries",
]


@pytest.mark.parametrize("path", SAVEPOINT_FIELDS)
def test_savepoint_metadata_without_a_field_is_unusable(path: str) -> None:
    raw = _savepoint()
    *parents, key = path.split(".")
    node: Any = raw
    for part in parents:
        node = node[part]
    del node[key]
    _assert_unusable(raw, "", raw, f"{key} is missing")


@pytest.mark.parametrize(("version", "make"), [(2, _savepoint), (2, _native), (4, _native)])
def test_a_savepoint_of_another_version_is_refused_by_its_version(version: int, make: Any) -> None:
    raw = make()
    assert raw["format_version"] == 3
    raw["format_version"] = version
    with pytest.raises(UnknownVersionError) as info:
        SavepointMetadata.from_json(json.dumps(raw).encode(), "s3://b/sp/_savepoint.json")
    assert info.value.version == version
    assert str(info.value).startswith(
        f"savepoint metadata s3://b/sp/_savepoint.json has format version {version}, "
        "this Stator reads version 3 only: restore it with the Stator version that wrote it"
    )


def test_files_of_attempts_the_driver_did_not_keep_are_strays() -> None:
    from stator.savepoint.native import stray_files

    meta = SavepointMetadata.from_json(json.dumps(_native()).encode())
    listing = [
        ("_savepoint.json", 1),
        ("totals/0/t/1.sst", 7),
        ("totals/0/retried/1.sst", 7),  # an earlier attempt of subtask 0
        ("totals/1/t/1.sst", 7),
        ("other/kg-00001.bin", 3),  # not an operator of this savepoint: left alone
    ]
    assert stray_files(meta, listing) == ["totals/0/retried/1.sst"]


@pytest.mark.parametrize(
    ("inline", "shared", "message"),
    [
        ("YWJj", True, "an inline file cannot be shared"),
        ("YW*j", False, "files[0].inline is not base64"),
        ("YWJjZA==", False, "files[0].inline holds 4 bytes, its size is 3"),
    ],
)
def test_inline_files_are_checked_when_read(inline: str, shared: bool, message: str) -> None:
    raw = _checkpoint()
    f = raw["operators"]["totals"]["subtasks"][0]["files"][0]
    f.update(key="", inline=inline, shared=shared, checksum="")
    with pytest.raises(CheckpointNotFoundError, match=re.escape(message)):
        CheckpointMetadata.from_json(json.dumps(raw).encode(), "file:///ck/_metadata")
    f.update(inline="YWJj", shared=False)  # "abc": 3 bytes, as its size says
    meta = CheckpointMetadata.from_json(json.dumps(raw).encode())
    assert meta.files() == [] and meta.state_bytes == 3  # no object, but part of the state
    f["checksum"] = CHECKSUM  # the metadata holds its bytes: nothing to check them against
    with pytest.raises(CheckpointNotFoundError, match="is inline and has a checksum"):
        CheckpointMetadata.from_json(json.dumps(raw).encode(), "file:///ck/_metadata")
