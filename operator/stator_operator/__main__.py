"""``python -m stator_operator``: run the operator (in a cluster or against a kubeconfig).

Environment: STATOR_WATCH_NAMESPACES (comma-separated; empty: all namespaces),
STATOR_OPERATOR_HEALTH (liveness endpoint, default http://0.0.0.0:8080/healthz),
STATOR_LOG_LEVEL (INFO)."""

from __future__ import annotations

import logging
import os

import kopf
from kubernetes import config


def main() -> None:
    logging.basicConfig(
        level=os.environ.get("STATOR_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    from . import handlers  # noqa: F401, PLC0415 - registers the handlers

    namespaces = [n for n in os.environ.get("STATOR_WATCH_NAMESPACES", "").split(",") if n]
    kopf.run(
        standalone=True,
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=os.environ.get("STATOR_OPERATOR_HEALTH", "http://0.0.0.0:8080/healthz"),
    )


if __name__ == "__main__":
    main()
