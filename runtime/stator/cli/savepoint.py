"""``stator savepoint trigger|list|show|dispose``."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from ..control.client import ControlClient
from ..control.schema import SavepointRequest
from ..control.token import read_token
from ..errors import StatorError
from ..lineage import dispose_savepoint, list_savepoints, load_savepoint, snapshot_dir
from ..savepoint.metadata import SavepointMetadata


def savepoint_command(args: argparse.Namespace) -> int:
    if args.action == "trigger":
        return _trigger(args)
    if args.action == "list":
        return _list(args)
    if args.action == "show":
        location = snapshot_dir(args.uri)
        meta = load_savepoint(location)
        info = _summary(location, meta)
        info["operators"] = {
            uid: {
                "parallelism": op.parallelism,
                "states": op.states,
                # canonical: the non-empty key-groups; native: the ranges its databases hold
                "key_groups": len(op.key_groups)
                or sum(s.key_groups[1] - s.key_groups[0] for s in op.subtasks),
                "state_bytes": op.state_bytes,
            }
            for uid, op in meta.operators.items()
        }
        info["sources"] = meta.sources
        print(json.dumps(info, indent=2))
        return 0
    location = snapshot_dir(args.uri)
    files = dispose_savepoint(location)
    print(json.dumps({"disposed": location, "files": files}))
    return 0


def _summary(uri: str, meta: SavepointMetadata) -> dict[str, Any]:
    return {
        "location": uri.rstrip("/"),
        "job": meta.job,
        "epoch": meta.epoch,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(meta.created_ms / 1000)),
        "state_bytes": meta.state_bytes,
        "max_parallelism": meta.max_parallelism,
        "operators": sorted(meta.operators),
        "format_type": meta.format_type,
        "compression": meta.compression,
    }


def _list(args: argparse.Namespace) -> int:
    rows = [
        _summary(e.location, e.metadata)
        if e.metadata
        else {"location": e.location, "error": e.error}
        for e in list_savepoints(args.uri)
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
    elif not rows:
        print(f"no savepoints under {args.uri.rstrip('/')}")
    else:
        for r in rows:
            print("  ".join(f"{k}={v}" for k, v in r.items()))
    return 0


def _trigger(args: argparse.Namespace) -> int:
    driver = ControlClient(args.url, timeout=30, token=read_token(args.token_file))
    created = driver.trigger_savepoint(
        stop=bool(args.stop), target=args.target or None, format_type=args.type
    )
    deadline = time.monotonic() + args.wait
    result: SavepointRequest = created
    while args.wait and result.status in ("PENDING", "IN_PROGRESS"):
        if time.monotonic() > deadline:
            raise StatorError(
                f"savepoint {created.id} still {result.status} after "
                f"{args.wait:.0f}s; poll {driver.base_url}/v1/savepoints/{created.id}"
            )
        time.sleep(0.5)
        result = driver.savepoint(created.id)
    print(json.dumps(result.to_wire(), indent=2 if not args.json else None))
    return 0 if result.status in ("COMPLETED", "PENDING", "IN_PROGRESS") else 1
