"""A pipeline's savepoints in object storage, reached with the credentials of its Secret.
The storage work itself is ``stator.lineage``'s; this only supplies where and with what."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any
from urllib.parse import urlsplit

from kubernetes.client.rest import ApiException

from stator.checkpoint.ownership import release
from stator.errors import StatorError
from stator.lineage import check_restorable, dispose_savepoint, find_savepoint
from stator.storage import S3Options, open_store

from .job_config import config_value
from .pipeline_spec import PipelineSpec
from .ports import SecretApi

_S3_KEYS = {f.name for f in dataclasses.fields(S3Options)}


# The most the operator spends on one storage call, whatever a spec asks its driver to: the
# operator serves every pipeline, and one pipeline's slow or unreachable endpoint must not
# hold it (spec.config s3.* reaches the driver as given).
OPERATOR_S3_LIMITS = {"max_attempts": 3, "connect_timeout_s": 5.0, "read_timeout_s": 30.0}


def s3_options(spec: PipelineSpec, **credentials: str | None) -> S3Options:
    """``S3Options`` of the spec's job config (its ``s3`` section), plus ``credentials``,
    with the operator's own limits on retries and timeouts."""
    endpoint = spec.checkpointing.endpoint
    section: dict[str, Any] = {"endpoint_url": endpoint} if endpoint else {}
    for key, raw in spec.config.items():
        name = key.replace("-", "_")
        if name.startswith("s3.") and name[3:] in _S3_KEYS:
            section[name[3:]] = config_value(key, raw) if isinstance(raw, str) else raw
    for key, limit in OPERATOR_S3_LIMITS.items():
        if key in section and isinstance(section[key], int | float):
            section[key] = min(section[key], limit)
    return S3Options(**{**section, **credentials})


def is_under(path: str, root: str) -> bool:
    """Whether storage location ``path`` lies strictly inside ``root`` (scheme compared
    case-insensitively, no '..' segments)."""
    p, r = urlsplit(path.rstrip("/")), urlsplit(root.rstrip("/"))
    if p.scheme.lower() != r.scheme.lower() or p.netloc != r.netloc:
        return False
    if ".." in p.path.split("/"):
        return False
    return p.path.startswith(r.path.rstrip("/") + "/")


log = logging.getLogger("stator.operator")


class SavepointStorage:
    """``allow_file``: reach ``file://`` locations (tests of the operator's logic only; in a
    cluster such a location is the operator's own file system, not the pipeline's)."""

    def __init__(self, kube: SecretApi, allow_file: bool = False) -> None:
        self.kube = kube
        self.allow_file = allow_file

    def options(self, namespace: str, spec: PipelineSpec, uri: str = "") -> S3Options:
        """The driver's S3 settings (the endpoint from the spec, ``s3.*`` of ``spec.config``:
        region, path style, timeouts, within the operator's limits), credentials from
        ``checkpointing.credentialsSecret``: the operator reaches the savepoints where and as
        the driver writes them, never with credentials of its own (its environment's or its
        node's). ``uri``: the location about to be read, checked for the same."""
        scheme = urlsplit(uri).scheme.lower()
        if scheme == "file" or (not scheme and uri.startswith("/")):
            if not self.allow_file:
                raise StatorError(
                    f"{uri}: the operator does not read file:// locations (they would be its "
                    f"own file system); keep checkpoints and savepoints on s3://"
                )
            return s3_options(spec)
        secret = spec.checkpointing.credentials_secret
        if not secret:
            raise StatorError(
                "spec.checkpointing.credentialsSecret is required for the operator to read "
                "s3:// savepoints: name a Secret with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
            )
        creds = self.kube.read_secret(namespace, secret)
        missing = [k for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY") if not creds.get(k)]
        if missing:
            raise StatorError(
                f"Secret {namespace}/{secret} lacks {', '.join(missing)}: the operator reads "
                f"savepoints only with the pipeline's credentials; add them to the Secret"
            )
        return s3_options(
            spec,
            access_key_id=creds["AWS_ACCESS_KEY_ID"],
            secret_access_key=creds["AWS_SECRET_ACCESS_KEY"],
        )

    def restore_problem(self, namespace: str, spec: PipelineSpec, uri: str) -> str | None:
        """Why ``uri`` cannot be restored from (None if it can): read, never written."""
        try:
            check_restorable(uri, self.options(namespace, spec, uri))
        except (StatorError, ApiException) as exc:
            return str(exc)
        return None

    def find(self, namespace: str, spec: PipelineSpec, request_id: str) -> str | None:
        """The completed savepoint of request ``request_id``, for when the driver is gone."""
        root = spec.savepoint_dir
        try:
            return find_savepoint(root, request_id, self.options(namespace, spec, root))
        except Exception as exc:
            log.warning("could not search savepoints under %s: %s", root, exc)
            return None

    def dispose(
        self, namespace: str, spec: PipelineSpec, path: str, root: str | None = None
    ) -> None:
        """Delete a savepoint inside ``root`` (the savepoint directory it was recorded in;
        default the spec's): a path anywhere else, as a driver may report one, is refused.
        Failures are logged, not raised: they never block a flow."""
        root = root or spec.savepoint_dir
        if not is_under(path, root):
            log.warning("not disposing %s: it is not inside the savepoint directory %s", path, root)
            return
        try:
            dispose_savepoint(path, self.options(namespace, spec, path))
        except Exception as exc:
            log.warning("could not dispose savepoint %s: %s", path, exc)

    def release_checkpoints(
        self, namespace: str, spec: PipelineSpec, name: str, owner: str
    ) -> str | None:
        """Remove the owner marker of the pipeline's checkpoint root if ``owner`` (its uid)
        holds it, when the pipeline is deleted: one created again under the name continues
        from the checkpoints without ``checkpointing.adopt``. The problem, if any (then it
        needs ``adopt``); never raises: a deletion is not blocked by storage."""
        root = spec.checkpoint_root(name, namespace)
        try:
            release(open_store(root, self.options(namespace, spec, root)), owner)
        except Exception as exc:
            return f"could not release the checkpoint root {root}: {exc}"
        return None
