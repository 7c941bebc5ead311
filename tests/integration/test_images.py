"""The images built from ``images/`` as shipped (``make images``: buildah, a locally made
Debian base, no registry) run as hardened containers: the runtime image runs a driver to its
exact output and an executor through its entrypoint, the operator image runs the operator.
Builds reuse the layer cache in the tool cache, so only layers after a change are rebuilt."""

from __future__ import annotations

import pytest

from tests.testbed import image_checks, images

pytestmark = [pytest.mark.testbed, pytest.mark.containers]


@pytest.fixture(scope="module")
def store() -> images.Store:
    built = images.Store()
    images.build_all(built)
    return built


def test_the_runtime_image_runs_a_driver_to_its_exact_output(store: images.Store) -> None:
    image_checks.check_driver(store, f"localhost/{images.RUNTIME_TEST.tag}")


def test_the_runtime_image_runs_an_executor_through_its_entrypoint(store: images.Store) -> None:
    image_checks.check_executor(store, f"localhost/{images.RUNTIME.tag}")


def test_the_operator_image_runs_the_operator(store: images.Store) -> None:
    image_checks.check_operator(store, f"localhost/{images.OPERATOR.tag}")
