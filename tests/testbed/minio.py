"""A real S3 server (MinIO) on loopback, with credentials generated for each run."""

from __future__ import annotations

import secrets
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .build import ensure
from .procs import LOOPBACK, ManagedProcess, free_port

REGION = "us-east-1"


@dataclass
class S3Endpoint:
    """What an S3 client needs. ``secret_key`` is a credential: never log it."""

    endpoint_url: str
    access_key: str
    secret_key: str = field(repr=False)
    region: str = REGION

    def client(self) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=Config(s3={"addressing_style": "path"}, retries={"mode": "standard"}),
        )

    def env(self) -> dict[str, str]:
        """The standard AWS variables, for processes that read credentials from the environment."""
        return {
            "AWS_ENDPOINT_URL_S3": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
        }


@dataclass
class MinioServer:
    workdir: Path
    proc: ManagedProcess | None = None
    endpoint: S3Endpoint | None = None
    port: int = 0
    # Loopback unless pods in containers must reach it (the real-node bed binds the address
    # its pods reach the host at; only that address, never every interface).
    host: str = LOOPBACK

    def start(self, timeout: float = 60.0) -> MinioServer:
        binary = ensure("minio").path("bin/minio")
        self.port = self.port or free_port()
        if self.endpoint is None:  # keep credentials across a restart of the same server
            self.endpoint = S3Endpoint(
                f"http://{self.host}:{self.port}",
                "stator-" + secrets.token_hex(4),
                secrets.token_urlsafe(24),
            )
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        self.proc = ManagedProcess(
            "minio",
            [
                str(binary),
                "server",
                "--quiet",
                "--address",
                f"{self.host}:{self.port}",
                "--console-address",
                f"{LOOPBACK}:{free_port()}",
                str(data),
            ],
            self.workdir,
            env={
                "MINIO_ROOT_USER": self.endpoint.access_key,
                "MINIO_ROOT_PASSWORD": self.endpoint.secret_key,
                "MINIO_UPDATE": "off",
                "MINIO_BROWSER": "off",
                "MINIO_REGION": REGION,
                "MINIO_CONFIG_ENV_FILE": "",
                "HOME": str(self.workdir),
            },
        ).start()

        def live() -> bool:
            url = f"http://{self.host}:{self.port}/minio/health/ready"
            with urllib.request.urlopen(url, timeout=2) as resp:
                return bool(resp.status == 200)

        try:
            self.proc.wait_ready(live, timeout, "ready")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()

    def kill(self) -> None:
        """Crash the server (for failure tests); ``start()`` brings it back on the same port."""
        if self.proc is not None:
            self.proc.kill()

    def __enter__(self) -> MinioServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
