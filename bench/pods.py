"""``python -m bench.pods``: executors as pods on the local test bed, against their peers in
the same run (``bench/harness.py``: alternating runs, medians and spread, checked output).

1. ``recovery``: an executor holding all of a job's keyed state (``--state-bytes``, 1 GiB by
   default) loses its pod. Stator with task-local recovery (the executor's state on a claim
   of a local volume, ``localRecovery.pinning: required``) against the same job without it
   (state in the pod's emptyDir, local recovery off: the replacement executor reads the
   checkpoint from MinIO, as Spark's own state store does). Both pipelines run side by side
   and lose their executor pod in turn; the time counts from the pod's deletion to the end of
   the first epoch that ran the lost executor's subtask elsewhere: its state restored, that
   epoch's records processed and committed (processing again; epochs that end before the
   pod's processes are gone do not count). A second row of the same runs counts one epoch
   more (``next_epoch_s``: the job's pace just after the recovery). A run counts
   only if the restore read what it should from MinIO: nothing with local recovery (the
   replacement may reopen its database, or restore its local copy), the whole state without.
1b. ``standby``: the same with one keyed subtask on two executor pods of one core each:
   ``localRecovery.standby`` (the other executor keeps a standby copy of the subtask's
   latest checkpoint, and resumes it from there) against local recovery off (the other
   executor reads the checkpoint from MinIO) and against local recovery without standby
   copies (the subtask waits for the replacement pod, which finds its local copy). The
   executor that runs the subtask is deleted; a standby run counts only if it read under a
   tenth of the state from MinIO, a local one only if it read nothing, a MinIO run only if it
   read the state. Before each run every contender waits for two running executors and 30 s
   per GiB of state more (time for a standby copy to be made in the background; untimed).
   Every contender in both cases is killed only once no checkpoint upload is in flight (the
   backlog of compaction output that writing the state leaves is uploaded; untimed).
   Checkpoint uploads are synchronous unless ``--async-uploads`` (``standby``'s comment says
   why).
   ``--kill sigkill`` (both cases): SIGKILL the executor's processes instead of deleting its
   pod; its container restarts in its pod, as after a crash or an out-of-memory kill.
2. ``throughput``: a keyed count of ``--count`` events over ``--keys`` keys, to the end of its
   input, with two executor pods of one core each against ``local[*]`` in the driver pod, on
   the same two cores. Rate over the epochs after the first (Spark's start-up left out, the
   same for both); a run counts only if the committed counts are exact.
3. ``rescale``: ``kubectl scale`` of a running pipeline with small state (a rate-limited keyed
   count, ``local[*]`` in the driver pod), 2 -> 3 -> 2 ..., with the new driver pre-started
   (``driver.prestart: true``, the default) against the same pipeline without
   (``driver.prestart: false``); both run side by side and rescale in turn. The value is the
   downtime the operator reports (``status.lastOperation.downtimeSeconds``: from the savepoint
   step's start to the end of the new driver's first epoch). A run counts only if the new
   driver restored from the rescale's savepoint, through the flow it should have taken; at
   the end both pipelines run to the end of their input and their committed counts must be
   exact, else no row is printed.

MinIO, the API server and every pod share this machine's cores with the job.
"""

from __future__ import annotations

import argparse
import base64
import functools
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.harness import Alternating, Comparison, WrongOutput, compile_sources, table

if TYPE_CHECKING:
    from stator.control.schema import JobInfo, PlacedSubtask

ROOT = Path(__file__).resolve().parent.parent
MULT, SEED = 2654435761, 1
FILL_EPOCH_BYTES = 1 << 30


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pods", description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--state-bytes", type=int, default=1 << 30)
    parser.add_argument("--value-bytes", type=int, default=4096)
    parser.add_argument("--count", type=int, default=1_500_000)
    parser.add_argument("--keys", type=int, default=50_000)
    parser.add_argument(
        "--only",
        nargs="*",
        default=["recovery", "standby", "throughput", "rescale", "rescale-pods"],
        choices=["recovery", "standby", "throughput", "rescale", "rescale-pods"],
    )
    parser.add_argument(
        "--async-uploads",
        action="store_true",
        help="standby: asynchronous checkpoint uploads (the default of a pipeline) for every "
        "contender, instead of synchronous ones",
    )
    parser.add_argument(
        "--kill",
        choices=["delete", "sigkill"],
        default="delete",
        help="recovery, standby: how the executor is lost: its pod force-deleted (the "
        "StatefulSet makes it again), or its processes SIGKILLed (its container restarts)",
    )
    parser.add_argument("--json", type=Path, help="also write the measurements here")
    args = parser.parse_args(argv)
    compile_sources(ROOT)
    with OperatorBed(_volume_gi(args.state_bytes)) as space:
        rows, results = [], {}
        if "recovery" in args.only:
            for key, c in zip(
                ("recovery", "recovery-next-epoch"), recovery(space, args), strict=True
            ):
                rows.append(c.row())
                results[key] = _dump(c)
        if "standby" in args.only:
            keys = ("standby", "standby-next-epoch", "standby-vs-replacement")
            for key, c in zip(keys, standby(space, args), strict=True):
                rows.append(c.row())
                results[key] = _dump(c)
        if "throughput" in args.only:
            c = throughput(space, args)
            rows.append(c.row())
            results["throughput"] = _dump(c)
        if "rescale" in args.only:
            c = rescale(space, args)
            rows.append(c.row())
            results["rescale"] = _dump(c)
        if "rescale-pods" in args.only:
            c = rescale(space, args, executors=True)
            rows.append(c.row())
            results["rescale-pods"] = _dump(c)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


def _dump(c: Comparison) -> dict[str, Any]:
    return {
        "what": c.what,
        "ratio": c.ratio,
        "stator": {"values": c.stator.values, "details": c.stator.details},
        "peer": {"values": c.peer.values, "details": c.peer.details},
    }


# ---------------------------------------------------------------------------- the test bed


def _volume_gi(state_bytes: int) -> int:
    """Size of each local volume and claim: room for the recovery case's state, its
    checkpoints' local copies (hard links, mostly) and compactions, with a margin."""
    return max(4, -(-3 * state_bytes // (1 << 30)))


class OperatorBed:
    """The test bed with the operator running, and one namespace with a bucket (and Kafka:
    ``space.kafka``, when asked for)."""

    def __init__(self, volume_gi: int, kafka: bool = False) -> None:
        self.volume_gi = volume_gi
        self.kafka = kafka

    def __enter__(self) -> Any:
        from contextlib import ExitStack

        from tests.e2e.cluster import (
            LOCAL_STORAGE_CLASS,
            Space,
            create_credentials,
            launch_operator,
            render_and_apply,
            wait_for_crd,
        )
        from tests.testbed.bed import running
        from tests.testbed.nodeagent import NodeAgent

        self.stack = ExitStack()
        bed = self.stack.enter_context(running(kafka=self.kafka))
        kube = bed.kube
        assert kube is not None
        work = Path(tempfile.mkdtemp(prefix="bench-pods-"))
        agent = NodeAgent(
            kube.kubeconfig,
            work / "agent",
            nodes=["node-0", "node-1", "node-2"],
            extra_env={"PYTHONPATH": str(ROOT), "PYSPARK_PYTHON": sys.executable},
        ).start()
        self.stack.callback(agent.stop)
        agent.provide_local_volumes(
            LOCAL_STORAGE_CLASS, per_node=4, capacity=f"{2 * self.volume_gi}Gi"
        )
        ns = f"bench-{uuid.uuid4().hex[:6]}"
        render_and_apply(kube, [ns])
        wait_for_crd(kube)
        (work / "operator").mkdir(parents=True)
        op = launch_operator(kube, work / "operator", [ns])
        op.start()
        self.stack.callback(op.stop)
        bed.s3.client().create_bucket(Bucket=ns)
        create_credentials(kube, ns, bed.s3)
        space = Space(ns, ns, bed.s3, kube)
        space.storage_class = LOCAL_STORAGE_CLASS  # type: ignore[attr-defined]
        space.agent = agent  # type: ignore[attr-defined]
        space.kafka = bed.kafka  # type: ignore[attr-defined]
        return space

    def __exit__(self, *exc: object) -> None:
        self.stack.close()


def _manifest(space: Any, name: str, entrypoint: str, env: dict[str, Any], **spec: Any) -> Any:
    manifest = space.manifest(name, env=env, entrypoint=entrypoint, **spec)
    manifest["spec"]["driver"]["env"] = [
        e for e in manifest["spec"]["driver"]["env"] if e["name"] != "COUNTS_OUT"
    ] + [{"name": "OUT", "value": f"s3://{space.bucket}/{name}/out"}]
    return manifest


def _executors(space: Any, cores: int, instances: int, memory: str = "1g") -> dict[str, Any]:
    return {
        "cores": cores,
        "instances": instances,
        "memory": memory,
        "env": [{"name": "AWS_ENDPOINT_URL_S3", "value": space.pod_s3}],
    }


def control_client(space: Any, name: str, pod_name: str | None = None) -> Any:
    """The control API of the pipeline's newest driver, or of driver pod ``pod_name``."""
    from stator.control.client import ControlClient

    pods = space.driver_pods(name)
    pod = next((p for p in pods if p["metadata"]["name"] == pod_name), None) or pods[-1]
    token = space.kube.kubectl_json("get", "secret", f"{name}-control", "-n", space.name)
    secret = base64.b64decode(token["data"]["token"]).decode()
    return ControlClient(f"http://{pod['status']['podIP']}:8081", token=secret)


def _poll(what: str, check: Any, timeout: float, every: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = check()
        except Exception:  # the driver may be between pods: look again
            got = None
        if got:
            return got
        time.sleep(every)
    raise TimeoutError(what)


# ---------------------------------------------------------------------------- 1. recovery


PROCESSING_AGAIN = (
    "time until the job processes again (the end of the first epoch that ran the subtask "
    "elsewhere: restored, its records processed and committed)"
)
NEXT_EPOCH = "the same runs, counted to the end of the epoch after that one"


def recovery(space: Any, args: argparse.Namespace) -> list[Comparison]:
    """Case 1: one executor of two cores holds both keyed subtasks."""
    shape = {"replicas": 2, "executor": _executors(space, cores=2, instances=1, memory="1g")}
    contenders = {"local": {"volume": _volume(space, args)}, "remote": {"enabled": False}}
    runs, state_gb = _recovery_runs(space, args, contenders, shape)
    return _processing_again(
        runs,
        f"an executor pod holding {state_gb:.2f} GB of keyed state {_lost(args)}",
        "task-local recovery on a local volume vs the state restored from MinIO",
        ("local", "local volume"),
        ("remote", "from MinIO"),
    )


def _processing_again(
    runs: Alternating, lost: str, versus: str, stator: tuple[str, str], peer: tuple[str, str]
) -> list[Comparison]:
    """A recovery case's row (to the end of the first epoch that ran the subtask elsewhere)
    and the same runs counted one epoch more; ``stator``, ``peer``: (contender, label)."""
    return [
        Comparison(
            f"{lost}: {PROCESSING_AGAIN}; {versus}",
            runs.runs_of(*stator, "s"),
            runs.runs_of(*peer, "s"),
            higher_is_better=False,
            target=">= 5x",
            fmt="{:.1f}",
        ),
        Comparison(
            f"{lost}: {NEXT_EPOCH}; {versus}",
            runs.runs_of(*stator, "s", "next_epoch_s"),
            runs.runs_of(*peer, "s", "next_epoch_s"),
            higher_is_better=False,
            fmt="{:.1f}",
        ),
    ]


def standby(space: Any, args: argparse.Namespace) -> list[Comparison]:
    """Case 1b: one keyed subtask, two executors of one core; three contenders."""
    shape = {"replicas": 1, "executor": _executors(space, cores=1, instances=2, memory="1g")}
    volume = _volume(space, args)
    contenders = {
        "standby": {"volume": volume, "standby": True},
        "local-2": {"volume": volume},
        "remote-2": {"enabled": False},
    }
    # Synchronous uploads by default: each epoch's checkpoint completes with it, so a retry
    # of the lost subtask's task restores at once. With asynchronous ones (--async-uploads),
    # whether the job must first rewind depends on whether the kill lands before the epoch's
    # checkpoint completed: a rewind (the restart, the survey, the epochs since the
    # checkpoint again) that costs any contender seconds, at random.
    shape["checkpointing"] = {"asyncUpload": args.async_uploads}
    runs, state_gb = _recovery_runs(space, args, contenders, shape)
    lost = (
        f"the executor pod holding a keyed subtask's {state_gb:.2f} GB of state {_lost(args)} "
        f"(two executor pods of one core, {'a' if args.async_uploads else ''}synchronous "
        f"checkpoint uploads)"
    )
    what = f"{lost}: {PROCESSING_AGAIN}; the other executor resumes it from its standby copy vs"
    return [
        *_processing_again(
            runs,
            lost,
            "the other executor resumes it from its standby copy vs from MinIO (local recovery "
            "off)",
            ("standby", "standby copy"),
            ("remote-2", "from MinIO"),
        ),
        Comparison(
            f"{what} the replacement executor's local copy (local recovery without standby: "
            f"the subtask waits for the replacement pod)",
            runs.runs_of("standby", "standby copy", "s"),
            runs.runs_of("local-2", "replacement's local copy", "s"),
            higher_is_better=False,
            fmt="{:.1f}",
        ),
    ]


def _volume(space: Any, args: argparse.Namespace) -> dict[str, str]:
    return {"storageClassName": space.storage_class, "size": f"{_volume_gi(args.state_bytes)}Gi"}


def _recovery_runs(
    space: Any, args: argparse.Namespace, contenders: dict[str, Any], shape: dict[str, Any]
) -> tuple[Alternating, float]:
    """Cases 1 and 1b: the pipelines (``contenders``: name -> ``localRecovery``) with their
    state written, then each loses an executor in turn."""
    keys = args.state_bytes // args.value_bytes
    env = {"KEYS": keys, "VALUE_BYTES": args.value_bytes, "RATE": 100}
    for name, local in contenders.items():
        # The state is written in epochs of at most 1 GiB: a keyed task holds its epoch's
        # records and values in memory (three pipelines writing 4 GiB each in one epoch were
        # killed for memory on this 24 GiB machine).
        config = {"epoch.max_records": str(min(keys, FILL_EPOCH_BYTES // args.value_bytes))}
        if name.startswith("local"):  # it waits for the replacement pod: 20 s (the default)
            # is not always enough on this loaded machine, and then it reads MinIO
            config["local_recovery.executor_wait_ms"] = "60000"
        spec = {k: v for k, v in shape.items() if k != "checkpointing"}
        manifest = _manifest(
            space,
            name,
            "bench.pipelines:big_state",
            env,
            config=config,
            failover={"restartDelaySeconds": 0.2},
            localRecovery=local,
            **spec,
        )
        manifest["spec"]["checkpointing"].update(shape.get("checkpointing", {}))
        space.apply(manifest)
    for name in contenders:
        space.wait(
            name,
            "the state written and checkpointed",
            lambda s: (
                s.get("phase") == "Running"
                and s.get("latestCheckpoint", {}).get("stateBytes", 0)
                >= 0.9 * keys * args.value_bytes
            ),
            timeout=900,
        )
        print(f"{name}: {space.status(name)['latestCheckpoint']}", file=sys.stderr)
    runs = Alternating(args.runs, log=lambda line: print(line, file=sys.stderr))
    runs.measure(
        {
            name: functools.partial(_lose_executor, space, name, args.kill, _settle_s(args))
            for name in contenders
        }
    )
    for name in contenders:
        space.kube.kubectl("delete", "statefulpipeline", name, "-n", space.name, "--wait=false")
    return runs, keys * args.value_bytes / 1e9


def _lost(args: argparse.Namespace) -> str:
    if args.kill == "sigkill":
        return "is SIGKILLed (its container restarts in its pod)"
    return "is deleted"


def _settle_s(args: argparse.Namespace) -> float:
    """Untimed wait before each run of the two-executor contenders: time for a new standby
    copy (the whole state, read from MinIO in the background) to be made; 30 s per GiB."""
    return 30.0 * max(1.0, int(args.state_bytes) / (1 << 30))


def _lose_executor(
    space: Any, name: str, kill: str, settle_s: float
) -> tuple[float, dict[str, Any]]:
    """Delete the pipeline's executor pod that runs its keyed subtask (or SIGKILL its
    processes, ``kill``); time until the job completed the first epoch that ran the subtask
    elsewhere (and, in the details, the epoch after it); check where the restore read
    from."""
    if name.endswith(("standby", "-2")):  # untimed, for every contender alike
        _poll(f"{name}: two executors", lambda: len(_running_executors(space, name)) == 2, 300)
        time.sleep(settle_s)
    driver = control_client(space, name)
    # Untimed, for every contender alike: the uploads have caught up. Writing the state
    # leaves gigabytes of compaction output to upload; an executor lost in that backlog fails
    # the checkpoints in flight and the job rewinds past them, which the steady state after
    # it does not (its checkpoints upload kilobytes), so the kill lands with none in flight.
    _poll(
        f"{name}: no checkpoint upload in flight",
        lambda: not driver.checkpoints().in_flight,
        900,
    )
    before = driver.job()
    [subtask, *_] = _placed(before)
    pod = space.kube.kubectl_json(
        "get",
        "pods",
        "-n",
        space.name,
        "-l",
        f"stator.dev/pipeline={name},spark-role=executor,spark-exec-id={subtask.executor}",
    )["items"][0]["metadata"]["name"]
    epoch = before.epoch
    t0 = time.monotonic()
    if kill == "sigkill":
        os.killpg(space.agent.pods[f"{space.name}/{pod}"].proc.pid, signal.SIGKILL)
    else:
        space.kube.kubectl("delete", "pod", pod, "-n", space.name, "--grace-period=0", "--force")
    # Epochs go on until the pod's processes are gone: the job processes again once an epoch
    # ran the subtask on another executor (a replacement has a new id) and completed.
    restored = _poll(
        f"{name} moved off executor {subtask.executor}",
        lambda: _moved(driver.job(), subtask.executor),
        600,
    )
    first = time.monotonic() - t0
    after = _poll(
        f"{name} processing again",
        lambda: (j := driver.job()).epoch > restored.epoch and j,
        timeout=600,
    )
    read = _restored(after)[1] - _restored(before)[1]
    details = {
        "epoch": epoch,
        "next_epoch_s": round(time.monotonic() - t0, 1),
        "remote_bytes": read,
        "local_restores": _restored(after)[0] - _restored(before)[0],
        # What standby copies read from MinIO since the driver started (their cost).
        "standby_copy_bytes": after.standby_copies.bytes if after.standby_copies else 0,
    }
    state = after.latest_checkpoint.state_bytes if after.latest_checkpoint else 0
    if name.startswith("local") and read:
        raise WrongOutput(f"task-local recovery read {read} bytes from MinIO")
    if name == "standby" and (read > 0.1 * state or not details["local_restores"]):
        raise WrongOutput(f"the standby copy's restore read {read} bytes from MinIO of {state}")
    if name.startswith("remote") and read < 0.9 * state:
        raise WrongOutput(f"read {read} bytes from MinIO, the state is {state}")
    # The executor is back (its replacement registered) before the next run; with two, it
    # has also made its standby copy (the whole state from MinIO, in the background) before
    # the next run begins.
    time.sleep(3)
    return first, details


def _placed(job: JobInfo) -> tuple[PlacedSubtask, ...]:
    """The first keyed operator's subtasks, where they run."""
    assert job.placement is not None, "executors as pods have a placement"
    return next(iter(job.placement.subtasks.values()))


def _restored(job: JobInfo) -> tuple[int, int]:
    """(local restores, bytes restores read from the object store) since the driver started."""
    return (job.restores.local, job.restores.remote_bytes) if job.restores else (0, 0)


def _moved(job: JobInfo, executor: str) -> JobInfo | None:
    [subtask, *_] = _placed(job)
    return job if subtask.executor != executor else None


def _running_executors(space: Any, name: str) -> list[Any]:
    pods = space.kube.kubectl_json(
        "get", "pods", "-n", space.name, "-l", f"stator.dev/pipeline={name},spark-role=executor"
    )["items"]
    return [p for p in pods if p["status"].get("phase") == "Running"]


# ---------------------------------------------------------------------------- 2. throughput


def throughput(space: Any, args: argparse.Namespace) -> Comparison:
    expected = _expected_counts(args.count, args.keys)
    runs = Alternating(args.runs, log=lambda line: print(line, file=sys.stderr))
    modes = {
        "pods": {"executor": _executors(space, cores=1, instances=2)},
        "local": {},
    }
    runs.measure(
        {
            mode: functools.partial(_count_run, space, args, mode, spec, expected)
            for mode, spec in modes.items()
        }
    )
    return Comparison(
        f"keyed count, {args.count:,} events over {args.keys:,} keys, checkpoint every epoch "
        f"on MinIO: two executor pods of one core vs local[*] in the driver pod (2 cores)",
        runs.runs_of("pods", "executor pods", "events/s"),
        runs.runs_of("local", "local[*]", "events/s"),
        target=">= 0.8",
    )


def _count_run(
    space: Any, args: argparse.Namespace, mode: str, spec: dict[str, Any], expected: Counter[str]
) -> tuple[float, dict[str, Any]]:
    from stator.sinks import read_committed
    from stator.storage import S3Options

    name = f"count-{mode}-{uuid.uuid4().hex[:4]}"
    env = {"COUNT": args.count, "KEYS": args.keys}
    config = {"epoch.max_records": "150000"}
    space.apply(
        _manifest(space, name, "bench.pipelines:counts", env, replicas=2, config=config, **spec)
    )
    _poll(
        f"{name} driver", lambda: space.driver_pods(name) and control_client(space, name).job(), 300
    )
    driver = control_client(space, name)
    first = _poll(f"{name} first epoch", lambda: (j := driver.job()).epoch >= 1 and j, 300, 0.05)
    t1 = time.monotonic()
    last = _poll(
        f"{name} done",
        lambda: (j := driver.job()).records_in >= args.count and j,
        900,
        0.05,
    )
    seconds = time.monotonic() - t1
    rate = (last.records_in - first.records_in) / seconds
    space.wait(name, "finished", lambda s: s.get("phase") == "Finished", timeout=300)
    opts = S3Options(
        endpoint_url=space.s3.endpoint_url,
        access_key_id=space.s3.access_key,
        secret_access_key=space.s3.secret_key,
    )
    final: dict[str, int] = {}
    for key, value in read_committed(f"s3://{space.bucket}/{name}/out", opts):
        final[key] = int(value)
    if final != dict(expected):
        raise WrongOutput(f"{name}: the committed counts differ from the input's")
    space.kube.kubectl("delete", "statefulpipeline", name, "-n", space.name, "--wait=false")
    return rate, {"seconds": seconds, "epochs": last["epoch"]}


# ---------------------------------------------------------------------------- 3. rescale

RESCALE_RATE = 400  # events/s per pipeline while it is rescaled


def rescale(space: Any, args: argparse.Namespace, executors: bool = False) -> Comparison:
    """``executors``: the pipelines' executors are pods (one core each, on local volumes),
    not ``local[*]`` in the driver pod."""
    from tests.e2e.counts_output import assert_exact, committed

    # Enough input for every rescale of both pipelines, which share the machine (with
    # executor pods a pre-started driver's executors took 4-5 minutes to start here, on two
    # cores beside both pipelines' executors).
    count = RESCALE_RATE * (120 + (900 if executors else 60) * args.runs)
    suffix = "-pods" if executors else ""
    contenders = {f"prestarted{suffix}": True, f"cold{suffix}": False}
    pods: dict[str, Any] = {}
    if executors:
        pods = {
            "executor": {"cores": 1, "env": _executors(space, 1, 1)["env"]},
            "localRecovery": {"volume": {"storageClassName": space.storage_class, "size": "1Gi"}},
            # A pre-started driver with executors of its own waits in STANDBY only once they
            # run: up to 5 minutes on this machine (not downtime), the default's limit.
            "failover": {"restartDelaySeconds": 0.5, "readinessTimeoutSeconds": 900},
        }
    for name, prestart in contenders.items():
        manifest = space.manifest(name, env={"COUNT": count, "RATE": RESCALE_RATE}, **pods)
        manifest["spec"]["driver"]["prestart"] = prestart
        space.apply(manifest)
    for name in contenders:
        space.wait(
            name,
            "running with a checkpoint",
            lambda s: s.get("phase") == "Running" and s.get("latestCheckpoint", {}).get("id", 0),
            timeout=600,
        )
    runs = Alternating(args.runs, log=lambda line: print(line, file=sys.stderr))
    runs.measure(
        {
            name: functools.partial(_rescale_once, space, name, prestart)
            for name, prestart in contenders.items()
        }
    )
    for name in contenders:  # the rest of the input at full speed (an upgrade), then the check
        env = space.get(name)["spec"]["driver"]["env"]
        env = [e for e in env if e["name"] != "RATE"] + [{"name": "RATE", "value": "100000"}]
        patch = {"spec": {"driver": {"env": env}}}
        space.kube.kubectl(
            "patch", "spl", name, "-n", space.name, "--type=merge", "-p", json.dumps(patch)
        )
    for name in contenders:
        space.wait(name, "finished", lambda s: s.get("phase") == "Finished", timeout=900)
        try:
            assert_exact(committed(space, name), count)
        except AssertionError as exc:
            raise WrongOutput(f"{name}: the committed counts are not exact: {exc}") from exc
        space.kube.kubectl("delete", "statefulpipeline", name, "-n", space.name, "--wait=false")
    where = "local[*] in the driver pod"
    if executors:
        where = "executors as pods of one core on local volumes"
    return Comparison(
        f"kubectl scale 2 <-> 3 of a running keyed count ({RESCALE_RATE} events/s, small "
        f"state, {where}): downtime from the old driver's last epoch of "
        f"records (its savepoint's epoch began) to the end of the new driver's first epoch "
        f"(status.lastOperation.downtimeSeconds); new driver pre-started (driver.prestart) vs "
        f"started after the old one stopped",
        runs.runs_of(f"prestarted{suffix}", "pre-started", "s"),
        runs.runs_of(f"cold{suffix}", "started after the stop", "s"),
        higher_is_better=False,
        target="<= 10 s",
        fmt="{:.1f}",
    )


def _rescale_once(space: Any, name: str, prestart: bool) -> tuple[float, dict[str, Any]]:
    """Scale to the other parallelism; the downtime the operator reports, once the new driver
    has run its first epoch. Checks the flow's steps and the restore source first."""
    before = space.status(name)
    replicas = 3 if before.get("replicas") == 2 else 2
    t0 = time.monotonic()
    space.kube.kubectl("scale", "spl", name, "-n", space.name, f"--replicas={replicas}")
    after = space.wait(
        name,
        f"rescaled to {replicas} and processing again",
        lambda s: (
            s.get("replicas") == replicas
            and not s.get("operation")
            and (s.get("lastOperation") or {}).get("downtimeSeconds") is not None
        ),
        timeout=600,
    )
    scale_to_processing = time.monotonic() - t0
    last = after["lastOperation"]
    restored = after["deployment"]["restoredFrom"]
    if last["kind"] != "rescale" or f"/{name}/savepoints/" not in restored:
        raise WrongOutput(f"{name}: {last['kind']} restored from {restored}, not a savepoint")
    if (last["stepSeconds"].get("prestart") is not None) is not prestart:
        raise WrongOutput(f"{name}: pre-start {prestart} expected, steps {last['stepSeconds']}")
    # The definition before the old driver reported when it stopped processing: from the
    # savepoint step, so including the epoch it still processed then.
    steps = last["stepSeconds"]
    step_ms = last["readyAtMs"] - 1000 * (last["totalSeconds"] - (steps.get("prestart") or 0))
    stopped_ms = last.get("processingStoppedAtMs")
    earlier = (stopped_ms - step_ms) / 1000 if stopped_ms else None
    details = {
        "replicas": replicas,
        "from_savepoint_step_s": (
            round(last["downtimeSeconds"] + earlier, 2) if earlier is not None else None
        ),
        "steps": steps,
        "startup": last["driverStartupSeconds"],
        "scale_to_processing_s": round(scale_to_processing, 1),
    }
    return float(last["downtimeSeconds"]), details


def _expected_counts(count: int, keys: int) -> Counter[str]:
    """The per-key counts of KeyedEvents(keys, seed=1), computed independently of Stator."""
    return Counter(f"k{((i * MULT + SEED) & 0xFFFFFFFF) % keys}" for i in range(count))


if __name__ == "__main__":
    sys.exit(main())
