# Stator: one distribution, two set-up commands (make demo, make test). See README.md.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON      ?= python3.11
UV_VERSION  := 0.13.9
STATOR_CACHE ?= $(HOME)/.cache/stator
UV_HOME     := $(STATOR_CACHE)/tools/uv-$(UV_VERSION)
UV          := $(UV_HOME)/bin/uv
VENV        := .venv
PY          := $(VENV)/bin/python
export STATOR_CACHE
export STATOR_UV := $(UV)
export PYSPARK_PYTHON := $(abspath $(PY))
export UV_CACHE_DIR ?= $(STATOR_CACHE)/uv

.PHONY: help install lock testbed images e2e-real e2e-real-ci test unit lint fmt demo demo-local bench clean kind-e2e

help:  ## list targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(UV):
	$(PYTHON) -m venv $(UV_HOME)
	$(UV_HOME)/bin/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

$(VENV)/.installed: requirements.lock pyproject.toml | $(UV)
	$(UV) venv --quiet --allow-existing --python $(PYTHON) $(VENV)
	$(UV) pip sync --quiet --compile-bytecode --python $(PY) requirements.lock
	$(UV) pip install --quiet --compile-bytecode --python $(PY) --no-deps -e .
	$(PY) -m compileall -q runtime operator
	$(PY) -m stator.cluster.cds || echo "warning: Spark's JVMs start without class-data archives"
	touch $@

install: $(VENV)/.installed  ## create .venv from the lock (reuses the uv cache)

lock:  ## re-resolve requirements.lock from pyproject.toml
	$(UV) pip compile --quiet pyproject.toml --extra dev --python-version 3.11 -o requirements.lock
	$(UV) pip compile --quiet pyproject.toml -c requirements.lock --python-version 3.11 -o images/runtime/requirements.lock
	$(UV) pip compile --quiet images/operator/requirements.in -c requirements.lock --python-version 3.11 -o images/operator/requirements.lock

testbed: install  ## build or reuse the pinned test bed components in $(STATOR_CACHE)
	$(PY) -m tests.testbed build

images: install  ## build the images from images/ with buildah (no registry needed), check them as containers
	$(PY) -m tests.testbed images $(IMAGES_ARGS)

e2e-real: testbed  ## the e2e suite on real kubelets (containerd, runc, CNI) with the images from images/
	$(PY) -m tests.e2e.real_nodes $(PYTEST_ARGS)

# The part of the real-node suite CI runs after `make test` (.ci/run), what fits its 90 minutes:
# an executor kill and a driver kill, a node loss, and an upgrade with a savepoint (about 12 min
# with the set-up). kubectl scale 4 -> 6 -> 3 (5 min more) runs in make e2e-real.
E2E_REAL_CI := \
  tests/e2e/test_executors.py::test_a_killed_executor_and_a_killed_driver_restore_from_local_copies \
  tests/e2e/test_executors.py::test_a_lost_node_reads_only_its_own_ranges_from_the_object_store \
  tests/e2e/test_flows.py::test_upgrade_by_savepoint_then_last_state_then_stateless
e2e-real-ci: testbed  ## what CI runs after make test: the image and real-node tests, the e2e subset on real nodes
	$(PY) -m pytest -m containers tests/integration $(PYTEST_ARGS)
	$(PY) -m tests.e2e.real_nodes $(E2E_REAL_CI) $(PYTEST_ARGS)

lint: install  ## ruff and mypy
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(VENV)/bin/hadolint images/*/Dockerfile
	$(VENV)/bin/hadolint tests/e2e/kind/Dockerfile.runtime-test
	$(VENV)/bin/shellcheck images/runtime/entrypoint.sh .ci/run tests/e2e/kind/run.sh

fmt: install  ## ruff format and the fixes ruff can make
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

test: testbed lint  ## every test, against the real test bed
	$(PY) -m pytest $(PYTEST_ARGS)

unit: install  ## fast tests that need no test bed
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

NODES ?= process
demo: testbed  ## the main job: operator + pipeline on the local control plane, crash, rescale (NODES=real: on real kubelets)
	$(PY) -m examples.operator_demo --nodes $(NODES)

demo-local: testbed  ## the runtime alone: a pipeline killed and restarted, output compared
	$(PY) -m examples.demo

bench: testbed  ## benchmarks; ratios against peers measured in the same run
	$(PY) -m bench

KIND_VERSION := v0.29.0
KIND_HOME   := $(STATOR_CACHE)/tools/kind-$(KIND_VERSION)
kind-e2e: install  ## needs Docker: the e2e suite on a kind cluster with the images from images/
	GOBIN=$(KIND_HOME) go install sigs.k8s.io/kind@$(KIND_VERSION)
	PATH="$(KIND_HOME):$$($(PY) -m tests.testbed path):$$PATH" tests/e2e/kind/run.sh $(PYTEST_ARGS)

clean:  ## remove the virtualenv and build litter (the tool cache stays)
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
