"""``python -m bench`` (``make bench``): Stator against its peers, measured in one run.

Each run of a contender is its own process (fresh JVM, fresh Python workers) on
``local[2]``, checks its own result before its time counts (``bench/cases.py``), and the
contenders of a group run in turn, A, B, C, A, B, C, ... (``bench/harness.py``); every row
gives each side's median and spread over ``--runs`` runs and the ratio of the medians.
Groups (``--only``):

- ``count``: the same events and batch size for all, a checkpoint every epoch unless said:
  a user ``KeyedProcessFunction`` with ``ValueState`` and the built-in ``.count()`` against
  Spark's native streaming ``groupBy().count()`` (RocksDB state store, 2 files per trigger);
  the built-in count with checkpoints on local disk against none;
- ``uploads``: the built-in count with a checkpoint every epoch on MinIO against none, and
  asynchronous uploads against synchronous ones, on MinIO directly and behind a link capped
  at ``--link-mb`` MB/s (an object store across a network);
- ``tws``: the same user function against the same processor in
  ``transformWithStateInPandas`` (one output per event for both), on a smaller input;
- ``churn``: incremental vs full checkpoint bytes at 1% key churn per checkpoint;
- ``savepoint``: savepoint and rescaled restore, and a native-format savepoint and its
  restore at the same parallelism, against raw MinIO bandwidth;
- ``local_restore``: a subtask's restore from its task-local copy vs from MinIO (restore
  only: the time from an executor's failure to processing is ``python -m bench.pods``);
- ``standby``: an executor holding ``--standby-bytes`` of keyed state is killed and a
  standby executor on the same machine (``local-cluster[2,1,1024]``: two executors of one
  node sharing its disk) takes its subtask over: from the node's local state vs from MinIO
  (its state gone with the executor); time from the kill to the end of the first epoch
  processed on the standby;
- ``epoch_access``: what a keyed task pays for its state in a quiet epoch (open, timer
  check, 300 lookups, close) after one epoch wrote ``--epoch-access-bytes`` at once, with
  partitioned index and filters (the default) vs monolithic ones (before);
- ``spark_start``: a session and its first job on ``local-cluster[2,1,1024]`` (a driver
  and two executor JVMs) with Stator's class-data archives vs the JDK's own;
- ``join``: an interval join of two streams (the same ``--join-events`` on both sides,
  ``--join-keys`` keys, +-5 s) against Spark's stream-stream join with watermarks and a
  range condition (RocksDB state store), both outputs' pair counts checked
  (``bench/joins.py``);
- ``kafka``: Kafka -> keyed count -> Kafka on the test bed's broker (started for the group):
  Stator's exactly-once and at-least-once ``KafkaSink`` against Spark's Kafka source,
  ``groupBy().count()`` and Kafka sink on the same backlog, outputs checked by a
  ``read_committed`` consumer; and end-to-end latency (p50, p99) at ``--kafka-rate``
  records/s (``bench/kafka.py``);
- ``latency``: at fixed input rates (``--lat-rates``, and the highest of ``--lat-probe``
  that Stator sustains), processing and committed latency per record of a user
  ``KeyedProcessFunction`` into an exactly-once sink, with Stator's defaults and its
  low-latency settings, against Spark Structured Streaming's keyed count at the same rate;
  and Kafka -> Kafka at ``--lat-kafka-rate`` (``bench/latency.py``).

``--quick`` runs a reduced ``count``, ``tws`` and ``join`` (or the groups ``--only`` names, e.g.
``--quick --only kafka``) once each without MinIO, in under three minutes per group, for
development: its numbers are not those of docs/benchmarks.md.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from bench.harness import Alternating, Comparison, Runs, compile_sources, table

ROOT = Path(__file__).resolve().parent.parent


GROUPS = (
    "count",
    "uploads",
    "tws",
    "churn",
    "savepoint",
    "local_restore",
    "standby",
    "epoch_access",
    "spark_start",
    "join",
    "kafka",
    "latency",
)
MINIO_GROUPS = {"uploads", "churn", "savepoint", "local_restore", "standby"}  # start MinIO
ENV: dict[str, str] = {}  # extra environment for cases (S3 credentials when on MinIO)
SP_RESTORE_EPOCH = 1_000  # records in the first epoch of the restored savepoint job
LINK: dict[str, str] = {}  # "url": MinIO behind a bandwidth-capped link (--link-mb)


def run_case(name: str, **kwargs: Any) -> dict[str, Any]:
    """Run one case in a child process and return its result."""
    code = (
        "import json, sys; from bench.cases import CASES; from bench.joins import JOIN_CASES; "
        "from bench.kafka import KAFKA_CASES; from bench.latency import LATENCY_CASES; "
        "CASES.update(JOIN_CASES); CASES.update(KAFKA_CASES); CASES.update(LATENCY_CASES); "
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
    parser.add_argument("--runs", type=int, default=3, help="runs per contender (>= 3)")
    parser.add_argument("--quick", action="store_true", help="a reduced set, one run each")
    parser.add_argument("--events", type=int, default=4_000_000)
    parser.add_argument("--keys", type=int, default=400_000)
    parser.add_argument("--epoch", type=int, default=500_000, help="records per epoch/trigger")
    parser.add_argument("--tws-events", type=int, default=200_000)
    parser.add_argument("--tws-keys", type=int, default=20_000)
    parser.add_argument("--join-events", type=int, default=2_000_000, help="per side")
    parser.add_argument("--join-keys", type=int, default=200_000)
    parser.add_argument("--join-epoch", type=int, default=250_000, help="per side")
    parser.add_argument("--churn-keys", type=int, default=400_000)
    parser.add_argument("--churn-checkpoints", type=int, default=20)
    parser.add_argument("--sp-keys", type=int, default=1_000_000, help="savepoint state keys")
    parser.add_argument("--sp-value-bytes", type=int, default=1000)
    parser.add_argument(
        "--local-restore-bytes", type=int, default=1 << 30, help="state of the local_restore case"
    )
    parser.add_argument(
        "--epoch-access-bytes", type=int, default=1 << 30, help="state of the epoch_access case"
    )
    parser.add_argument(
        "--standby-bytes", type=int, default=1 << 30, help="state of the standby case"
    )
    parser.add_argument("--kafka-events", type=int, default=1_000_000, help="Kafka backlog")
    parser.add_argument("--kafka-keys", type=int, default=100_000)
    parser.add_argument("--kafka-epoch", type=int, default=250_000, help="records per epoch")
    parser.add_argument("--kafka-rate", type=int, default=5_000, help="latency: records/s")
    parser.add_argument("--kafka-lat-keys", type=int, default=10_000, help="latency: keys")
    parser.add_argument("--kafka-lat-s", type=float, default=30.0, help="latency: measured s")
    parser.add_argument("--kafka-warmup-s", type=float, default=15.0, help="latency: warm-up s")
    parser.add_argument(
        "--lat-rates", type=int, nargs="*", default=[2_000, 20_000], help="latency: records/s"
    )
    parser.add_argument(
        "--lat-probe",
        type=int,
        nargs="*",
        default=[40_000, 80_000, 120_000, 160_000],
        help="latency: rates tried once each, ascending, for the highest Stator sustains",
    )
    parser.add_argument("--lat-keys", type=int, default=100_000, help="latency: keys")
    parser.add_argument("--lat-s", type=float, default=20.0, help="latency: measured s")
    parser.add_argument("--lat-warmup-s", type=float, default=10.0, help="latency: warm-up s")
    parser.add_argument(
        "--lat-kafka-rate", type=int, default=20_000, help="latency: Kafka records/s (0: none)"
    )
    parser.add_argument(
        "--only",
        nargs="*",
        default=None,
        help="groups to run (default: all; with --quick: count tws join)",
    )
    parser.add_argument("--json", type=Path, help="also write every run's result here")
    parser.add_argument(
        "--link-mb",
        type=float,
        default=16.0,
        help="MB/s of the capped link to MinIO (a remote object store) in the count group",
    )
    parser.add_argument(
        "--no-minio",
        action="store_true",
        help="skip the cases with checkpoints on the test bed's MinIO",
    )
    args = parser.parse_args(argv)
    compile_sources(ROOT)
    if args.quick:
        args.runs, args.no_minio = 1, True
        args.only = args.only or ["count", "tws", "join"]
        args.events, args.keys, args.epoch = 200_000, 20_000, 50_000
        args.kafka_events, args.kafka_keys, args.kafka_epoch = 50_000, 5_000, 12_500
        args.kafka_rate, args.kafka_lat_keys = 1_000, 2_000
        args.kafka_lat_s, args.kafka_warmup_s = 8.0, 6.0
        args.join_events, args.join_keys, args.join_epoch = 100_000, 10_000, 25_000
        args.tws_events, args.tws_keys = 8_000, 1_000
        args.lat_rates, args.lat_probe, args.lat_kafka_rate = [20_000], [], 0
        args.lat_s, args.lat_warmup_s = 8.0, 5.0
    elif args.runs < 3:
        parser.error("--runs must be at least 3 (fewer make no median); --quick for less")
    args.only = args.only or [*GROUPS]
    unknown = sorted(set(args.only) - set(GROUPS))
    if unknown:
        parser.error(f"--only: unknown group(s) {unknown}; the groups are {list(GROUPS)}")
    with contextlib.ExitStack() as stack:
        s3 = ""
        if not args.no_minio and set(args.only) & MINIO_GROUPS:
            from tests.testbed.minio import MinioServer
            from tests.testbed.throttle import ThrottledPort

            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-minio-")))
            server = stack.enter_context(MinioServer(root))
            assert server.endpoint is not None
            server.endpoint.client().create_bucket(Bucket="bench")
            ENV.update(server.endpoint.env())
            s3 = "s3://bench/checkpoints"
            target = urlparse(server.endpoint.endpoint_url)
            link = stack.enter_context(ThrottledPort(target.hostname or "", target.port or 80))
            link.limit(args.link_mb * 1e6)
            LINK["url"] = link.endpoint_url
        return _run(args, s3)


def _case(name: str, metric: str, **kwargs: Any) -> Callable[[], tuple[float, dict[str, Any]]]:
    """A contender: one checked run of case ``name`` in its own process; ``metric`` is the
    field of its result the harness records."""

    def run() -> tuple[float, dict[str, Any]]:
        result = run_case(name, **kwargs)
        return float(result[metric]), result

    return run


STEADY = "steady_events_per_s"  # a case's throughput after its first epoch (cases._steady)


def _field(runs: Alternating, name: str, label: str, unit: str, key: str) -> Runs:
    """Another field of the same runs (e.g. a restore's MB/s from the savepoint case)."""
    got = runs.results[name]
    return Runs(label, unit, tuple(float(d[key]) for _, d in got), tuple(d for _, d in got))


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# The keyed count's settings for long-running tasks (docs/runtime.md "Latency").
LONG_RUNNING = ("epoch.tasks=long-running",)


def _run(args: argparse.Namespace, s3: str) -> int:  # noqa: PLR0912 - a branch per group
    log = _log
    rows: list[tuple[str, str, str, str]] = []
    dumps: dict[str, Any] = {}
    size = dict(events=args.events, keys=args.keys, epoch=args.epoch)
    what = f"{args.events:,} events, {args.keys:,} keys, {args.epoch:,} per epoch/trigger"
    log(f"local[2]; {args.runs} alternating run(s) per contender")

    if "count" in args.only:
        runs = Alternating(args.runs, log)
        runs.measure(
            {
                "kpf": _case("stator_count", "events_per_s", **size, function="kpf"),
                "builtin": _case("stator_count", "events_per_s", **size),
                "native": _case("native_count", "events_per_s", **size),
                "builtin_none": _case("stator_count", "events_per_s", **size, checkpoint=False),
                "bcast": _case("stator_count", "events_per_s", **size, function="broadcast"),
                "kpf_lr": _case(
                    "stator_count", "events_per_s", **size, function="kpf", settings=LONG_RUNNING
                ),
                "builtin_lr": _case("stator_count", "events_per_s", **size, settings=LONG_RUNNING),
            }
        )
        dumps["count"] = runs.results
        native = runs.runs_of("native", "native `groupBy().count()`", "events/s")
        rows.append(
            Comparison(
                f"keyed count ({what}); checkpoint every epoch on local disk, both: a user "
                f"KeyedProcessFunction with ValueState (one output per event) vs Spark's native "
                f"aggregation (RocksDB state store; one output per key and trigger)",
                runs.runs_of("kpf", "user `KeyedProcessFunction`", "events/s"),
                native,
                target=">= 1.5",
            ).row()
        )
        rows.append(
            Comparison(
                "the same, Stator's built-in `.count()` (pre-combined before the shuffle; one "
                "output per key and epoch, like the peer)",
                runs.runs_of("builtin", "built-in `.count()`", "events/s"),
                native,
                target=">= 2.0",
            ).row()
        )
        rows.append(
            Comparison(
                "the same user count enriched from broadcast state (every event reads a rule "
                "that a broadcast stream wrote; `keyed.connect(rules.broadcast(desc))`) vs the "
                "plain user `KeyedProcessFunction`",
                runs.runs_of("bcast", "broadcast-enriched count", "events/s"),
                runs.runs_of("kpf", "user `KeyedProcessFunction`", "events/s"),
                target=">= 0.9",
            ).row()
        )
        for name, label in (
            ("kpf", "user `KeyedProcessFunction`"),
            ("builtin", "built-in `.count()`"),
        ):
            rows.append(
                Comparison(
                    f"the same, {label}: long-running tasks (`epoch.tasks=long-running`, the "
                    f"low-latency setting) vs a Spark job per epoch (the default)",
                    runs.runs_of(f"{name}_lr", f"{label}, long-running tasks", "events/s"),
                    runs.runs_of(name, f"{label}, a Spark job per epoch", "events/s"),
                    target=">= 0.9",
                ).row()
            )
        rows.append(
            Comparison(
                "the same, checkpoints on local disk vs none",
                runs.runs_of("builtin", "checkpoints on local disk", "events/s"),
                runs.runs_of("builtin_none", "built-in `.count()`, no checkpoints", "events/s"),
            ).row()
        )

    if "join" in args.only:
        runs = Alternating(args.runs, log)
        join = dict(
            events=args.join_events,
            keys=args.join_keys,
            epoch=args.join_epoch,
            bound_ms=5_000,
            ms_per_record=1,
        )
        runs.measure(
            {
                "stator": _case("stator_interval_join", "events_per_s", **join),
                "spark": _case("spark_interval_join", "events_per_s", **join),
            }
        )
        dumps["join"] = runs.results
        rows.append(
            Comparison(
                f"interval join of two streams ({args.join_events:,} events each, the same on "
                f"both sides; {args.join_keys:,} keys; pairs within +-5 s; "
                f"{args.join_epoch:,} per side per epoch/trigger); a checkpoint every epoch "
                f"on local disk, both; pair counts checked: `interval_join` vs Spark's "
                f"stream-stream join (watermarks, range condition, RocksDB state store)",
                runs.runs_of("stator", "`interval_join`", "events/s"),
                runs.runs_of("spark", "stream-stream join", "events/s"),
                target=">= 1.5",
            ).row()
        )

    if "latency" in args.only:
        from bench.latency import latency_rows

        got, dumped = latency_rows(args, _case, log)
        rows += got
        dumps.update(dumped)

    if "kafka" in args.only:
        from bench.kafka import kafka_rows

        got, dumped = kafka_rows(args, _case, log)
        rows += got
        dumps.update(dumped)

    if "uploads" in args.only and s3:
        runs = Alternating(args.runs, log)
        link = dict(storage=s3, s3_endpoint=LINK["url"])
        runs.measure(
            {
                "none": _case("stator_count", "events_per_s", **size, checkpoint=False),
                "minio": _case("stator_count", "events_per_s", **size, storage=s3),
                "minio_sync": _case(
                    "stator_count", "events_per_s", **size, storage=s3, sync_upload=True
                ),
                "minio_objects": _case(
                    "stator_count", "events_per_s", **size, storage=s3, inline_max_bytes=0
                ),
                "link": _case("stator_count", "events_per_s", **size, **link),
                "link_sync": _case(
                    "stator_count", "events_per_s", **size, **link, sync_upload=True
                ),
            }
        )
        dumps["uploads"] = runs.results
        asynchronous = runs.runs_of("minio", "checkpoints on MinIO", "events/s")
        rows.append(
            Comparison(
                f"built-in `.count()` ({what}): a checkpoint every epoch on MinIO "
                f"(asynchronous uploads, the default) vs none",
                asynchronous,
                runs.runs_of("none", "built-in `.count()`, no checkpoints", "events/s"),
                target=">= 0.95",
            ).row()
        )
        rows.append(
            Comparison(
                "the same runs after their first epoch (from its end to the end of the run, "
                "the last checkpoint's upload included): the start-up both pay (JVM, Python "
                "workers) left out; the executor's uploader imports boto3 and builds its "
                "client with the first checkpoint, so that falls in this window",
                _field(runs, "minio", "checkpoints on MinIO", "events/s", STEADY),
                _field(runs, "none", "no checkpoints", "events/s", STEADY),
                target=">= 0.95",
            ).row()
        )
        rows.append(
            Comparison(
                "the same, checkpoints on MinIO: small private files (CURRENT, MANIFEST, "
                "OPTIONS) in the checkpoint's metadata (`checkpoint.inline_max_bytes`, the "
                "default) vs every file an object (`checkpoint.inline_max_bytes=0`)",
                asynchronous,
                runs.runs_of("minio_objects", "every file an object", "events/s"),
            ).row()
        )
        rows.append(
            Comparison(
                "the same, checkpoints on MinIO: asynchronous uploads vs synchronous "
                "(`checkpoint.async_upload=false`: each task uploads before it returns)",
                asynchronous,
                runs.runs_of("minio_sync", "synchronous uploads", "events/s"),
            ).row()
        )
        rows.append(
            Comparison(
                f"the same, MinIO behind a link capped at {args.link_mb:g} MB/s (a remote "
                f"object store): asynchronous uploads vs synchronous",
                runs.runs_of("link", "asynchronous uploads", "events/s"),
                runs.runs_of("link_sync", "synchronous uploads", "events/s"),
            ).row()
        )

    if "tws" in args.only:
        small = dict(events=args.tws_events, keys=args.tws_keys, epoch=args.tws_events // 4)
        runs = Alternating(args.runs, log)
        runs.measure(
            {
                "kpf": _case("stator_count", "events_per_s", **small, function="kpf"),
                "tws": _case("tws_pandas_count", "events_per_s", **small),
            }
        )
        dumps["tws"] = runs.results
        rows.append(
            Comparison(
                f"keyed count, {args.tws_events:,} events, {args.tws_keys:,} keys, 4 epochs/"
                f"triggers, checkpoint every epoch on local disk: a user KeyedProcessFunction "
                f"with ValueState vs the same processor in `transformWithStateInPandas` "
                f"(ValueState count, one output per event, both)",
                runs.runs_of("kpf", "user `KeyedProcessFunction`", "events/s"),
                runs.runs_of("tws", "`transformWithStateInPandas`", "events/s"),
                target=">= 25",
            ).row()
        )
        rows.append(
            Comparison(
                "the same runs after their first epoch/trigger (from its end to the end of the "
                "run): without the start-up both engines pay in their first Spark job",
                _field(runs, "kpf", "user `KeyedProcessFunction`", "events/s", STEADY),
                _field(runs, "tws", "`transformWithStateInPandas`", "events/s", STEADY),
                target=">= 25",
            ).row()
        )

    if "churn" in args.only:
        # Bytes, not time: deterministic, so one run of each.
        churn = dict(keys=args.churn_keys, churn=0.01, checkpoints=args.churn_checkpoints)
        runs = Alternating(1, log)
        runs.measure(
            {
                "incremental": _case(
                    "incremental_bytes", "mean_uploaded", **churn, incremental=True, storage=s3
                ),
                "full": _case(
                    "incremental_bytes", "mean_uploaded", **churn, incremental=False, storage=s3
                ),
            }
        )
        dumps["churn"] = runs.results
        inc = runs.runs_of("incremental", "incremental", "B")
        full = runs.runs_of("full", "full", "B")
        rows.append(
            (
                f"checkpoint bytes at 1% key churn per checkpoint, {args.churn_keys:,} keys, "
                f"{args.churn_checkpoints} checkpoints (bytes: deterministic, one run each)",
                f"incremental {inc.median / 1e3:,.0f} kB/checkpoint",
                f"full {full.median / 1e3:,.0f} kB/checkpoint",
                f"**{inc.median / full.median:.1%}** (target <= 5%)",
            )
        )

    if "savepoint" in args.only and s3:
        runs = Alternating(args.runs, log)
        state = dict(keys=args.sp_keys, value_bytes=args.sp_value_bytes, storage=s3)
        state.update(restore_epoch=SP_RESTORE_EPOCH)
        runs.measure(
            {
                "raw": _case(
                    "raw_bandwidth", "upload_mb_s", total_bytes=args.sp_keys * args.sp_value_bytes
                ),
                "savepoint": _case("savepoint_rescale", "savepoint_mb_s", **state),
                "native": _case(
                    "savepoint_rescale", "savepoint_mb_s", **state, p_to=2, format_type="native"
                ),
            }
        )
        dumps["savepoint"] = runs.results
        gb = {n: runs.results[n][0][1]["state_bytes"] / 1e9 for n in ("savepoint", "native")}
        first = f"until the job processes again (its first epoch, of {SP_RESTORE_EPOCH:,} records)"
        for name, taken, restored in (
            (
                "savepoint",
                f"savepoint of {gb['savepoint']:.2f} GB of keyed state (random values; p=2; "
                f"default settings: zlib, which stores what does not compress raw) to MinIO vs "
                f"raw MinIO upload of as many bytes (boto3, same client settings)",
                f"restore of the same savepoint at p=3 (rescale 2 -> 3), {first}, vs raw MinIO "
                f"download",
            ),
            (
                "native",
                f"native-format savepoint (`savepoint.format_type=native`: each subtask's RocksDB "
                f"files, {gb['native']:.2f} GB) of the same state vs raw MinIO upload",
                f"restore of the native savepoint at p=2 (same parallelism: an upgrade or a "
                f"resume), {first}, vs raw MinIO download",
            ),
        ):
            label = "savepoint" if name == "savepoint" else "native savepoint"
            rows.append(
                Comparison(
                    taken,
                    runs.runs_of(name, label, "MB/s"),
                    runs.runs_of("raw", "raw upload", "MB/s"),
                    target=">= 0.6",
                ).row()
            )
            rows.append(
                Comparison(
                    restored,
                    _field(runs, name, "restore", "MB/s", "restore_mb_s"),
                    _field(runs, "raw", "raw download", "MB/s", "download_mb_s"),
                    target=">= 0.6",
                ).row()
            )

    if "local_restore" in args.only and s3:
        runs = Alternating(args.runs, log)
        runs.measure(
            {
                "restore": _case(
                    "local_restore", "local_s", total_bytes=args.local_restore_bytes, storage=s3
                )
            }
        )
        dumps["local_restore"] = runs.results
        gb = runs.results["restore"][0][1]["state_bytes"] / 1e9
        rows.append(
            Comparison(
                f"restore of one subtask's {gb:.2f} GB checkpoint, until its database is open: "
                f"from the executor's local copy (0 bytes from MinIO) vs from MinIO",
                runs.runs_of("restore", "local copy", "s"),
                _field(runs, "restore", "from MinIO", "s", "remote_s"),
                higher_is_better=False,
                fmt="{:.2f}",
            ).row()
        )

    if "standby" in args.only and s3:
        runs = Alternating(args.runs, log)
        size = {"total_bytes": args.standby_bytes, "storage": s3}
        runs.measure(
            {
                "local": _case("standby_recovery", "seconds", local=True, **size),
                "remote": _case("standby_recovery", "seconds", local=False, **size),
            }
        )
        dumps["standby"] = runs.results
        gb = runs.results["local"][0][1]["state_bytes"] / 1e9
        rows.append(
            Comparison(
                f"an executor holding {gb:.2f} GB of keyed state is SIGKILLed mid-epoch; a "
                f"standby executor on the same node (local-cluster[2,1,1024], one disk) takes "
                f"its subtask over: time from the kill to the end of the first epoch it "
                f"processed there, with the node's local state (0 bytes from MinIO) vs "
                f"restored from MinIO (the state gone with the executor, local recovery off)",
                runs.runs_of("local", "node-local state", "s"),
                runs.runs_of("remote", "from MinIO", "s"),
                higher_is_better=False,
                target=">= 5x",
                fmt="{:.1f}",
            ).row()
        )

    if "epoch_access" in args.only:
        runs = Alternating(args.runs, log)
        size = {"total_bytes": args.epoch_access_bytes}
        runs.measure(
            {
                "partitioned": _case("epoch_access", "seconds", partitioned=True, **size),
                "monolithic": _case("epoch_access", "seconds", partitioned=False, **size),
            }
        )
        dumps["epoch_access"] = runs.results
        gb = args.epoch_access_bytes / 1e9
        rows.append(
            Comparison(
                f"a keyed task's state access in an epoch of few changes, after one epoch wrote "
                f"{gb:.2f} GB (4 KiB values, one write batch): open, timer check of 64 "
                f"key-groups, 300 lookups (checked), close; median of 5 epochs per run: "
                f"partitioned index and filters vs monolithic (`state.rocksdb."
                f"partitioned_index=false`, the default before)",
                runs.runs_of("partitioned", "partitioned", "s"),
                runs.runs_of("monolithic", "monolithic", "s"),
                higher_is_better=False,
                fmt="{:.3f}",
            ).row()
        )

    if "spark_start" in args.only:
        runs = Alternating(args.runs, log)
        master = "local-cluster[2,1,1024]"
        runs.measure(
            {
                "shared": _case("spark_start", "start_s", master=master, class_sharing=True),
                "jdk": _case("spark_start", "start_s", master=master, class_sharing=False),
            }
        )
        dumps["spark_start"] = runs.results
        rows.append(
            Comparison(
                f"Spark start on {master} (a driver and two executor JVMs): from "
                f"`create_session` to the first job's result (a shuffle through Python workers, "
                f"checked): Stator's class-data archives (`stator.cluster.cds`) vs the JDK's own",
                runs.runs_of("shared", "with Stator's archives", "s"),
                runs.runs_of("jdk", "JDK archive only", "s"),
                higher_is_better=False,
                fmt="{:.2f}",
            ).row()
        )

    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(dumps, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
