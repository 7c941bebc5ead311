"""``python -m bench`` (``make bench``): Stator against its peers, measured in one run.

Each case runs in its own process (fresh JVM, fresh Python workers) on ``local[2]``; the
table gives each peer's throughput and Stator's ratio to it. Cases:

1. keyed count: Stator (checkpoint every epoch) vs Spark's native streaming
   ``groupBy().count()`` with the RocksDB state store, same events and batch size;
2. the same against ``transformWithStateInPandas`` on a smaller input (it is ~50x slower);
3. checkpoint overhead: Stator with a checkpoint every epoch vs none;
4. incremental vs full checkpoint bytes at 1% key churn per checkpoint;
5. savepoint and rescaled restore against raw MinIO bandwidth;
6. restoring a subtask's checkpoint from its task-local copy vs from MinIO (restore only,
   until the database is open: not the time from an executor's failure to processing).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


ENV: dict[str, str] = {}  # extra environment for cases (S3 credentials when on MinIO)


def run_case(name: str, **kwargs: Any) -> dict[str, Any]:
    """Run one case in a child process and return its result."""
    code = (
        "import json, sys; from bench.cases import CASES; "
        f"r = CASES[{name!r}](**json.loads(sys.argv[1])); print('RESULT ' + json.dumps(r))"
    )
    # This checkout's runtime first: an installed (e.g. editable, other checkout) stator
    # must not be what a case measures.
    path = os.pathsep.join([str(ROOT / "runtime"), str(ROOT)])
    env = {**os.environ, **ENV, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": path}
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(kwargs)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[7:])
            result["wall_s"] = time.monotonic() - started
            print(f"  {name}({kwargs}): {result}", file=sys.stderr, flush=True)
            return result
    raise RuntimeError(
        f"benchmark case {name} failed (exit {proc.returncode}):\n"
        f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--events", type=int, default=4_000_000)
    parser.add_argument("--keys", type=int, default=400_000)
    parser.add_argument("--epoch", type=int, default=500_000, help="records per epoch/trigger")
    parser.add_argument("--tws-events", type=int, default=400_000)
    parser.add_argument("--tws-keys", type=int, default=40_000)
    parser.add_argument("--churn-keys", type=int, default=400_000)
    parser.add_argument("--churn-checkpoints", type=int, default=20)
    parser.add_argument("--sp-keys", type=int, default=1_000_000, help="savepoint state keys")
    parser.add_argument("--sp-value-bytes", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=2, help="runs per case (best is kept)")
    parser.add_argument(
        "--local-restore-bytes", type=int, default=1 << 30, help="state of the local_restore case"
    )
    parser.add_argument(
        "--only",
        nargs="*",
        default=["count", "tws", "overhead", "churn", "savepoint", "local_restore"],
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--no-minio",
        action="store_true",
        help="skip the cases with checkpoints on the test bed's MinIO",
    )
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        s3 = ""
        if not args.no_minio:
            from tests.testbed.minio import MinioServer

            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-minio-")))
            server = stack.enter_context(MinioServer(root))
            assert server.endpoint is not None
            server.endpoint.client().create_bucket(Bucket="bench")
            ENV.update(server.endpoint.env())
            s3 = "s3://bench/checkpoints"
        return _run(args, s3)


def _ratio(a: dict[str, Any], b: dict[str, Any]) -> float:
    return float(a["events_per_s"]) / float(b["events_per_s"])


def _run(args: argparse.Namespace, s3: str) -> int:
    def best(name: str, **kw: Any) -> dict[str, Any]:
        runs = [run_case(name, **kw) for _ in range(args.repeat)]
        return max(runs, key=lambda r: r.get("events_per_s", 0))

    def rate(r: dict[str, Any]) -> str:
        return f"{r['events_per_s']:,.0f}/s"

    rows: list[tuple[str, str, str, str]] = []
    results: dict[str, Any] = {}
    size = dict(events=args.events, keys=args.keys, epoch=args.epoch)
    what = f"{args.events:,} events, {args.keys:,} keys, {args.epoch:,} per epoch"
    print(f"local[2]; best of {args.repeat}", file=sys.stderr)
    if "count" in args.only or "overhead" in args.only:
        results["stator"] = best("stator_count", **size)
        if s3:
            results["stator_minio"] = best("stator_count", **size, storage=s3)
    if "count" in args.only:
        results["native"] = best("native_count", **size)
        s, n = results["stator"], results["native"]
        rows.append(
            (
                f"keyed count ({what}); checkpoints every epoch on local disk, both",
                rate(s),
                f"native {rate(n)}",
                f"{_ratio(s, n):.2f}x (target >= 1.0)",
            )
        )
        if s3:
            m = results["stator_minio"]
            rows.append(
                (
                    "the same, Stator's checkpoints on MinIO",
                    rate(m),
                    f"native {rate(n)}",
                    f"{_ratio(m, n):.2f}x",
                )
            )
    if "tws" in args.only:
        small = dict(events=args.tws_events, keys=args.tws_keys, epoch=args.tws_events // 4)
        results["tws"] = run_case("tws_pandas_count", **small)  # ~3 minutes: once
        results["stator_small"] = best("stator_count", **small)
        t, s = results["tws"], results["stator_small"]
        rows.append(
            (
                f"keyed count ({args.tws_events:,} events, {args.tws_keys:,} keys)",
                rate(s),
                f"transformWithStateInPandas {rate(t)}",
                f"{_ratio(s, t):.1f}x (target >= 25)",
            )
        )
        if "stator" in results:
            rows.append(
                (
                    f"Stator at {args.events:,} events vs the same peer",
                    rate(results["stator"]),
                    f"transformWithStateInPandas {rate(t)}",
                    f"{_ratio(results['stator'], t):.0f}x",
                )
            )
    if "overhead" in args.only:
        results["stator_nock"] = best("stator_count", **size, checkpoint=False)
        s, z = results["stator"], results["stator_nock"]
        rows.append(
            (
                "checkpoint every epoch (local disk) vs none",
                rate(s),
                f"no checkpoints {rate(z)}",
                f"{_ratio(s, z):.2f} (target >= 0.85)",
            )
        )
        if s3:
            m = results["stator_minio"]
            rows.append(
                (
                    "checkpoint every epoch (MinIO) vs none",
                    rate(m),
                    f"no checkpoints {rate(z)}",
                    f"{_ratio(m, z):.2f} (target >= 0.85)",
                )
            )
    if "churn" in args.only:
        churn = dict(keys=args.churn_keys, churn=0.01, checkpoints=args.churn_checkpoints)
        results["incremental"] = run_case(
            "incremental_bytes", **churn, incremental=True, storage=s3
        )
        results["full"] = run_case("incremental_bytes", **churn, incremental=False, storage=s3)
        inc, full = results["incremental"], results["full"]
        rows.append(
            (
                f"checkpoint bytes at 1% churn per checkpoint, {args.churn_keys:,} keys",
                f"incremental {inc['mean_uploaded'] / 1e3:,.0f} kB/checkpoint "
                f"(max {inc['max_uploaded'] / 1e3:,.0f} kB)",
                f"full {full['mean_uploaded'] / 1e3:,.0f} kB/checkpoint",
                f"{inc['mean_uploaded'] / full['mean_uploaded']:.1%} (target <= 5%)",
            )
        )

    if "savepoint" in args.only and s3:
        size_bytes = args.sp_keys * args.sp_value_bytes
        results["raw"] = run_case("raw_bandwidth", total_bytes=size_bytes)
        results["savepoint"] = run_case(
            "savepoint_rescale", keys=args.sp_keys, value_bytes=args.sp_value_bytes, storage=s3
        )
        raw, sp = results["raw"], results["savepoint"]
        gb = sp["state_bytes"] / 1e9
        rows.append(
            (
                f"savepoint of {gb:.2f} GB (p=2) to MinIO",
                f"{sp['savepoint_s']:.1f} s = {sp['savepoint_mb_s']:.0f} MB/s",
                f"raw upload {raw['upload_mb_s']:.0f} MB/s",
                f"{sp['savepoint_mb_s'] / raw['upload_mb_s']:.0%} (target >= 50%)",
            )
        )
        rows.append(
            (
                f"restore of {gb:.2f} GB at p=3 (rescale 2 -> 3), first epoch",
                f"{sp['restore_s']:.1f} s = {sp['restore_mb_s']:.0f} MB/s",
                f"raw download {raw['download_mb_s']:.0f} MB/s",
                f"{sp['restore_mb_s'] / raw['download_mb_s']:.0%} (target >= 50%)",
            )
        )
        rows.append(("rescale downtime (savepoint + restore)", f"{sp['downtime_s']:.1f} s", "", ""))

    rows.extend(_local_restore(args, s3, results))

    print("\n| benchmark | Stator | peer | ratio |\n|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


def _local_restore(
    args: argparse.Namespace, s3: str, results: dict[str, Any]
) -> list[tuple[str, str, str, str]]:
    """Case 6 (needs MinIO)."""
    if "local_restore" not in args.only or not s3:
        return []
    lr = results["local_restore"] = run_case(
        "local_restore", total_bytes=args.local_restore_bytes, storage=s3
    )
    row = (
        f"restore of one subtask's {lr['state_bytes'] / 1e9:.2f} GB checkpoint "
        f"from the executor's local copy (0 bytes from MinIO)",
        f"{lr['local_s']:.2f} s",
        f"from MinIO {lr['remote_s']:.2f} s",
        f"{lr['speedup']:.0f}x faster locally (target >= 5x)",
    )
    return [row]


if __name__ == "__main__":
    sys.exit(main())
