"""The test bed's S3 server is a real one: objects, listings, deletes and multipart uploads."""

from __future__ import annotations

import hashlib
import os

import pytest
from botocore.exceptions import ClientError

from stator.storage import S3Options, open_store
from tests.testbed.minio import S3Endpoint

PART = 5 * 1024 * 1024  # S3's minimum size for every part but the last


def test_put_get_list_delete(s3: S3Endpoint, bucket: str) -> None:
    client = s3.client()
    for i in range(3):
        client.put_object(Bucket=bucket, Key=f"dir/obj-{i}", Body=f"value-{i}".encode())
    client.put_object(Bucket=bucket, Key="other/x", Body=b"x")

    assert client.get_object(Bucket=bucket, Key="dir/obj-1")["Body"].read() == b"value-1"
    listed = client.list_objects_v2(Bucket=bucket, Prefix="dir/")
    assert [o["Key"] for o in listed["Contents"]] == ["dir/obj-0", "dir/obj-1", "dir/obj-2"]

    client.delete_object(Bucket=bucket, Key="dir/obj-1")
    listed = client.list_objects_v2(Bucket=bucket, Prefix="dir/")
    assert [o["Key"] for o in listed["Contents"]] == ["dir/obj-0", "dir/obj-2"]
    with pytest.raises(ClientError) as err:
        client.get_object(Bucket=bucket, Key="dir/obj-1")
    assert err.value.response["Error"]["Code"] == "NoSuchKey"


def test_multipart_upload(s3: S3Endpoint, bucket: str) -> None:
    client = s3.client()
    parts_data = [os.urandom(PART), os.urandom(PART), os.urandom(1234)]
    upload = client.create_multipart_upload(Bucket=bucket, Key="big")
    parts = []
    for number, data in enumerate(parts_data, start=1):
        resp = client.upload_part(
            Bucket=bucket, Key="big", UploadId=upload["UploadId"], PartNumber=number, Body=data
        )
        parts.append({"PartNumber": number, "ETag": resp["ETag"]})
    client.complete_multipart_upload(
        Bucket=bucket, Key="big", UploadId=upload["UploadId"], MultipartUpload={"Parts": parts}
    )

    body = client.get_object(Bucket=bucket, Key="big")["Body"].read()
    assert len(body) == 2 * PART + 1234
    assert hashlib.sha256(body).digest() == hashlib.sha256(b"".join(parts_data)).digest()
    head = client.head_object(Bucket=bucket, Key="big")
    assert head["ETag"].strip('"').endswith("-3"), "a multipart object's ETag counts its parts"


def test_wrong_credentials_are_refused(s3: S3Endpoint, bucket: str) -> None:
    wrong = S3Endpoint(s3.endpoint_url, s3.access_key, "not-the-secret", s3.region)
    with pytest.raises(ClientError) as err:
        wrong.client().list_objects_v2(Bucket=bucket)
    assert err.value.response["Error"]["Code"] == "SignatureDoesNotMatch"


def test_a_store_lists_its_own_prefix_only(s3: S3Endpoint, bucket: str) -> None:
    """``s3://b/sp`` never lists ``sp-old/``, and a job ``count`` never sees ``count2``'s
    checkpoints: a sibling whose name starts the same is another directory."""
    options = S3Options(
        endpoint_url=s3.endpoint_url, access_key_id=s3.access_key, secret_access_key=s3.secret_key
    )
    for prefix in ("sp", "sp-old", "ck/count", "ck/count2"):
        open_store(f"s3://{bucket}/{prefix}", options).put("chk-0000000001/_metadata", b"{}")
    assert open_store(f"s3://{bucket}/sp", options).listing() == [("chk-0000000001/_metadata", 2)]
    count = open_store(f"s3://{bucket}/ck/count/", options)
    assert count.listing() == [("chk-0000000001/_metadata", 2)]
    assert count.listing("chk-0000000001/") == [("chk-0000000001/_metadata", 2)]
    everything = open_store(f"s3://{bucket}", options).listing()
    assert [k for k, _ in everything] == [
        "ck/count/chk-0000000001/_metadata",
        "ck/count2/chk-0000000001/_metadata",
        "sp-old/chk-0000000001/_metadata",
        "sp/chk-0000000001/_metadata",
    ]
