"""A pipeline's savepoints in object storage, reached with the credentials of its Secret.
The storage work itself is ``stator.lineage``'s; this only supplies where and with what."""

from __future__ import annotations

import logging
from typing import Any

from kubernetes.client.rest import ApiException

from stator.errors import StatorError
from stator.lineage import check_restorable, dispose_savepoint, find_savepoint
from stator.storage import S3Options

from .ports import SecretApi
from .spec import get, savepoint_dir

log = logging.getLogger("stator.operator")


class SavepointStorage:
    def __init__(self, kube: SecretApi) -> None:
        self.kube = kube

    def options(self, namespace: str, spec: dict[str, Any]) -> S3Options:
        """S3 endpoint from the spec, credentials from ``checkpointing.credentialsSecret``."""
        secret = get(spec, "checkpointing", "credentialsSecret")
        creds = self.kube.read_secret(namespace, secret) if secret else {}
        return S3Options(
            endpoint_url=get(spec, "checkpointing", "endpoint"),
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
