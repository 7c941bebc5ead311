"""``make e2e-real`` and CI's ``make e2e-real-ci`` run ``python -m tests.e2e.real_nodes``: a
module that defines ``main`` but never calls it exits 0 having run nothing (it did, for a
stop: CI passed without the suite on real nodes). ``--help`` goes through ``main`` and
starts nothing."""

from __future__ import annotations

import subprocess
import sys

from tests.e2e import real_nodes


def test_running_the_module_runs_main() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.e2e.real_nodes", "--help"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=real_nodes.ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert "on real kubelets" in done.stdout
