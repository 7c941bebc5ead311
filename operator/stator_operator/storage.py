"""A pipeline's savepoints in object storage, reached with the credentials of its Secret.
The storage work itself is ``stator.lineage``'s; this only supplies where and with what."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import yaml
from kubernetes.client.rest import ApiException

from stator.errors import StatorError
from stator.lineage import check_restorable, dispose_savepoint, find_savepoint
from stator.storage import S3Options

from .ports import SecretApi
from .spec import get, savepoint_dir

_S3_KEYS = {f.name for f in dataclasses.fields(S3Options)}


def s3_options(spec: dict[str, Any], **credentials: str | None) -> S3Options:
    """``S3Options`` of the spec's job config (its ``s3`` section), plus ``credentials``."""
    endpoint = get(spec, "checkpointing", "endpoint")
    section: dict[str, Any] = {"endpoint_url": endpoint} if endpoint else {}
    for key, raw in (get(spec, "config", default=None) or {}).items():
        name = key.replace("-", "_")
        if name.startswith("s3.") and name[3:] in _S3_KEYS:
            section[name[3:]] = yaml.safe_load(raw) if isinstance(raw, str) else raw
    return S3Options(**{**section, **credentials})


log = logging.getLogger("stator.operator")


class SavepointStorage:
    def __init__(self, kube: SecretApi) -> None:
        self.kube = kube

    def options(self, namespace: str, spec: dict[str, Any]) -> S3Options:
        """The driver's S3 settings (the endpoint from the spec, ``s3.*`` of ``spec.config``:
        region, path style, timeouts), credentials from ``checkpointing.credentialsSecret``:
        the operator reaches the savepoints where and as the driver writes them."""
        secret = get(spec, "checkpointing", "credentialsSecret")
        creds = self.kube.read_secret(namespace, secret) if secret else {}
        return s3_options(
            spec,
            access_key_id=creds.get("AWS_ACCESS_KEY_ID"),
            secret_access_key=creds.get("AWS_SECRET_ACCESS_KEY"),
        )

    def restore_problem(self, namespace: str, spec: dict[str, Any], uri: str) -> str | None:
        """Why ``uri`` cannot be restored from (None if it can): read, never written."""
        try:
            check_restorable(uri, self.options(namespace, spec))
        except (StatorError, ApiException) as exc:
            return str(exc)
        return None

    def find(self, namespace: str, spec: dict[str, Any], request_id: str) -> str | None:
        """The completed savepoint of request ``request_id``, for when the driver is gone."""
        root = savepoint_dir(spec)
        try:
            return find_savepoint(root, request_id, self.options(namespace, spec))
        except Exception as exc:
            log.warning("could not search savepoints under %s: %s", root, exc)
            return None

    def dispose(self, namespace: str, spec: dict[str, Any], path: str) -> None:
        """Delete a savepoint. Failures are logged, not raised: they never block a flow."""
        try:
            dispose_savepoint(path, self.options(namespace, spec))
        except Exception as exc:
            log.warning("could not dispose savepoint %s: %s", path, exc)
