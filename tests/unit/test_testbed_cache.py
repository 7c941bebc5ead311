"""A half-built component is never taken as complete, and a failed build says how to retry."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

from tests.testbed import build as build_mod
from tests.testbed.build import BuildError, Component, Step
from tests.testbed.cache import is_complete, seal, staging
from tests.testbed.versions import PINS

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("STATOR_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_files_without_manifest_are_not_complete(tmp_path: Path) -> None:
    d = tmp_path / "c"
    (d / "bin").mkdir(parents=True)
    (d / "bin" / "tool").write_text("#!/bin/sh\n")
    assert not is_complete(d, ["bin/tool"])
    seal(d, {"component": "c"})
    assert is_complete(d, ["bin/tool"])
    (d / "bin" / "tool").write_text("")  # truncated file: not complete either
    assert not is_complete(d, ["bin/tool"])


def test_failed_build_leaves_previous_copy_untouched(tmp_path: Path) -> None:
    final = tmp_path / "comp"
    final.mkdir()
    (final / "old").write_text("keep me")
    with pytest.raises(RuntimeError), staging(final) as stage:
        (stage / "new").write_text("half")
        raise RuntimeError("boom")
    assert (final / "old").read_text() == "keep me"
    assert not list(tmp_path.glob(".comp.staging-*")), "the staging directory is removed"


def _failing_builder(stage: Path, step: Step) -> dict[str, object]:
    (stage / "bin").mkdir()
    (stage / "bin" / "x").write_text("partial")
    step.run("compile", [sys.executable, "-c", "import sys; print('bad flag'); sys.exit(3)"], stage)
    return {}


def test_build_error_names_component_version_step_and_retry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    comp = Component("fake", "v9.9.9", ("bin/x",), _failing_builder)
    monkeypatch.setitem(build_mod.COMPONENTS, "fake", comp)
    with pytest.raises(BuildError) as err:
        build_mod.ensure("fake", quiet=True)
    text = str(err.value)
    for expected in (
        "fake",
        "v9.9.9",
        "'compile'",
        "bad flag",
        "exited with 3",
        "python -m tests.testbed build fake",
    ):
        assert expected in text
    assert not comp.directory.exists(), "nothing half-built lands in the cache"
    assert not comp.ready()


def test_missing_output_is_a_build_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    comp = Component("empty", "1", ("bin/never",), lambda stage, step: {})
    monkeypatch.setitem(build_mod.COMPONENTS, "empty", comp)
    with pytest.raises(BuildError, match="verify outputs"):
        build_mod.ensure("empty", quiet=True)


def test_successful_build_is_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def builder(stage: Path, step: Step) -> dict[str, object]:
        calls.append(1)
        (stage / "out").write_text("ok")
        return {}

    comp = Component("good", "1", ("out",), builder)
    monkeypatch.setitem(build_mod.COMPONENTS, "good", comp)
    build_mod.ensure("good", quiet=True)
    build_mod.ensure("good", quiet=True)
    assert calls == [1]
    assert comp.ready()


def test_spark_pin_matches_pyproject() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"pyspark=={PINS.spark}" in deps
    lock = (ROOT / "requirements.lock").read_text().splitlines()
    assert f"pyspark=={PINS.spark}" in lock


def _pins(path: Path) -> dict[str, str]:
    found = (line.split("==", 1) for line in path.read_text().splitlines() if "==" in line)
    return {name.strip().lower(): version.strip() for name, version in found}


def test_image_locks_pin_what_the_tests_use() -> None:
    """The images install their own locks (the runtime's without the dev extra): every pin
    equals the main lock's, so an image never runs versions the suite did not test."""
    main = _pins(ROOT / "requirements.lock")
    for image in ("runtime", "operator"):
        pins = _pins(ROOT / "images" / image / "requirements.lock")
        assert pins, image
        drifted = {n: (v, main.get(n)) for n, v in pins.items() if main.get(n) != v}
        assert not drifted, f"images/{image}/requirements.lock differs (make lock): {drifted}"
    runtime = _pins(ROOT / "images" / "runtime" / "requirements.lock")
    assert "pytest" not in runtime and "mypy" not in runtime, "the runtime image has no dev tools"
