"""Start the whole test bed, or parts of it, from pytest fixtures or from a plain script."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from .kafka import KafkaBroker
from .kube import KubeCluster
from .minio import MinioServer, S3Endpoint


@dataclass
class Bed:
    root: Path
    kube: KubeCluster | None = None
    minio: MinioServer | None = None
    kafka: KafkaBroker | None = None

    @property
    def s3(self) -> S3Endpoint:
        assert self.minio is not None and self.minio.endpoint is not None, "MinIO was not started"
        return self.minio.endpoint

    def describe(self) -> dict[str, str]:
        """Connection facts for humans and scripts; never includes the S3 secret."""
        out = {"root": str(self.root)}
        if self.kube:
            out |= {"KUBECONFIG": str(self.kube.kubeconfig), "kube_server": self.kube.server}
        if self.minio and self.minio.endpoint:
            out |= {
                "s3_endpoint": self.minio.endpoint.endpoint_url,
                "s3_access_key": self.minio.endpoint.access_key,
            }
        if self.kafka:
            out |= {"kafka_bootstrap": self.kafka.bootstrap_servers}
        return out


@contextmanager
def running(
    *, kube: bool = True, minio: bool = True, kafka: bool = True, root: Path | None = None
) -> Iterator[Bed]:
    """Start the requested components, each in its own directory; stop them all on exit."""
    with ExitStack() as stack:
        if root is None:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="stator-bed-")))
        bed = Bed(root)
        if minio:
            bed.minio = stack.enter_context(MinioServer(root / "minio"))
        if kafka:
            bed.kafka = stack.enter_context(KafkaBroker(root / "kafka"))
        if kube:
            bed.kube = stack.enter_context(KubeCluster(root / "kube"))
        yield bed
