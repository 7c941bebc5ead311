"""Region failover: how much of a healthy region's committed throughput survives a failure in
another region of the same job (FLIP-1; issue 10).

One job of two disconnected pipelines on one ``local[2]`` Spark with FAIR scheduling:
A = generator -> ``RunningCount`` (a ``ValueState`` per key, one output record per event) ->
sink, B the same on other keys. Both sources are rate-limited, as a steady stream is, so B's
committed throughput follows its input while B keeps up. Three contenders, alternating, on
the same input:

- ``failure-free``: no failure; B's committed records/s over a window that starts when A
  reads the range of the failure point and lasts as long as A's recovery did in the
  ``region`` run of the same round.
- ``region`` (``failover.strategy=region``): A's read of one range fails its first 6
  attempts (Spark's 4 task attempts, then A's restart after ``--delay-ms``, then 2 more and a
  third that succeeds); B's committed records/s from A's first failed read to A's next
  completed epoch.
- ``full``: the same failure with ``failover.strategy=full`` (one driver, one rewind).

Committed = the sink's commit, after the checkpoint covering the epoch completed. Every run
checks both sinks before its number counts: per key the running counts are 1..n, each once.

    python -m bench.regions [--runs 3] [--quick]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from stator import EpochResult, Job, Pipeline
from stator.config import JobConfig, SparkConfig, load_config
from stator.sinks import CollectSink
from stator.sources.base import SplitRange
from stator.sources.generator import GeneratorSource, KeyedEvents

from .cases import RunningCount
from .harness import Alternating, Comparison, WrongOutput, table

A_EVENTS, B_EVENTS = KeyedEvents(200, seed=1), KeyedEvents(300, seed=2)


class TimedSink(CollectSink):
    """Collects committed output and when each epoch's commit happened."""

    def __init__(self) -> None:
        super().__init__()
        self.commits: list[tuple[float, int]] = []

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.commits = []

    def commit(
        self, uid: str, epoch: int, parts: list[dict[str, Any]], payloads: list[Any]
    ) -> None:
        before = len(self.results)
        super().commit(uid, epoch, parts, payloads)
        if len(self.results) > before:
            self.commits.append((time.time(), len(self.results) - before))

    def rate(self, start: float, end: float) -> float:
        return sum(n for t, n in self.commits if start <= t <= end) / (end - start)


class FailsAt(GeneratorSource):
    """A generator that notes when it reads the range holding position ``at`` of split
    ``gen-0`` and fails that read its first ``times`` attempts (a reset connection)."""

    def __init__(self, marks: Path, at: int, times: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.marks, self.at, self.times = str(marks), at, times

    def read(self, rng: SplitRange) -> list[Any]:
        if rng.split == "gen-0" and int(rng.start) <= self.at < int(rng.end):
            with open(self.marks, "a") as out:
                out.write(f"{time.time()}\n")
            if len(Path(self.marks).read_text().split()) <= self.times:
                raise ConnectionResetError("input connection reset (injected)")
        return super().read(rng)


def _pipeline(
    marks: Path, args: argparse.Namespace, times: int
) -> tuple[Pipeline, TimedSink, TimedSink]:
    p = Pipeline("regions-bench")
    a_sink, b_sink = TimedSink(), TimedSink()
    rate = float(args.rate)
    a_source = FailsAt(
        marks, args.fail_at, times, records=A_EVENTS, count=args.count, splits=2,
        rate_per_second=rate,
    )  # fmt: skip
    b_source = GeneratorSource(B_EVENTS, count=args.count, splits=2, rate_per_second=rate)
    p.source(a_source, uid="in-a").key_by(_key).process(RunningCount(), uid="a").sink(
        a_sink, uid="out-a"
    )
    p.source(b_source, uid="in-b").key_by(_key).process(RunningCount(), uid="b").sink(
        b_sink, uid="out-b"
    )
    return p, a_sink, b_sink


def _key(event: Any) -> Any:
    return event[0]


def _check(sink: TimedSink, events: KeyedEvents, count: int, name: str) -> None:
    expected: dict[str, int] = defaultdict(int)
    for e in events.make(0, count, 1):
        expected[e[0]] += 1
    seen: dict[str, list[int]] = defaultdict(list)
    for key, n in sink.results:
        seen[key].append(n)
    for key, n in expected.items():
        if seen.get(key) != list(range(1, n + 1)):
            got = seen.get(key, [])
            raise WrongOutput(f"{name}: key {key} committed {len(got)} counts, expected 1..{n}")
    if set(seen) != set(expected):
        raise WrongOutput(f"{name}: keys that are not in the input")


class Bench:
    def __init__(self, args: argparse.Namespace, spark: Any) -> None:
        self.args, self.spark = args, spark
        self.last_window = 5.0  # A's recovery in the latest region run (s)

    def _config(self, root: str, strategy: str) -> JobConfig:
        a = self.args
        return load_config(
            None,
            [
                f"checkpoint.storage=file://{root}/ck",
                f"state.local_dir={root}/state",
                f"savepoint.dir=file://{root}/sp",
                f"failover.strategy={strategy}",
                "restart.strategy=fixed-delay",
                "restart.attempts=3",
                f"restart.delay_ms={a.delay_ms}",
                "control.port=-1",
                "parallelism=2",
            ],
        )

    def run(self, contender: str) -> tuple[float, dict[str, Any]]:
        failing = contender != "failure-free"
        with tempfile.TemporaryDirectory() as root:
            marks = Path(root) / "marks"
            p, a_sink, b_sink = _pipeline(marks, self.args, 6 if failing else 0)
            strategy = "full" if contender == "full" else "region"
            job = Job(p, self._config(root, strategy), self.spark)
            a_epochs: list[float] = []

            def note(result: EpochResult) -> None:
                if result.region in ("in-a", None) and not result.savepoint:
                    a_epochs.append(time.time())

            job.on_epoch(note)
            job.preflight()
            status = job.run()
            if status.state != "FINISHED":
                raise WrongOutput(f"{contender}: the job ended {status.state}")
            _check(a_sink, A_EVENTS, self.args.count, f"{contender} A")
            _check(b_sink, B_EVENTS, self.args.count, f"{contender} B")
            reads = [float(t) for t in marks.read_text().split()]
            start = reads[0]
            # A's recovery ends with its first epoch after the last failed read.
            end = min(t for t in a_epochs if t > reads[5]) if failing else start + self.last_window
            if contender == "region":
                self.last_window = end - start
            return b_sink.rate(start, end), {
                "window_s": round(end - start, 2),
                "restarts": status.restarts,
                "b_overall_per_s": round(
                    len(b_sink.results) / (b_sink.commits[-1][0] - b_sink.commits[0][0]), 1
                ),
            }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.regions", description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--count", type=int, default=30_000, help="events per region")
    parser.add_argument("--rate", type=float, default=1000, help="events/s per region")
    parser.add_argument("--fail-at", type=int, default=5000, help="position in A's split 0")
    parser.add_argument("--delay-ms", type=int, default=3000, help="A's restart delay")
    parser.add_argument("--quick", action="store_true", help="one run, a shorter stream")
    parser.add_argument("--json", type=Path, help="also write the measurements here")
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.count, args.fail_at = 1, 12_000, 2000
    from stator.driver.spark_session import create_session

    spark = create_session(
        SparkConfig(master="local[2]", conf={"spark.scheduler.mode": "FAIR"}), "regions-bench"
    )
    bench = Bench(args, spark)
    alternating = Alternating(args.runs)
    # region before failure-free: the failure-free window has the length of A's recovery in
    # the region run of the same round.
    contenders = ("region", "full", "failure-free")
    alternating.measure({name: functools.partial(bench.run, name) for name in contenders})
    free = alternating.runs_of("failure-free", "failure-free", "rec/s")
    what = (
        "two-region job, failure in A: B's committed records/s from A's first failed read "
        "to A's next epoch, vs the same window of a failure-free run"
    )
    region = alternating.runs_of("region", "region", "rec/s")
    full = alternating.runs_of("full", "full", "rec/s")
    rows = [
        Comparison(f"{what} (failover.strategy=region)", region, free, target=">= 0.9"),
        Comparison(f"{what} (failover.strategy=full)", full, free),
    ]
    print(table([c.row() for c in rows]))
    windows = [d["window_s"] for _, d in alternating.results["region"]]
    print(f"A's recovery window (region): median {statistics.median(windows):.1f} s")
    if args.json:
        dump = {n: [[v, d] for v, d in r] for n, r in alternating.results.items()}
        args.json.write_text(json.dumps(dump, indent=2))
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
