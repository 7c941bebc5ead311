"""The ``stator`` command line."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from dataclasses import replace
from typing import Any

from ..errors import ConfigError, StatorError, report_error
from ..savepoint.metadata import FORMAT_TYPES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stator", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a pipeline")
    run.add_argument(
        "pipeline",
        help="MODULE:FUNCTION, path/to/file.py:FUNCTION or path/to/package:FUNCTION",
    )
    run.add_argument("--config", "-c", help="YAML config file")
    run.add_argument(
        "--set",
        "-s",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. checkpoint.retained=5 (repeatable)",
    )
    run.add_argument("--restore", help="latest (default), none, or a checkpoint directory URI")
    run.add_argument(
        "--await-handover",
        action="store_true",
        help="start, then wait until POST /v1/handover on the control API names the savepoint "
        "or checkpoint to restore from (the operator pre-starts upgrades' drivers this way)",
    )
    run.add_argument(
        "--start-executors",
        action="store_true",
        help="with --await-handover and executors as pods: start them before the hand-over "
        "(they are a set of their own, not the running driver's; a rescale's)",
    )

    job = sub.add_parser("job", help="a running job's state and its failover regions")
    job.add_argument("url", help="the driver's control API, e.g. http://driver:8081")
    job.add_argument(
        "--token-file",
        default=os.environ.get("STATOR_CONTROL_TOKEN_FILE"),
        help="file with the control API's bearer token (default: $STATOR_CONTROL_TOKEN_FILE)",
    )
    job.add_argument("--json", action="store_true", help="the whole GET /v1/job answer")

    ck = sub.add_parser("checkpoints", help="inspect checkpoints")
    ck_sub = ck.add_subparsers(dest="action", required=True)
    ck_list = ck_sub.add_parser("list", help="checkpoints of a job: URI is its checkpoint root")
    ck_list.add_argument("uri")
    ck_show = ck_sub.add_parser("show", help="one checkpoint: URI is its chk-N directory")
    ck_show.add_argument("uri")
    for p in (ck_list, ck_show):
        p.add_argument("--json", action="store_true", help="machine-readable output")

    sp = sub.add_parser("savepoint", help="trigger, list, show and dispose savepoints")
    sp_sub = sp.add_subparsers(dest="action", required=True)
    sp_trigger = sp_sub.add_parser("trigger", help="ask a running job's driver for a savepoint")
    sp_trigger.add_argument("url", help="the driver's control API, e.g. http://driver:8081")
    sp_trigger.add_argument("--stop", action="store_true", help="stop the job after it")
    sp_trigger.add_argument(
        "--token-file",
        default=os.environ.get("STATOR_CONTROL_TOKEN_FILE"),
        help="file with the control API's bearer token (default: $STATOR_CONTROL_TOKEN_FILE; "
        "in Kubernetes, key 'token' of the Secret NAME-control)",
    )
    sp_trigger.add_argument("--target", help="savepoint directory URI (default: savepoint.dir)")
    sp_trigger.add_argument(
        "--type",
        choices=FORMAT_TYPES,
        help="canonical (any parallelism, readable by state_reader) or native (the databases' "
        "files: faster for large state; docs/savepoints.md). Default: savepoint.format_type",
    )
    sp_trigger.add_argument(
        "--wait", type=_seconds, default=600, help="seconds to wait for the result (0: do not wait)"
    )
    sp_list = sp_sub.add_parser("list", help="savepoints under a directory (e.g. savepoint.dir)")
    sp_list.add_argument("uri")
    sp_show = sp_sub.add_parser("show", help="one savepoint's metadata")
    sp_show.add_argument("uri")
    sp_dispose = sp_sub.add_parser("dispose", help="delete a savepoint (all its files)")
    sp_dispose.add_argument("uri")
    for p in (sp_trigger, sp_list, sp_show, sp_dispose):
        p.add_argument("--json", action="store_true", help="machine-readable output")

    from .console import add_parser as add_console  # noqa: PLC0415

    add_console(sub)

    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # py4j says at exit that it closes its connection: after the result, noise.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "job":
            return _job(args)
        if args.command == "console":
            from .console import console_command  # noqa: PLC0415

            return console_command(args)
        if args.command == "savepoint":
            from .savepoint import savepoint_command  # noqa: PLC0415

            return savepoint_command(args)
        return _checkpoints(args)
    except StatorError as exc:
        report_error(exc)
        return 2


def _seconds(text: str) -> float:
    """A duration argument: argparse names the flag when this refuses one."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, got {text!r}")
    return value


def _run(args: argparse.Namespace) -> int:
    from ..config import load_config  # noqa: PLC0415
    from ..control.server import serving  # noqa: PLC0415 - aiohttp only when running a job
    from ..driver.job import Job  # noqa: PLC0415
    from ..driver.spark_session import starts_executor_pods  # noqa: PLC0415
    from ..ha import fencing  # noqa: PLC0415 - the Kubernetes client only when running
    from ..loader import load  # noqa: PLC0415

    config = load_config(args.config, args.set)
    if args.restore:
        config = replace(config, restore=replace(config.restore, source=args.restore))
    if args.await_handover and args.restore:
        raise ConfigError(
            "--await-handover and --restore exclude each other: the hand-over names the "
            "restore source; drop one of them"
        )
    if args.start_executors and not (args.await_handover and starts_executor_pods(config.spark)):
        raise ConfigError(
            "--start-executors starts a pre-started driver's executor pods before its "
            "hand-over: it needs --await-handover and spark.master kubernetes (executors as "
            "pods); drop it"
        )
    if args.await_handover and config.control.port < 0:
        raise ConfigError(
            "--await-handover needs the control API to receive the hand-over, but "
            "control.port is -1; set control.port (0 picks a free port)"
        )
    logging.getLogger().setLevel(config.log_level)
    loaded = load(args.pipeline)
    # Everything below up to driver.run() runs before Spark starts (driver/preflight.py).
    driver = Job(
        loaded.pipeline,
        config,
        python_path=[loaded.import_root] if loaded.import_root else [],
        await_handover=args.await_handover,
    )
    # The job keeps what preflight found for its restore source (it is not read again), so
    # the job's lease is held before: no other driver writes after the restore source is read.
    if args.await_handover:  # the restore source arrives over the control API
        driver.check_storage()
        fencing.prepare(config.lease, os.environ)
    else:
        fencing.hold(config.lease, os.environ)
        driver.preflight()
    try:
        with serving(driver, config.control):
            if args.await_handover:
                driver.await_handover(start_executors=args.start_executors)
                fencing.hold(config.lease, os.environ)  # the old driver released it
                driver.check_restore_source()
            status = driver.run()
            fencing.release()  # before lingering: a successor takes over at once
    finally:
        fencing.release()
        driver.close()
    print(
        json.dumps(
            {
                "state": status.state,
                "stopped_with_savepoint": status.stopped_with_savepoint,
                "job": status.job,
                "epochs": status.epoch,
                "records_in": status.records_in,
                "records_out": status.records_out,
                "checkpoints": status.checkpoints,
                "restarts": status.restarts,
                "finished": status.finished,
            }
        )
    )
    return config.control.stopped_exit_code if status.state == "STOPPED" else 0


def _job(args: argparse.Namespace) -> int:
    """One line for the job, one per failover region (its state, epoch, restarts, latest
    checkpoint and last error)."""
    from ..control.client import ControlClient  # noqa: PLC0415
    from ..control.token import read_token  # noqa: PLC0415

    job = ControlClient(args.url, timeout=10, token=read_token(args.token_file)).job()
    if args.json:
        print(json.dumps(job.to_wire(), indent=2))
        return 0
    latest, metrics = job.latest_checkpoint, job.metrics
    print(
        _text(
            {
                "job": job.job,
                "state": job.state,
                "epoch": job.epoch,
                "restarts": job.restarts,
                "latest_checkpoint": latest.id if latest else None,
                "last_error": job.last_error,
                **(
                    {
                        "processing_latency_p99_ms": metrics.processing_latency_p99_ms,
                        "max_busy_ratio": metrics.max_busy_ratio,
                        "busiest_subtask": metrics.busiest_subtask,
                    }
                    if metrics
                    else {}
                ),
            }
        )
    )
    for region in job.regions:
        checkpoint = region.latest_checkpoint
        row = {
            "region": region.id,
            "state": region.state,
            "epoch": region.epoch,
            "restarts": region.restarts,
            "latest_checkpoint": checkpoint.id if checkpoint else None,
            "last_error": region.last_error,
            "nodes": ",".join(region.nodes),
        }
        print("  " + _text(row))
    return 0


def _checkpoints(args: argparse.Namespace) -> int:
    from ..checkpoint.coordinator import load_checkpoint  # noqa: PLC0415
    from ..lineage import list_checkpoints, snapshot_dir  # noqa: PLC0415
    from ..storage import open_store  # noqa: PLC0415

    if args.action == "show":
        parent, _, name = snapshot_dir(args.uri).rpartition("/")
        meta = load_checkpoint(open_store(parent), name)
        info = _describe(meta)
        info["operators"] = {
            uid: [
                {
                    "subtask": s.index,
                    "key_groups": list(s.key_groups),
                    "epoch": s.epoch,
                    "files": len(s.files),
                    "state_bytes": s.state_bytes,
                    "incremental_bytes": s.incremental_bytes,
                }
                for s in op.subtasks
            ]
            for uid, op in meta.operators.items()
        }
        info["sources"] = meta.sources
        info["pending_sink_commits"] = {u: [c.epoch for c in cs] for u, cs in meta.sinks.items()}
        print(json.dumps(info, indent=2) if args.json else _text(info))
        return 0
    from ..driver.layout import region_dirs  # noqa: PLC0415

    root = args.uri.rstrip("/")
    rows = []
    # A job of several failover regions keeps each region's checkpoints under regions/<id>/.
    for region, uri in [(None, root), *((r, f"{root}/regions/{r}") for r in region_dirs(root))]:
        for e in list_checkpoints(uri):
            row = _describe(e.metadata) if e.metadata else {"id": e.id, "status": e.problem}
            rows.append({"region": region, **row} if region else row)
    if args.json:
        print(json.dumps(rows, indent=2))
    elif not rows:
        print(f"no checkpoints under {args.uri.rstrip('/')}")
    else:
        for row in rows:
            print(_text(row))
    return 0


def _describe(meta: Any) -> dict[str, Any]:
    return {
        "id": meta.checkpoint_id,
        "status": "completed",
        "epoch": meta.epoch,
        "job": meta.job,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(meta.created_ms / 1000)),
        "state_bytes": meta.state_bytes,
        "incremental_bytes": meta.incremental_bytes,
        "incremental": meta.incremental,
        "duration_ms": meta.duration_ms,
        "watermark": meta.watermark,
    }


def _text(info: dict[str, Any]) -> str:
    return "  ".join(f"{k}={v}" for k, v in info.items() if not isinstance(v, dict | list)) + (
        "\n"
        + "\n".join(
            f"  {k}: {json.dumps(v)}" for k, v in info.items() if isinstance(v, dict | list)
        )
        if any(isinstance(v, dict | list) for v in info.values())
        else ""
    )


if __name__ == "__main__":
    sys.exit(main())
