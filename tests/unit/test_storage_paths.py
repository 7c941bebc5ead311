"""Stores given paths that are wrong: a file where a directory belongs, a directory where a file
belongs, one that cannot be read. Each is a StorageError naming the path, never an OSError;
and a listing covers its own directory only, never a sibling whose name starts the same."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from stator.errors import StorageError
from stator.storage import S3Store, open_store


def test_a_file_where_a_directory_belongs(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("a file")
    store = open_store(f"file://{tmp_path}/plain")
    with pytest.raises(StorageError, match=r"plain/_metadata: it does not exist \(a path above"):
        store.get("_metadata")
    with pytest.raises(StorageError, match="plain/_metadata: it does not exist"):
        store.get_file("_metadata", tmp_path / "copy")
    assert store.size("_savepoint.json") is None, "no such object, as S3 would say"
    assert not store.exists("_savepoint.json")
    with pytest.raises(StorageError, match=f"cannot list file://{tmp_path}/plain: it is a file"):
        store.listing()
    store.delete(["_metadata"])  # nothing there: nothing to do


def test_a_directory_where_a_file_belongs(tmp_path: Path) -> None:
    (tmp_path / "chk-1" / "_metadata").mkdir(parents=True)
    store = open_store(f"file://{tmp_path}")
    with pytest.raises(StorageError, match="chk-1/_metadata: it is a directory, not a file"):
        store.get("chk-1/_metadata")
    with pytest.raises(StorageError, match="chk-1/_metadata: it is a directory, not a file"):
        store.get_file("chk-1/_metadata", tmp_path / "copy")
    assert store.size("chk-1/_metadata") is None


def test_unreadable_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Faked: the tests run as root, which no file mode stops."""
    store = open_store(f"file://{tmp_path}")
    store.put("sp/_savepoint.json", b"{}")
    store.put("sp/locked/kg-1.bin", b"x")

    def refuse(*_: Any) -> Any:
        raise PermissionError(13, "Permission denied", str(tmp_path / "sp/_savepoint.json"))

    with monkeypatch.context() as patch:
        patch.setattr(Path, "read_bytes", refuse)
        with pytest.raises(StorageError, match=r"sp/_savepoint\.json: permission denied"):
            store.get("sp/_savepoint.json")
    with monkeypatch.context() as patch:
        patch.setattr(Path, "stat", refuse)
        with pytest.raises(StorageError, match=r"cannot inspect .*sp/x: permission denied"):
            store.size("sp/x")

    real_scandir = os.scandir
    locked = str(tmp_path / "sp" / "locked")

    def scandir(path: Any = ".") -> Iterator[os.DirEntry[str]]:
        if str(path) == locked:
            raise PermissionError(13, "Permission denied", locked)
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(StorageError, match=r"cannot list .*sp/locked: permission denied"):
        store.listing()  # leaving its files out unseen could make a listing lie


def test_file_listing_stays_in_its_directory(tmp_path: Path) -> None:
    open_store(f"file://{tmp_path}/sp").put("a/_savepoint.json", b"{}")
    open_store(f"file://{tmp_path}/sp-old").put("b/_savepoint.json", b"{}")
    assert open_store(f"file://{tmp_path}/sp").listing() == [("a/_savepoint.json", 2)]


def _stubbed(uri: str) -> tuple[S3Store, Stubber]:
    store = S3Store(uri)
    store._client = boto3.session.Session().client(
        "s3", region_name="us-east-1", aws_access_key_id="a", aws_secret_access_key="b"
    )
    return store, Stubber(store._client)


@pytest.mark.parametrize(
    ("uri", "prefix", "sent"),
    [
        ("s3://b/sp", "", "sp/"),
        ("s3://b/sp/", "", "sp/"),
        ("s3://b/jobs/count", "", "jobs/count/"),
        ("s3://b/jobs/count", "chk-0000000001/", "jobs/count/chk-0000000001/"),
        ("s3://b", "", ""),
        ("s3://b/", "regions/", "regions/"),
    ],
)
def test_s3_listing_asks_for_the_stores_directory_only(uri: str, prefix: str, sent: str) -> None:
    """What S3 is asked for (no server: a stubbed client): the store's prefix and a "/", so
    ``s3://b/sp`` never lists ``sp-old/`` and a job ``count`` never sees ``count2``'s files."""
    store, stub = _stubbed(uri)
    key = f"{sent}x/_metadata"
    stub.add_response(
        "list_objects_v2",
        {"Contents": [{"Key": key, "Size": 3}], "IsTruncated": False},
        {"Bucket": "b", "Prefix": sent},
    )
    with stub:
        listed = store.listing(prefix)
    stub.assert_no_pending_responses()
    assert listed == [(key[len(store.prefix) + 1 if store.prefix else 0 :], 3)]
    assert listed[0][0].startswith(prefix)
