"""Stator's container images, built from the Dockerfiles in ``images/`` as shipped, on a
machine that reaches no container registry (``make images``).

The Dockerfiles take their base as a build argument (``BASE``, the official
``python:3.11.7-slim-bookworm`` by default). Where that cannot be pulled, the base is made
here: a Debian bookworm root filesystem from ``mmdebstrap`` with Python 3.11 (Debian's), the
slim image's dpkg exclusions (no man pages, docs or locales) and this machine's extra CA
certificates (the egress proxy's), imported into buildah's store. Builds run with ``buildah
bud`` (RUN steps in runc containers), with layers cached in buildah's store under the tool
cache, so only the layers after a changed input are built again. Images are exported as
docker archives for containerd (the real-node test bed imports them into each node).

Images built (``docker.io/library/`` as containerd names them):

- ``stator-runtime:dev``: ``images/runtime/Dockerfile``.
- ``stator-runtime:test``: the runtime plus the e2e suite's sample pipelines
  (``tests/e2e/kind/Dockerfile.runtime-test``), the image the e2e manifests name.
- ``stator-operator:dev``: ``images/operator/Dockerfile``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .cache import cache_root, recipe_digest

ROOT = Path(__file__).resolve().parents[2]
EXTRA_CA_DIR = Path("/usr/local/share/ca-certificates")
MIRROR = "http://deb.debian.org/debian"
SUITES = (
    f"deb {MIRROR} bookworm main",
    f"deb {MIRROR} bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
# Debian's Python 3.11, a `python` command (the official image's name for it) and TLS roots.
BASE_PACKAGES = ("python3", "python3-venv", "python-is-python3", "ca-certificates")
# As the official slim images: dpkg leaves out documentation.
SLIM_EXCLUDES = ("/usr/share/man/*", "/usr/share/doc/*", "/usr/share/locale/*", "/usr/share/info/*")


@dataclass(frozen=True)
class ImageSpec:
    """One image: its Dockerfile and the tag it is known by."""

    tag: str
    dockerfile: str
    build_args: tuple[tuple[str, str], ...] = ()


RUNTIME = ImageSpec("stator-runtime:dev", "images/runtime/Dockerfile")
RUNTIME_TEST = ImageSpec(
    "stator-runtime:test",
    "tests/e2e/kind/Dockerfile.runtime-test",
    (("RUNTIME_IMAGE", "localhost/stator-runtime:dev"),),
)
OPERATOR = ImageSpec("stator-operator:dev", "images/operator/Dockerfile")
ALL = (RUNTIME, RUNTIME_TEST, OPERATOR)


class ImageError(RuntimeError):
    """A step of an image build failed; the message names the step and carries its output."""


@dataclass
class Store:
    """buildah's (and podman's) image store in the tool cache: layers survive work trees."""

    root: Path = field(default_factory=lambda: cache_root() / "images" / "storage")
    runroot: Path = Path("/run/stator-containers")

    def flags(self) -> list[str]:
        return [
            "--root",
            str(self.root),
            "--runroot",
            str(self.runroot),
            "--storage-driver",
            "overlay",
        ]

    def run(
        self,
        tool: str,
        *args: str,
        what: str,
        timeout: float = 3600,
        log: Path | None = None,
        quiet: bool = False,
    ) -> str:
        """Run buildah or podman on this store; fail naming ``what`` with the output's tail."""
        if shutil.which(tool) is None:
            raise ImageError(
                f"{what}: {tool} is not installed (Debian: apt-get install buildah podman "
                "mmdebstrap runc; .ci/run does this)"
            )
        argv = [tool, *self.flags(), *args]
        started = time.monotonic()
        proc = subprocess.run(
            argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
        )
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-40:])
            raise ImageError(f"{what} failed (exit {proc.returncode}): {' '.join(argv)}\n{tail}")
        if not quiet:
            print(f"images: {what}: {time.monotonic() - started:.1f}s", flush=True)
        return proc.stdout

    def from_scratch(self, tag: str, put: tuple[str, Path, str], config: list[str]) -> None:
        """An image of one file or archive on an empty one: ``put`` is (``add`` to unpack an
        archive or ``copy`` a file, source, destination), ``config`` buildah's config flags."""
        verb, source, destination = put
        container = self.run("buildah", "from", "scratch", what=f"{tag}: container").strip()
        try:
            self.run("buildah", verb, container, str(source), destination, what=f"{tag}: {verb}")
            self.run("buildah", "config", *config, container, what=f"{tag}: config")
            self.run("buildah", "commit", "--quiet", container, tag, what=f"{tag}: commit")
        finally:
            self.run("buildah", "rm", container, what=f"{tag}: cleanup", quiet=True)

    def exists(self, ref: str) -> bool:
        proc = subprocess.run(
            ["buildah", *self.flags(), "inspect", "--type", "image", ref],
            capture_output=True,
            check=False,
        )
        return proc.returncode == 0


def _extra_cas() -> list[Path]:
    return sorted(EXTRA_CA_DIR.glob("*.crt")) if EXTRA_CA_DIR.is_dir() else []


def base_tag() -> str:
    """The local base's tag, keyed by everything that shapes it (a change makes a new one)."""
    cas = [hashlib.sha256(p.read_bytes()).hexdigest() for p in _extra_cas()]
    digest = recipe_digest(*SUITES, *BASE_PACKAGES, *SLIM_EXCLUDES, *cas)
    return f"localhost/stator-base:bookworm-{digest}"


def ensure_base(store: Store) -> str:
    """Make the local base image unless the store has it; return its tag."""
    tag = base_tag()
    if store.exists(tag):
        return tag
    if shutil.which("mmdebstrap") is None:
        raise ImageError("local base: mmdebstrap is not installed (apt-get install mmdebstrap)")
    with tempfile.TemporaryDirectory(prefix="stator-base-") as tmp:
        rootfs = Path(tmp) / "rootfs.tar"
        hook = (
            'mkdir -p "$1/usr/local/share/ca-certificates"; '
            + "".join(f'cp {p} "$1/usr/local/share/ca-certificates/"; ' for p in _extra_cas())
            + 'chroot "$1" update-ca-certificates'
        )
        argv = [
            "mmdebstrap",
            "--mode=root",
            "--variant=minbase",
            f"--include={','.join(BASE_PACKAGES)}",
            "--aptopt=Acquire::Languages none",
            *[f"--dpkgopt=path-exclude={p}" for p in SLIM_EXCLUDES],
            f"--customize-hook={hook}",
            "bookworm",
            str(rootfs),
            *SUITES,
        ]
        started = time.monotonic()
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise ImageError(f"local base: mmdebstrap failed:\n{proc.stderr[-3000:]}")
        print(f"images: local base (mmdebstrap): {time.monotonic() - started:.1f}s", flush=True)
        # pip inside builds trusts the same roots as apt (the egress proxy's CA included).
        store.from_scratch(
            tag,
            ("add", rootfs, "/"),
            ["--env", "PIP_CERT=/etc/ssl/certs/ca-certificates.crt", "--cmd", '["python3"]'],
        )
    return tag


def build(store: Store, spec: ImageSpec, base: str | None, logs: Path) -> str:
    """``buildah bud`` one Dockerfile from the repository root; return the local tag."""
    local = f"localhost/{spec.tag}"
    args: list[str] = []
    if base is not None:
        args += ["--build-arg", f"BASE={base}"]
    for key, value in spec.build_args:
        args += ["--build-arg", f"{key}={value}"]
    store.run(
        "buildah",
        "bud",
        "--layers",
        "--network",
        "host",
        *args,
        "-f",
        spec.dockerfile,
        "-t",
        local,
        ".",
        what=f"build {spec.tag}",
        log=logs / f"{spec.tag.replace(':', '_')}.log",
    )
    return local


def export_archive(store: Store, spec: ImageSpec, dest: Path) -> Path:
    """A docker archive named as containerd resolves the plain tag (docker.io/library/...)."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = dest / f"{spec.tag.replace(':', '_')}.tar"
    stamp = archive.with_suffix(".id")
    image_id = store.run(
        "buildah",
        "images",
        "-q",
        "--no-trunc",
        f"localhost/{spec.tag}",
        what="image id",
        quiet=True,
    ).strip()
    if archive.is_file() and stamp.is_file() and stamp.read_text() == image_id:
        return archive  # this very image was exported before
    archive.unlink(missing_ok=True)
    stamp.unlink(missing_ok=True)
    store.run(
        "buildah",
        "push",
        "--quiet",
        f"localhost/{spec.tag}",
        f"docker-archive:{archive}:{spec.tag}",
        what=f"export {spec.tag}",
    )
    stamp.write_text(image_id)
    return archive


def build_all(
    store: Store | None = None,
    *,
    base: str | None = None,
    specs: Sequence[ImageSpec] = ALL,
    out: Path | None = None,
    export: Sequence[ImageSpec] | None = None,
) -> dict[str, Path]:
    """Build ``specs`` (on the local base unless ``base`` names one) and export those in
    ``export`` (default: all of them); return the archives by tag."""
    store = store or Store()
    out = out or cache_root() / "images" / "archives"
    logs = cache_root() / "images" / "logs"
    chosen = base or os.environ.get("STATOR_IMAGE_BASE") or ensure_base(store)
    archives: dict[str, Path] = {}
    for spec in specs:
        build(store, spec, chosen, logs)
    for spec in specs if export is None else export:
        archives[spec.tag] = export_archive(store, spec, out)
    return archives
