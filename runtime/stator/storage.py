"""One small object-store interface over ``file://`` and ``s3://``, for checkpoints, sinks and
sources. Keys are relative to the store's root URI; writes are whole-object (atomic) on both.

S3 goes through boto3: endpoint, region and credentials are configurable (credentials come
from the environment, i.e. from a Kubernetes Secret, never from a manifest field), multipart
transfers for large files, and retries with backoff through botocore's own retry modes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from .atomic_file import STAGED_PREFIX, staged_file, write_atomically
from .errors import StorageError


@dataclass(frozen=True)
class S3Options:
    """How to reach S3. Credentials default to the standard AWS environment variables."""

    endpoint_url: str | None = None  # e.g. http://minio:9000; None = AWS
    region: str = "us-east-1"
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    # botocore "standard" retry mode: exponential backoff with jitter, this many attempts.
    max_attempts: int = 6
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 60.0
    # Files at least this large are uploaded in parts of multipart_chunk_bytes, in parallel.
    multipart_threshold_bytes: int = 32 * 1024 * 1024
    multipart_chunk_bytes: int = 16 * 1024 * 1024
    max_concurrency: int = 4
    path_style: bool = True  # MinIO and most S3-compatible servers want path-style URLs

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("s3.max_attempts must be >= 1")
        if self.multipart_chunk_bytes < 5 * 1024 * 1024:
            raise ValueError("s3.multipart_chunk_bytes must be at least 5 MiB (an S3 limit)")
        if self.multipart_threshold_bytes < 0:
            raise ValueError("s3.multipart_threshold_bytes must be >= 0")
        if self.max_concurrency < 1:
            raise ValueError("s3.max_concurrency must be >= 1 (parallel parts of one transfer)")
        for key in ("connect_timeout_s", "read_timeout_s"):
            if getattr(self, key) <= 0:
                raise ValueError(f"s3.{key} must be > 0 (seconds), got {getattr(self, key)}")


class ObjectStore(ABC):
    """A flat key space under a root URI."""

    def __init__(self, uri: str) -> None:
        self.uri = uri.rstrip("/")

    def url(self, key: str) -> str:
        return f"{self.uri}/{key}" if key else self.uri

    def child(self, prefix: str) -> ObjectStore:
        """A store rooted at ``prefix`` under this one."""
        return open_store(self.url(prefix), getattr(self, "options", None))

    @abstractmethod
    def put(self, key: str, data: bytes) -> None: ...

    @abstractmethod
    def put_file(self, key: str, path: Path) -> None: ...

    @abstractmethod
    def get(self, key: str) -> bytes: ...

    @abstractmethod
    def get_file(self, key: str, path: Path) -> None: ...

    @abstractmethod
    def size(self, key: str) -> int | None:
        """Size in bytes, or None if there is no such object."""

    def exists(self, key: str) -> bool:
        return self.size(key) is not None

    @abstractmethod
    def listing(self, prefix: str = "") -> list[tuple[str, int]]:
        """(key, size) of every object whose key starts with ``prefix``, sorted by key."""

    @abstractmethod
    def delete(self, keys: list[str]) -> None:
        """Delete objects; missing ones are ignored."""

    @abstractmethod
    def move(self, src: str, dst: str) -> None:
        """Make ``dst`` the object ``src`` was; idempotent if ``src`` already moved."""

    def connect(self) -> None:  # noqa: B027 - optional hook
        """Build what this process needs to reach the store now rather than at first use:
        a pre-started driver's workers do it while the old driver still runs."""

    def check(self) -> None:
        """Fail now, with a clear message, if the store cannot be reached or written."""
        probe = f"{_probe_dir()}/probe"
        self.put(probe, b"ok")
        self.delete([probe])


PROBE_ATTEMPTS = 5


def _probe_dir() -> str:
    return f"_probe-{os.getpid()}-{threading.get_ident()}"


# ---------------------------------------------------------------------------- file://


class FileStore(ObjectStore):
    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        self.root = Path(urlparse(uri).path)

    def check(self) -> None:
        """As for any store, and the directories the probe had to create are removed again:
        a job refused before it starts leaves the file system as it found it."""
        # Two drivers of a job may probe a fresh root together (a pre-started one beside the
        # running one): each probes in a directory of its own, and one that finds a parent
        # removed under it (or removed between mkdir's two looks at it) by the other's
        # clean-up probes again.
        created = [
            p for p in (self.root / _probe_dir(), self.root, *self.root.parents) if not p.exists()
        ]
        try:
            for attempt in range(PROBE_ATTEMPTS):
                try:
                    super().check()
                    break
                except StorageError as exc:
                    # FileExistsError: a parent seen as existing by mkdir was removed
                    # before mkdir could confirm it is a directory.
                    if attempt + 1 == PROBE_ATTEMPTS or not isinstance(
                        exc.__cause__, FileNotFoundError | FileExistsError
                    ):
                        raise
        finally:
            for path in created:  # deepest first
                with contextlib.suppress(OSError):
                    path.rmdir()

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if self.root.resolve() not in (path, *path.parents):
            raise StorageError(f"key {key!r} escapes the store root {self.uri}")
        return path

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(path, data)
        except OSError as exc:
            raise StorageError(f"cannot write {self.url(key)}: {exc}") from exc

    def put_file(self, key: str, path: Path) -> None:
        dest = self._path(key)
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            with staged_file(dest) as staged:
                shutil.copyfile(path, staged)
        except OSError as exc:
            raise StorageError(f"cannot write {self.url(key)}: {exc}") from exc

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except OSError as exc:
            raise _file_error("read", self.url(key), exc) from exc

    def get_file(self, key: str, path: Path) -> None:
        source = self._path(key)
        try:
            shutil.copyfile(source, path)
        except OSError as exc:
            if exc.filename == str(source):
                raise _file_error("read", self.url(key), exc) from exc
            raise StorageError(f"cannot copy {self.url(key)} to {path}: {exc}") from exc

    def size(self, key: str) -> int | None:
        try:
            st = self._path(key).stat()
        except (FileNotFoundError, NotADirectoryError):  # a file on the way: no such object
            return None
        except OSError as exc:
            raise _file_error("inspect", self.url(key), exc) from exc
        return None if stat.S_ISDIR(st.st_mode) else st.st_size

    def listing(self, prefix: str = "") -> list[tuple[str, int]]:
        base = self.root
        if base.is_file():
            raise StorageError(f"cannot list {self.uri}: it is a file; a directory is expected")
        # Walk only the directory the prefix names (a poll for one checkpoint's uploads must
        # not walk every shared file).
        start = base / prefix.rsplit("/", 1)[0] if "/" in prefix else base
        if not start.exists():
            return []
        out = []
        for dirpath, _, files in os.walk(start, onerror=self._walk_error):
            for name in files:
                if name.startswith(STAGED_PREFIX):
                    continue
                full = Path(dirpath) / name
                key = full.relative_to(base).as_posix()
                if key.startswith(prefix):
                    with contextlib.suppress(FileNotFoundError):
                        out.append((key, full.stat().st_size))
        return sorted(out)

    def _walk_error(self, exc: OSError) -> None:
        """A directory removed while walked is simply gone; one that cannot be read would
        leave objects out of the listing unseen, so it fails the listing."""
        if not isinstance(exc, FileNotFoundError | NotADirectoryError):
            path = Path(exc.filename).relative_to(self.root).as_posix() if exc.filename else ""
            raise _file_error("list", self.url(path), exc) from exc

    def delete(self, keys: list[str]) -> None:
        root = self.root.resolve()
        for key in keys:
            path = self._path(key)
            try:
                path.unlink()
            except (FileNotFoundError, NotADirectoryError):
                pass
            except OSError as exc:
                raise _file_error("delete", self.url(key), exc) from exc
            parent = path.parent  # drop directories the deletes emptied, up to the root
            while parent != root and root in parent.parents:
                try:
                    parent.rmdir()
                except OSError:
                    break
                parent = parent.parent

    def move(self, src: str, dst: str) -> None:
        source, dest = self._path(src), self._path(dst)
        if not source.exists():
            if dest.exists():
                return
            raise StorageError(f"cannot move {self.url(src)}: it does not exist")
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(source, dest)
        except OSError as exc:
            raise StorageError(f"cannot move {self.url(src)} to {self.url(dst)}: {exc}") from exc


def _file_error(action: str, url: str, exc: OSError) -> StorageError:
    """What went wrong with the object at ``url``, said as a path a user passed, not as an
    errno: a file where a directory belongs is the usual mistake."""
    if isinstance(exc, FileNotFoundError | NotADirectoryError):
        reason = "does not exist" + (
            " (a path above it is a file, not a directory)"
            if isinstance(exc, NotADirectoryError)
            else ""
        )
        return StorageError(f"cannot {action} {url}: it {reason}")
    if isinstance(exc, IsADirectoryError):
        return StorageError(f"cannot {action} {url}: it is a directory, not a file")
    if isinstance(exc, PermissionError):
        return StorageError(f"cannot {action} {url}: permission denied")
    return StorageError(f"cannot {action} {url}: {exc.strerror or exc}")


# ---------------------------------------------------------------------------- s3://


class S3Store(ObjectStore):
    def __init__(self, uri: str, options: S3Options | None = None) -> None:
        super().__init__(uri)
        parsed = urlparse(uri)
        if not parsed.netloc:
            raise StorageError(f"{uri!r} has no bucket: use s3://BUCKET/PREFIX")
        self.bucket, self.prefix = parsed.netloc, parsed.path.strip("/")
        self.options = options or S3Options()
        self._client: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"] = None  # clients do not travel to executors; each builds its own
        return state

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = _s3_client(self.options)
        return self._client

    def connect(self) -> None:
        from boto3.s3.transfer import TransferConfig  # noqa: F401, PLC0415 - the import is the work

        self.client  # noqa: B018 - builds the process's client for these options

    def _transfer(self) -> Any:
        from boto3.s3.transfer import TransferConfig  # noqa: PLC0415

        o = self.options
        return TransferConfig(
            multipart_threshold=o.multipart_threshold_bytes,
            multipart_chunksize=o.multipart_chunk_bytes,
            max_concurrency=o.max_concurrency,
            use_threads=o.max_concurrency > 1,
        )

    @contextlib.contextmanager
    def _errors(self, action: str, key: str = "") -> Iterator[None]:
        try:
            yield
        except StorageError:
            raise
        except Exception as exc:
            raise StorageError(_explain(exc, action, self.url(key), self.options)) from exc

    def put(self, key: str, data: bytes) -> None:
        with self._errors("write", key):
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)

    def put_file(self, key: str, path: Path) -> None:
        with self._errors("upload", key):
            self.client.upload_file(str(path), self.bucket, self._key(key), Config=self._transfer())

    def get(self, key: str) -> bytes:
        with self._errors("read", key):
            body: bytes = self.client.get_object(Bucket=self.bucket, Key=self._key(key))[
                "Body"
            ].read()
            return body

    def get_file(self, key: str, path: Path) -> None:
        with self._errors("download", key):
            self.client.download_file(
                self.bucket, self._key(key), str(path), Config=self._transfer()
            )

    def size(self, key: str) -> int | None:
        from botocore.exceptions import ClientError  # noqa: PLC0415

        with self._errors("inspect", key):
            try:
                head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                    return None
                raise
            return int(head["ContentLength"])

    def listing(self, prefix: str = "") -> list[tuple[str, int]]:
        # Under a store's prefix "sp", _key("") is "sp/": a sibling such as "sp-old" is not listed.
        full = self._key(prefix)
        strip = len(self.prefix) + 1 if self.prefix else 0
        out = []
        with self._errors("list", prefix):
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=full
            )
            for page in pages:
                for obj in page.get("Contents", []):
                    out.append((obj["Key"][strip:], int(obj["Size"])))
        return sorted(out)

    def delete(self, keys: list[str]) -> None:
        with self._errors("delete"):
            for i in range(0, len(keys), 1000):
                chunk = [{"Key": self._key(k)} for k in keys[i : i + 1000]]
                if chunk:
                    self.client.delete_objects(
                        Bucket=self.bucket, Delete={"Objects": chunk, "Quiet": True}
                    )

    def move(self, src: str, dst: str) -> None:
        if self.size(src) is None:
            if self.size(dst) is not None:
                return
            raise StorageError(f"cannot move {self.url(src)}: it does not exist")
        with self._errors("copy", src):
            self.client.copy(
                {"Bucket": self.bucket, "Key": self._key(src)},
                self.bucket,
                self._key(dst),
                Config=self._transfer(),
            )
        self.delete([src])


# Threads that call one store at once in a transfer (a checkpoint's or a savepoint's files);
# each may run a multipart transfer of ``max_concurrency`` parts.
TRANSFER_CALLERS = 4
_clients: dict[S3Options, Any] = {}
_clients_lock = threading.Lock()
# The process's boto3 session (held under _clients_lock: sessions are not thread-safe). Every
# client is built from it, so the S3 models it has loaded (JSON files, ~0.2 s of CPU) are
# loaded once per process, or once per executor where the Python daemon warmed it.
_session: Any = None


def _boto3_session() -> Any:
    """The shared session; the caller holds ``_clients_lock``."""
    global _session  # noqa: PLW0603 - one per process, as the clients
    if _session is None:
        import boto3  # noqa: PLC0415

        _session = boto3.session.Session()
    return _session


def warm_s3() -> None:
    """Import boto3 and load the S3 models into this process's session (a throw-away client
    with placeholder credentials and no network), so that processes forked from it build
    their first client without that work. The Python daemon calls it before it forks
    workers (``tasks/worker_warmup.py``)."""
    from boto3.s3.transfer import TransferConfig  # noqa: F401, PLC0415 - the import is the work

    placeholder = S3Options(
        endpoint_url="http://127.0.0.1:9",
        access_key_id="warm-up",
        secret_access_key="warm-up",  # noqa: S106 - a placeholder: no request is sent
    )
    _s3_client(placeholder)
    with _clients_lock:
        del _clients[placeholder]  # the session keeps the models; nobody uses this client


def _s3_client(options: S3Options) -> Any:
    """One client per options per process (clients are thread-safe and slow to build)."""
    with _clients_lock:
        client = _clients.get(options)
        if client is None:
            from botocore.config import Config  # noqa: PLC0415

            config = Config(
                region_name=options.region,
                retries={"mode": "standard", "max_attempts": options.max_attempts},
                connect_timeout=options.connect_timeout_s,
                read_timeout=options.read_timeout_s,
                s3={"addressing_style": "path" if options.path_style else "auto"},
                # Every caller thread may run a multipart transfer of max_concurrency parts:
                # a smaller pool discards connections and opens new ones mid-transfer.
                max_pool_connections=TRANSFER_CALLERS * max(1, options.max_concurrency) + 2,
            )
            client = _boto3_session().client(
                "s3",
                endpoint_url=options.endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or None,
                aws_access_key_id=options.access_key_id or None,
                aws_secret_access_key=options.secret_access_key or None,
                config=config,
            )
            _clients[options] = client
        return client


def _explain(exc: Exception, action: str, url: str, options: S3Options) -> str:  # noqa: PLR0911
    """An actionable message; never includes credentials."""
    from botocore.exceptions import (  # noqa: PLC0415
        ClientError,
        EndpointConnectionError,
        NoCredentialsError,
    )

    endpoint = options.endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or "AWS S3"
    if isinstance(exc, EndpointConnectionError):
        return (
            f"cannot {action} {url}: the S3 endpoint {endpoint} is unreachable "
            f"(is it running? check s3.endpoint_url)"
        )
    if isinstance(exc, NoCredentialsError):
        return (
            f"cannot {action} {url}: no S3 credentials; set AWS_ACCESS_KEY_ID and "
            f"AWS_SECRET_ACCESS_KEY (from a Secret)"
        )
    if isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code", "")
        if code == "NoSuchBucket":
            return f"cannot {action} {url}: bucket does not exist at {endpoint}; create it first"
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403"):
            return f"cannot {action} {url}: S3 at {endpoint} refused the credentials ({code})"
        if code in ("NoSuchKey", "404"):
            return f"cannot {action} {url}: no such object"
        return f"cannot {action} {url}: S3 error {code}"
    return f"cannot {action} {url}: {type(exc).__name__}: {exc}"


def open_store(uri: str, s3: S3Options | None = None) -> ObjectStore:
    parsed = urlparse(uri)
    if parsed.scheme == "file" or (parsed.scheme == "" and uri.startswith("/")):
        return FileStore(uri if parsed.scheme else f"file://{uri}")
    if parsed.scheme in ("s3", "s3a"):
        return S3Store(f"s3://{parsed.netloc}{parsed.path}", s3)
    raise StorageError(
        f"unsupported storage URI {uri!r}: use file:///absolute/path or s3://bucket/prefix"
    )
