"""The e2e suite's releasable generator (tests/pipelines/release.py): rate-limited until its
object exists, then the rest at once; the same records either way; it pickles without its
store client."""

from __future__ import annotations

import pickle
from pathlib import Path

from stator.sources import KeyedEvents
from tests.pipelines import release
from tests.pipelines.release import ReleasableGenerator


def test_the_rest_of_the_input_is_there_once_the_object_exists(
    tmp_path: Path,
) -> None:
    gen = ReleasableGenerator(
        KeyedEvents(5, seed=1),
        count=1000,
        splits=2,
        rate_per_second=10,
        release=f"file://{tmp_path}/release",
    )
    positions = {"gen-0": 0, "gen-1": 0}
    first = gen.plan(positions, budget=10_000, now_ms=0)
    assert sum(r.end - r.start for r in first) == 2, "one record per split at the start"
    held = gen.plan(positions, budget=10_000, now_ms=1000)
    assert sum(r.end - r.start for r in held) == 12, "the rate: 10 a second, plus the first"
    (tmp_path / "release").write_bytes(b"")
    gen._checked = -1e9  # the next plan looks again at once (it looks once a second)
    released = gen.plan(positions, budget=10_000, now_ms=1000)
    assert sum(r.end - r.start for r in released) == 1000 and all(r.final for r in released)
    plain = ReleasableGenerator(KeyedEvents(5, seed=1), count=1000, splits=2)
    assert [gen.read(r) for r in released] == [plain.read(r) for r in released]
    copy = pickle.loads(pickle.dumps(gen))  # noqa: S301 (our own bytes)
    assert copy._store is None and copy.read(released[0]) == gen.read(released[0])
    assert release.CHECK_EVERY_S >= 1
