"""At most one driver of a job writes: the driver's Lease fences a driver that was replaced.

When the node of a driver is lost (powered off, or cut off by a partition), Kubernetes cannot
tell whether the driver still runs there. The operator replaces it once its Lease lapsed
(config ``lease``; ``stator_operator.reconciler``), and the old driver, should it still run,
must then write nothing more: no checkpoint metadata, no savepoint metadata, no sink commit
or discard of staged output (its successor's would go with it), no new epoch. Every such
write passes :func:`guard` first:

1. No lease configured (one machine, one driver): go on.
2. The lease is surely ours (renewed less than ``duration - renew`` ago): go on.
3. The lease is held by another driver: this driver has been replaced. Log it and end the
   process at once (``LEASE_LOST_EXIT``): nothing after this point may reach storage.
4. Not sure (the API server did not answer our renewals): wait until a renewal succeeds
   (go on) or shows the lease taken (3). An API server outage pauses the job's writes; it
   does not fail the job.

Tasks an old driver had already started may still write when it is replaced: a driver that
took its lease over from a holder that had not released it itself (or that the operator
released for it) skips ``TAKEOVER_ID_GAP`` checkpoint ids, so files such a task uploads never
land in a checkpoint of the new driver, and their sink output goes to staged objects no commit
moves (``sinks/files.py``). Not covered: a write already sent when the lease lapsed and delayed
past it (the object store applies it late).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ..cluster.kubernetes import SERVICE_ACCOUNT_DIR
from ..config import LeaseConfig
from ..errors import ConfigError, StatorError, report_error

if TYPE_CHECKING:  # the Kubernetes client loads only in a driver that holds a lease
    from .lease import LeaseHolder

log = logging.getLogger("stator.fencing")

LEASE_LOST_EXIT = 4
TAKEOVER_ID_GAP = 1000
_WAIT_S = 0.2

_holder: LeaseHolder | None = None
_prepared: LeaseHolder | None = None


def prepare(config: LeaseConfig, env: Mapping[str, str], api: object | None = None) -> None:
    """Build the lease's client ahead (a pre-started driver, before it waits for the
    hand-over): loading the Kubernetes client takes about a second, which is downtime once
    the hand-over came."""
    global _prepared  # noqa: PLW0603
    if config.name is not None and _prepared is None:
        _prepared = _new_holder(config, env, api)


def hold(
    config: LeaseConfig,
    env: Mapping[str, str],
    stop: threading.Event | None = None,
    api: object | None = None,
) -> bool:
    """Acquire the job's lease (config ``lease.name``) and keep renewing it; False if
    ``stop`` was set first. Without ``lease.name`` there is nothing to hold (True). ``api``:
    a coordination API client (default: from the pod's service account)."""
    global _holder, _prepared  # noqa: PLW0603 - one driver process holds one lease
    if config.name is None:
        return True
    holder, _prepared = _prepared or _new_holder(config, env, api), None
    if not holder.acquire(stop):
        return False
    holder.keep_renewing(_replaced)
    _holder = holder
    return True


def _new_holder(config: LeaseConfig, env: Mapping[str, str], api: object | None) -> LeaseHolder:
    from .lease import LeaseHolder  # noqa: PLC0415

    assert config.name is not None
    return LeaseHolder(
        namespace=_namespace(env),
        name=config.name,
        identity=env.get("STATOR_POD_NAME") or socket.gethostname(),
        duration_s=config.duration_ms / 1000,
        renew_s=config.renew_ms / 1000,
        retry_s=min(0.25, config.renew_ms / 1000),
        api=api or _api(env),
        create=False,  # the operator creates it; the driver may only read and update it
        give_up_unrenewed=False,
    )


def took_over() -> bool:
    """The lease was taken from a driver that had not released it (it may still run)."""
    return _holder is not None and _holder.took_over


def guard(what: str) -> None:
    """Steps 1-4 of the module docstring, before ``what`` is written."""
    holder = _holder
    if holder is None or holder.valid():
        return
    waited = False
    while not holder.valid():
        if holder.lost is not None:
            _replaced(holder.lost, what)
        if not waited:
            log.warning("not sure to hold lease %s: %s waits for a renewal", holder.name, what)
            waited = True
        threading.Event().wait(_WAIT_S)
    log.info("lease %s renewed: %s goes on", holder.name, what)


def release() -> None:
    """Give the lease up (the job ended), so that a successor takes it at once."""
    global _holder
    holder, _holder = _holder, None
    if holder is not None:
        holder.release()


def _replaced(reason: str, what: str = "the job") -> None:
    log.error("this driver was replaced (%s): %s is not written; exiting", reason, what)
    report_error(StatorError(f"this driver was replaced ({reason}); exiting"))
    sys.stderr.flush()
    logging.shutdown()
    os._exit(LEASE_LOST_EXIT)


def _namespace(env: Mapping[str, str]) -> str:
    namespace = env.get("STATOR_POD_NAMESPACE")
    if namespace:
        return namespace
    path = Path(env.get("STATOR_SERVICE_ACCOUNT_DIR") or SERVICE_ACCOUNT_DIR) / "namespace"
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise ConfigError(
            f"lease.name is set but the driver's namespace is unknown ({exc}): run the driver "
            f"in a pod the Stator operator created, or unset lease.name"
        ) from exc


def _api(env: Mapping[str, str]) -> object:
    """A coordination API client from the pod's service account (its token re-read as it
    rotates)."""
    from kubernetes import client  # noqa: PLC0415 - only drivers in Kubernetes need it
    from kubernetes.config.incluster_config import InClusterConfigLoader  # noqa: PLC0415

    account = Path(env.get("STATOR_SERVICE_ACCOUNT_DIR") or SERVICE_ACCOUNT_DIR)
    if not env.get("KUBERNETES_SERVICE_HOST"):
        raise ConfigError(
            "lease.name is set but KUBERNETES_SERVICE_HOST is not: the lease needs the "
            "Kubernetes API; run the driver in a pod the Stator operator created, or unset "
            "lease.name"
        )
    configuration = client.Configuration()
    loader = InClusterConfigLoader(
        token_filename=str(account / "token"),
        cert_filename=str(account / "ca.crt"),
        environ=dict(env),
    )
    loader.load_and_set(configuration)
    return client.CoordinationV1Api(client.ApiClient(configuration))
