"""``stator savepoint trigger|list|show|dispose``."""

from __future__ import annotations

import argparse
import json
import time
import urllib.error
import urllib.request
from typing import Any

from ..errors import StatorError
from ..storage import open_store
from .metadata import METADATA_NAME, SavepointMetadata


def savepoint_command(args: argparse.Namespace) -> int:
    if args.action == "trigger":
        return _trigger(args)
    if args.action == "list":
        return _list(args)
    if args.action == "show":
        meta = _load(args.uri)
        info = _summary(args.uri, meta)
        info["operators"] = {
            uid: {
                "parallelism": op.parallelism,
                "states": op.states,
                "key_groups": len(op.key_groups),
                "state_bytes": op.state_bytes,
            }
            for uid, op in meta.operators.items()
        }
        info["sources"] = meta.sources
        print(json.dumps(info, indent=2))
        return 0
    return _dispose(args)


def _load(uri: str) -> SavepointMetadata:
    store = open_store(uri.rstrip("/"))
    if not store.exists(METADATA_NAME):
        raise StatorError(f"{uri} is not a savepoint: it has no {METADATA_NAME}")
    return SavepointMetadata.from_json(store.get(METADATA_NAME), store.url(METADATA_NAME))


def _summary(uri: str, meta: SavepointMetadata) -> dict[str, Any]:
    return {
        "location": uri.rstrip("/"),
        "job": meta.job,
        "epoch": meta.epoch,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(meta.created_ms / 1000)),
        "state_bytes": meta.state_bytes,
        "max_parallelism": meta.max_parallelism,
        "operators": sorted(meta.operators),
        "compression": meta.compression,
    }


def _list(args: argparse.Namespace) -> int:
    store = open_store(args.uri.rstrip("/"))
    rows = []
    for key, _ in store.listing():
        if key.endswith("/" + METADATA_NAME) or key == METADATA_NAME:
            location = store.url(key[: -len(METADATA_NAME)].rstrip("/"))
            try:
                rows.append(_summary(location, SavepointMetadata.from_json(store.get(key))))
            except StatorError as exc:
                rows.append({"location": location, "error": str(exc)})
    rows.sort(key=lambda r: (r.get("job", ""), r.get("epoch", 0)))
    if args.json:
        print(json.dumps(rows, indent=2))
    elif not rows:
        print(f"no savepoints under {store.uri}")
    else:
        for r in rows:
            print("  ".join(f"{k}={v}" for k, v in r.items()))
    return 0


def _dispose(args: argparse.Namespace) -> int:
    """Delete every file of one savepoint: refuses anything that is not a savepoint."""
    _load(args.uri)  # raises unless it is a savepoint
    store = open_store(args.uri.rstrip("/"))
    keys = [k for k, _ in store.listing()]
    # Metadata first: a half-deleted savepoint is no longer mistaken for a whole one.
    store.delete([METADATA_NAME])
    store.delete([k for k in keys if k != METADATA_NAME])
    print(json.dumps({"disposed": args.uri.rstrip("/"), "files": len(keys)}))
    return 0


def _trigger(args: argparse.Namespace) -> int:
    base = args.url.rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise StatorError(f"{args.url!r}: the control API URL must start with http:// or https://")
    body: dict[str, Any] = {"stop": bool(args.stop)}
    if args.target:
        body["target"] = args.target
    created = _http(base + "/v1/savepoints", body)
    deadline = time.monotonic() + args.wait
    result = created
    while args.wait and result["status"] in ("PENDING", "IN_PROGRESS"):
        if time.monotonic() > deadline:
            raise StatorError(
                f"savepoint {created['id']} still {result['status']} after "
                f"{args.wait:.0f}s; poll {base}/v1/savepoints/{created['id']}"
            )
        time.sleep(0.5)
        result = _http(f"{base}/v1/savepoints/{created['id']}")
    print(json.dumps(result, indent=2 if not args.json else None))
    return 0 if result["status"] in ("COMPLETED", "PENDING", "IN_PROGRESS") else 1


def _http(url: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(  # noqa: S310 - scheme checked in _trigger
        url,
        data=data,
        method="POST" if body is not None else "GET",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 - operator-given URL
            result: dict[str, Any] = json.loads(resp.read())
            return result
    except urllib.error.HTTPError as err:
        detail = err.read().decode(errors="replace")
        raise StatorError(f"{url}: HTTP {err.code}: {detail}") from err
    except urllib.error.URLError as err:
        raise StatorError(f"cannot reach the driver's control API at {url}: {err.reason}") from err
