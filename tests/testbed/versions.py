"""Pinned versions of every test bed component: the one place to bump them.

A component's cache directory is keyed by its version and by a digest of its build
recipe, so changing either builds a fresh copy next to the old one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Pins:
    """Versions the test bed builds. Strings are exactly what the registries publish."""

    kubernetes: str = "v1.33.13"
    # Kubernetes 1.33 recommends etcd 3.5.x; the wrapper module builds it separately so that
    # the API server's etcd client is not bumped by minimal version selection.
    etcd: str = "v3.5.35"
    helm: str = "v3.21.4"
    # Cluster DNS of the real-node bed (its go.mod has no replace directives: go install works).
    coredns: str = "v1.13.2"
    # MinIO is archived and source-only: pinned to its last commit on the Go module proxy.
    minio: str = "v0.0.0-20260212201848-7aac2a2c5b7c"
    minio_release_tag: str = "RELEASE.2026-02-12T20-18-48Z"
    # Kafka 3.9.x: Spark 4.0.0's Kafka connector is built against kafka-clients 3.9.0.
    kafka: str = "3.9.2"
    kafka_scala: str = "2.13"
    reload4j: str = "1.2.27"
    slf4j: str = "1.7.36"
    # Must equal the pyspark pin in pyproject.toml; checked by tests/unit/test_testbed_cache.py.
    spark: str = "4.0.0"


PINS = Pins()
