"""``python -m bench.autoscale``: the autoscaler against fixed parallelism, on Kafka input
whose rate steps 1x -> 6x -> 1x (``tests/pipelines/autoscale_kafka.py``: a keyed count that
waits 4 ms per record, 250 records/s per busy subtask; 1x is 100 records/s).

Three pipelines run side by side on the process test bed, each with its own topics and a
producer on the same schedule, executor pods of 2 cores: ``autoscaled`` (``spec.autoscaler``
from 1 to 6 replicas, the e2e test's settings), ``fixed-min`` (1 replica) and ``fixed-max``
(6). Every 2 s each one's replicas (status) and consumer lag (its running driver's
``/v1/job``: status is mirrored only until a rescale's savepoint) are recorded, and the
driver's counters (the autoscaler's samples: ``--record DIR`` keeps them, the unit tests
replay such series). A run counts only if every key's committed counts are exact. Rows:
the lag's p99 and maximum over the input, the seconds after the input ended until the lag was 0, and
the parallelism-seconds used while the input ran. The target (issue 44): lag bounded like
``fixed-max``'s with at most 60% of its parallelism-seconds. ``--plot FILE`` draws lag
and replicas over time (SVG).

``--cpu-record FILE`` records instead a scale-up that cannot help: the same job spinning
for its 4 ms of CPU per record (``STATOR_COST_MODE=spin``), fed more than it reads, at 4
replicas for 120 s and then, rescaled by ``kubectl scale``, at 8 on the same 2 cores
(recorded: about 300 records/s at 4, 344 at 8, against the 560 the key-group shares predict)."""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.plot import Series, line_chart
from bench.pods import OperatorBed, control_client
from tests.pipelines import autoscale_kafka as job

BASE = 100.0
SCHEDULE = job.Steps(((180, BASE), (120, 6 * BASE), (300, BASE)))
CONTENDERS: dict[str, dict[str, Any]] = {
    "autoscaled": {"replicas": 1, "autoscaler": job.AUTOSCALER},
    "fixed-min": {"replicas": 1},
    "fixed-max": {"replicas": job.AUTOSCALER["maxReplicas"]},
}


@dataclass
class Run:
    name: str
    topics: tuple[str, str]
    producer: job.Producer | None = None
    seen: list[tuple[float, int, int]] = field(default_factory=list)  # (t, replicas, lag)
    samples: list[dict[str, Any]] = field(default_factory=list)  # Sample.to_json, with t
    drained_s: float | None = None
    exact: str | None = "not checked"

    def row(self, seconds: float) -> dict[str, Any]:
        during = [lag for t, _, lag in self.seen if t <= seconds]
        used = sum(
            r * (t1 - t0)
            for (t0, r, _), (t1, _, _) in zip(self.seen, self.seen[1:], strict=False)
            if t1 <= seconds
        )
        return {
            "lag_p99": _p99(during),
            "lag_max": max(during, default=0),
            "drained_s": self.drained_s,
            "parallelism_s": round(used),
            "mean_replicas": round(used / seconds, 2),
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.autoscale", description=__doc__)
    parser.add_argument("--plot", type=Path, help="draw lag and replicas over time here (SVG)")
    parser.add_argument("--record", type=Path, help="keep each run's driver samples here")
    parser.add_argument("--json", type=Path, help="also write the measurements here")
    parser.add_argument("--drain-timeout", type=float, default=600.0)
    parser.add_argument("--cpu-record", type=Path, help="record a scale-up that cannot help")
    args = parser.parse_args(argv)
    if args.cpu_record:
        with OperatorBed(1, kafka=True) as space:
            args.cpu_record.write_text(json.dumps(_cpu_bound(space)))
        return 0
    with OperatorBed(1, kafka=True) as space:
        runs = [_start(space, name, spec) for name, spec in CONTENDERS.items()]
        for run in runs:
            assert run.producer is not None
            run.producer.start()
        started = time.monotonic()
        _watch(space, runs, started, SCHEDULE.seconds, args.drain_timeout)
        for run in runs:
            assert run.producer is not None
            assert run.producer.error is None, run.producer.error
            run.exact = job.exactly_once(
                space.kafka.bootstrap_servers, run.topics[1], run.producer.sent
            )
    rows = {run.name: run.row(SCHEDULE.seconds) for run in runs}
    _print(runs, rows)
    if args.plot:
        args.plot.write_text(_plot(runs))
    if args.record:
        args.record.mkdir(parents=True, exist_ok=True)
        for run in runs:
            (args.record / f"{run.name}.json").write_text(json.dumps(run.samples))
    if args.json:
        out = {r.name: {**rows[r.name], "seen": r.seen, "exact": r.exact} for r in runs}
        args.json.write_text(json.dumps(out, indent=1))
    return 0 if all(run.exact is None for run in runs) else 1


def _cpu_bound(space: Any) -> list[dict[str, Any]]:
    """Samples of a CPU-bound job at 4 replicas, then at 8 (the module docstring)."""
    run = _start(
        space,
        "cpu-bound",
        {"replicas": 4},
        job.Steps(((330, 1500.0),)),
        {"STATOR_COST_MODE": "spin"},
    )
    assert run.producer is not None
    run.producer.start()
    started = time.monotonic()
    _watch(space, [run], started, 120, 0)
    space.kube.kubectl("scale", "spl", run.name, "-n", space.name, "--replicas=8")
    space.wait(run.name, "at 8", lambda s: s.get("replicas") == 8 and not s.get("operation"))
    _watch(space, [run], started, time.monotonic() - started + 120, 0)
    return run.samples


def _start(
    space: Any,
    name: str,
    spec: dict[str, Any],
    schedule: job.Steps = SCHEDULE,
    extra_env: dict[str, str] | None = None,
) -> Run:
    tag = uuid.uuid4().hex[:6]
    bootstrap = space.kafka.bootstrap_servers
    run = Run(name, (f"{name}-in-{tag}", f"{name}-out-{tag}"))
    job.create_topics(bootstrap, *run.topics)
    env = {"STATOR_KAFKA": bootstrap, "STATOR_KAFKA_IN": run.topics[0], **(extra_env or {})}
    manifest = space.manifest(
        name,
        entrypoint="tests.pipelines.autoscale_kafka:pipeline",
        env={**env, "STATOR_KAFKA_OUT": run.topics[1]},
        maxParallelism=60,
        **spec,
    )
    manifest["spec"]["config"]["epoch.max_records"] = "3000"
    # The keyed function runs on the executors: what it reads of the environment goes there.
    executor_env = {"AWS_ENDPOINT_URL_S3": space.pod_s3, **(extra_env or {})}
    manifest["spec"]["executor"] = {
        "cores": 2,
        "memory": "512m",
        "env": [{"name": k, "value": v} for k, v in executor_env.items()],
    }
    space.apply(manifest)
    space.wait(name, "running", lambda s: s.get("phase") == "Running" and not s.get("operation"))
    run.producer = job.Producer(bootstrap, run.topics[0], schedule)
    return run


def _watch(space: Any, runs: list[Run], started: float, seconds: float, timeout: float) -> None:
    """Every 2 s: each run's replicas and lag, and its driver's counters; until the input
    ended and each run read it all (or ``timeout`` after the input ended)."""
    from stator.control.client import ControlHTTPError, ControlUnreachable
    from stator_operator.autoscaling.samples import Sample

    deadline = started + seconds + timeout
    while time.monotonic() < deadline:
        t = time.monotonic() - started
        for run in runs:
            status = space.status(run.name)
            replicas = int(status.get("replicas") or 0)
            lag = int(status.get("lagRecords") or 0)
            # The running driver's own answer: status is not mirrored while a flow runs.
            running = (status.get("deployment") or {}).get("driverPod")
            try:
                job_info = control_client(space, run.name, running).job()
            except (ControlUnreachable, ControlHTTPError, IndexError, KeyError):
                job_info = None  # between deployments: no driver answers
            if job_info is not None:
                lag = job_info.lag_records
                sample = Sample.of(job_info, time.time())
                run.samples.append({**sample.to_json(), "replicas": replicas})
            run.seen.append((round(t, 1), replicas, lag))
            busy = status.get("operation") or job_info is None
            if t > seconds and lag == 0 and run.drained_s is None and not busy:
                run.drained_s = round(t - seconds, 1)
        if t > seconds and all(run.drained_s is not None for run in runs):
            return
        time.sleep(max(0.0, started + t + 2 - time.monotonic()))


def _p99(values: list[int]) -> int:
    if len(values) < 2:
        return values[0] if values else 0
    return round(statistics.quantiles(values, n=100, method="inclusive")[98])


def _print(runs: list[Run], rows: dict[str, dict[str, Any]]) -> None:
    print(
        f"input: {', '.join(f'{r:.0f}/s for {s:.0f} s' for s, r in SCHEDULE.steps)} "
        f"(1 subtask reads 250/s); exact: "
        + ", ".join(f"{r.name} {r.exact or 'yes'}" for r in runs)
    )
    print(
        "| pipeline | lag p99 | lag max | drained after input (s) | parallelism-s | mean replicas |"
    )
    print("|---|---|---|---|---|---|")
    for name, row in rows.items():
        print(
            f"| {name} | {row['lag_p99']} | {row['lag_max']} | {row['drained_s']} | "
            f"{row['parallelism_s']} | {row['mean_replicas']} |"
        )
    auto, top = rows["autoscaled"], rows["fixed-max"]
    share = auto["parallelism_s"] / top["parallelism_s"] if top["parallelism_s"] else 0.0
    print(
        f"autoscaled used {share:.0%} of fixed-max's parallelism-seconds (target <= 60%); "
        f"lag max {auto['lag_max']} against fixed-max {top['lag_max']} and fixed-min "
        f"{rows['fixed-min']['lag_max']}"
    )


def _plot(runs: list[Run]) -> str:
    colors = {"autoscaled": "#1f77b4", "fixed-min": "#d62728", "fixed-max": "#2ca02c"}
    lag = [Series(r.name, [(t, lag) for t, _, lag in r.seen], colors[r.name]) for r in runs]
    replicas = [Series(r.name, [(t, n) for t, n, _ in r.seen], colors[r.name]) for r in runs]
    steps = [(0.0, SCHEDULE.steps[0][1])]
    elapsed = 0.0
    for seconds, rate in SCHEDULE.steps:
        steps += [(elapsed, rate), (elapsed + seconds, rate)]
        elapsed += seconds
    given = [Series("input records/s", steps, "#7f7f7f")]
    return line_chart(
        "Kafka input 1x -> 6x -> 1x: autoscaled against fixed parallelism",
        [("consumer lag (records)", lag), ("replicas", replicas), ("input (records/s)", given)],
        x_label="seconds since the input began",
    )


if __name__ == "__main__":
    raise SystemExit(main())
