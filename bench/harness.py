"""How every comparison in ``bench/`` is measured and reported.

A comparison runs two contenders on the same input the same number of times (at least 3),
alternating A, B, A, B, ... so that drift of the machine (other load, a warming cache) falls
on both alike. Each run returns its measurement only after it checked its own output (a run
whose output is wrong raises: its time never counts). The report gives, per contender, the
median and the spread (min-max) of its runs, and the ratio of the medians.
"""

from __future__ import annotations

import compileall
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


class WrongOutput(AssertionError):
    """A benchmark run's output failed its check: the run does not count."""


@dataclass(frozen=True)
class Runs:
    """One contender's measurements (one number per run, in ``unit``)."""

    name: str
    unit: str
    values: tuple[float, ...]
    details: tuple[dict[str, Any], ...] = ()

    @property
    def median(self) -> float:
        return float(statistics.median(self.values))

    def cell(self, fmt: str = "{:,.0f}") -> str:
        lo, hi = min(self.values), max(self.values)
        return (
            f"{self.name}: {fmt.format(self.median)} {self.unit} "
            f"(min {fmt.format(lo)}, max {fmt.format(hi)}, n={len(self.values)})"
        )


@dataclass(frozen=True)
class Comparison:
    """``stator`` against ``peer``; ``higher_is_better`` decides which way the ratio reads
    (rates: stator / peer; times: peer / stator, so that > 1 always favours Stator)."""

    what: str  # exactly what was compared
    stator: Runs
    peer: Runs
    higher_is_better: bool = True
    target: str = ""
    fmt: str = "{:,.0f}"

    @property
    def ratio(self) -> float:
        a, b = self.stator.median, self.peer.median
        return a / b if self.higher_is_better else b / a

    def row(self) -> tuple[str, str, str, str]:
        target = f" (target {self.target})" if self.target else ""
        return (
            self.what,
            self.stator.cell(self.fmt),
            self.peer.cell(self.fmt),
            f"**{self.ratio:.2f}x**{target}",
        )


Measure = Callable[[], tuple[float, dict[str, Any]]]


@dataclass
class Alternating:
    """Runs contenders in turn; each call returns (value, details) of one checked run."""

    runs: int = 3
    log: Callable[[str], None] = print
    results: dict[str, list[tuple[float, dict[str, Any]]]] = field(default_factory=dict)

    def measure(self, contenders: dict[str, Measure]) -> dict[str, list[float]]:
        if self.runs < 1:
            raise ValueError("runs must be >= 1")
        for i in range(self.runs):
            for name, run in contenders.items():
                value, details = run()
                self.results.setdefault(name, []).append((value, details))
                self.log(f"  run {i + 1}/{self.runs} {name}: {value:,.3f} {details}")
        return {name: [v for v, _ in self.results[name]] for name in contenders}

    def runs_of(self, name: str, label: str, unit: str, detail: str = "") -> Runs:
        """A contender's runs: their values, or the number each run's details hold under
        ``detail`` (a second measure of the same checked runs)."""
        got = self.results[name]
        values = tuple(float(d[detail]) if detail else v for v, d in got)
        return Runs(label, unit, values, tuple(d for _, d in got))


def latency_percentiles(ms: np.ndarray, prefix: str = "") -> dict[str, float]:
    """p50, p90, p99 and max of per-record latencies in ms (in the order the records came),
    and ``drift_ms``: the last third's median minus the first third's, > 0 where latency
    grew over the window (the engine fell behind the input rate). Keys are ``p50_ms``, ...,
    or ``<prefix>_p50_ms``, ... with a prefix."""
    name = f"{prefix}_" if prefix else ""
    third = max(1, len(ms) // 3)
    return {
        f"{name}p50_ms": float(np.percentile(ms, 50)),
        f"{name}p90_ms": float(np.percentile(ms, 90)),
        f"{name}p99_ms": float(np.percentile(ms, 99)),
        f"{name}max_ms": float(ms.max()),
        f"{name}drift_ms": float(np.median(ms[-third:]) - np.median(ms[:third])),
    }


def table(rows: list[tuple[str, str, str, str]]) -> str:
    lines = ["| benchmark | Stator | peer | ratio of medians |", "|---|---|---|---|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def compile_sources(root: Path) -> None:
    """Byte-compile the runtime and the benchmark's pipelines before anything is timed.

    An installed runtime (the image, a wheel) has its bytecode; a checkout run with
    ``PYTHONDONTWRITEBYTECODE`` set has none, and every Python worker a case starts would
    compile Stator from source inside the timed run (profiled: 2-4% of a keyed count)."""
    for name in ("runtime", "bench"):
        compileall.compile_dir(root / name, quiet=1)
