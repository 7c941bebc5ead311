"""The job the placement tests run on executor JVMs, and its reference: the same job on
``local[2]`` with a Spark job per epoch, run in a subprocess (one process has one
SparkContext), whose output by epoch every cluster run must equal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from stator import Pipeline
from stator.config import SparkConfig, load_config
from stator.sinks import CollectSink
from stator.sources import GeneratorSource, KeyedEvents

RECORDS, PER_EPOCH, PARALLELISM = 360, 30, 3  # 12 epochs


def pipeline(sink: CollectSink) -> Pipeline:
    p = Pipeline("placed", max_parallelism=24)
    (
        p.source(GeneratorSource(KeyedEvents(30), count=RECORDS, splits=2), uid="events")
        .key_by(lambda e: e[0])
        .count(uid="count")
        .sink(sink, uid="out")
    )
    return p


def job_config(root: Path, *extra: str) -> Any:
    return load_config(
        None,
        [
            f"checkpoint.storage=file://{root}/ck",
            f"state.local_dir={root}/state",
            f"epoch.max_records={PER_EPOCH}",
            "checkpoint.every_epochs=4",
            f"parallelism={PARALLELISM}",
            *extra,
        ],
    )


def run_reference(root: str) -> None:
    """In a subprocess: the same job on local[2]; prints its output by epoch as JSON."""
    from stator.driver.spark_session import create_session

    spark = create_session(SparkConfig(master="local[2]"), "placement-reference")
    sink = CollectSink()
    pipeline(sink).run(job_config(Path(root)), spark)
    print("OUTPUT " + json.dumps({str(k): v for k, v in sorted(sink.by_epoch.items())}))
    spark.stop()


def reference_run(root: Path) -> Iterator[Callable[[], Any]]:
    """Start the reference at once (beside a cluster's start); yields its output on demand."""
    ref = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from {__name__} import run_reference; run_reference({str(root)!r})",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=os.environ.copy(),
        cwd=Path(__file__).parents[2],
    )
    result: list[Any] = []

    def output() -> Any:
        if not result:
            out, _ = ref.communicate(timeout=600)
            assert ref.returncode == 0
            line = next(x for x in out.splitlines() if x.startswith("OUTPUT "))
            result.append(json.loads(line[len("OUTPUT ") :]))
        return result[0]

    yield output
    if ref.poll() is None:
        ref.kill()
        ref.wait()


def as_json(sink: CollectSink) -> Any:
    return json.loads(json.dumps({str(k): v for k, v in sorted(sink.by_epoch.items())}))
