"""The operator image installs only images/operator/requirements.lock: everything the operator
imports, eagerly or lazily, must be in it (a missing one would crash the operator in a cluster
the first time it inspects a checkpoint)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Every module the operator imports, including the runtime modules it imports lazily.
IMPORTS = """
import stator_operator.__main__, stator_operator.handlers, stator_operator.flows
import stator_operator.k8s, stator_operator.resources, stator_operator.observer
import stator_operator.reconciler, stator_operator.storage, stator_operator.status
import stator_operator.pipeline
from stator.config import JobConfig, build
from stator.control.client import ControlClient
from stator.errors import ConfigError, StatorError
from stator.lineage import load_target
from stator.lineage import check_restorable, dispose_savepoint, find_savepoint
from stator.storage import S3Options, open_store
"""


def _uv() -> str:
    found = os.environ.get("STATOR_UV") or shutil.which("uv")
    if not found:
        cache = os.environ.get("STATOR_CACHE", str(Path.home() / ".cache" / "stator"))
        found = next(iter(sorted(glob.glob(f"{cache}/tools/uv-*/bin/uv"))), None)
    if not found:
        pytest.fail("uv not found: run through `make test`, which installs it")
    return found


def test_operator_runs_on_its_image_lock_alone(tmp_path: Path) -> None:
    uv, venv = _uv(), tmp_path / "venv"
    python = venv / "bin" / "python"
    subprocess.run([uv, "venv", "--quiet", "--python", "3.11", str(venv)], check=True)
    lock = ROOT / "images" / "operator" / "requirements.lock"
    subprocess.run([uv, "pip", "sync", "--quiet", "--python", str(python), str(lock)], check=True)
    subprocess.run(
        [uv, "pip", "install", "--quiet", "--no-deps", "--python", str(python), str(ROOT)],
        check=True,
    )
    result = subprocess.run(
        [str(python), "-c", IMPORTS], capture_output=True, text=True, cwd=tmp_path, check=False
    )
    assert result.returncode == 0, result.stderr
    result = subprocess.run(
        [str(python), "-c", "import pyspark"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode != 0, "the operator image stays without Spark"
