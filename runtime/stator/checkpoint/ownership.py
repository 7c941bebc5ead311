"""Who owns a job's checkpoint root: a marker object ``_owner.json`` at the root.

Recovery deletes what no retained checkpoint needs, and every completed checkpoint subsumes
older ones, so two jobs writing one root (two clusters sharing a bucket and a
``<namespace>.<name>``, or a pipeline recreated while its predecessor still runs) would delete
each other's checkpoints. The marker names the one job that may: the operator gives each
pipeline's drivers its uid as ``checkpoint.owner``; a job without one (``stator run`` on its
own) writes no marker and checks none.

Claiming the root when a driver recovers, step by step:

1. Read the marker. Missing: the root is free (a new job, or its owner released it when it was
   deleted) -> step 2. Ours -> done. Another's -> refused with both owners and the fix, unless
   ``checkpoint.adopt`` (the pipeline says it takes over its predecessor's checkpoints) -> 2.
   A marker that cannot be read or parsed refuses too: nothing is deleted on a guess.
2. Write ours. A crash before or after leaves the root claimed or free; either is safe to
   repeat.

Before each deletion of subsumed checkpoints the owner reads the marker again: a root another
job adopted stops this one with an error instead of deleting what the adopter now needs.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass

from ..errors import ConfigError, StorageError
from ..storage import ObjectStore

log = logging.getLogger("stator.checkpoint")

OWNER_KEY = "_owner.json"
# A marker is a few dozen bytes; the operator reads it too (on delete), and whoever holds the
# storage credentials could write anything there: nothing larger is read.
MAX_MARKER_BYTES = 4096


class NotOwner(ConfigError):
    """The checkpoint root belongs to another job."""


@dataclass(frozen=True)
class Ownership:
    """``owner``: this job's id (a pipeline's uid); ``adopt``: take the root over from another
    owner instead of refusing to start."""

    owner: str = ""  # "": no owner (``stator run`` on its own): no marker written or read
    adopt: bool = False

    def claim(self, store: ObjectStore) -> None:
        """Steps 1-2 of the module docstring."""
        if not self.owner:
            return
        current = read_owner(store)
        if current == self.owner:
            return
        if current is not None and not self.adopt:
            raise NotOwner(
                f"checkpoint root {store.uri} belongs to another job (owner {current!r}; this "
                f"job is {self.owner!r}): its recovery would delete that job's checkpoints. "
                f"If this pipeline replaces it (recreated under the same name, and the other "
                f"no longer runs), set spec.checkpointing.adopt: true (checkpoint.adopt) to "
                f"take its checkpoints over; otherwise give this pipeline another "
                f"checkpointing.storage"
            )
        if current is not None:
            log.warning(
                "adopting checkpoint root %s from owner %r (checkpoint.adopt)", store.uri, current
            )
        marker = {"owner": self.owner, "since_ms": int(time.time() * 1000)}
        store.put(OWNER_KEY, json.dumps(marker, sort_keys=True).encode())

    def confirm(self, store: ObjectStore) -> None:
        """Before deleting subsumed checkpoints: the root is still this job's."""
        if not self.owner:
            return
        current = read_owner(store)
        if current != self.owner:
            raise NotOwner(
                f"checkpoint root {store.uri} was taken over by {current!r} (this job is "
                f"{self.owner!r}): this job deletes nothing there and stops"
            )


NO_OWNER = Ownership()  # a job that writes and checks no marker


def read_owner(store: ObjectStore) -> str | None:
    """The owner the marker names; None if there is no marker."""
    size = store.size(OWNER_KEY)
    if size is None:
        return None
    if size > MAX_MARKER_BYTES:
        raise StorageError(
            f"{store.url(OWNER_KEY)} has {size} bytes, more than an owner marker "
            f"({MAX_MARKER_BYTES}); remove it if no job owns this checkpoint root"
        )
    raw = store.get(OWNER_KEY)
    try:
        owner = json.loads(raw)["owner"]
    except (ValueError, KeyError, TypeError) as exc:
        raise StorageError(
            f"{store.url(OWNER_KEY)} is not an owner marker ({raw[:80]!r}); remove it if no "
            f"job owns this checkpoint root"
        ) from exc
    if not isinstance(owner, str) or not owner:
        raise StorageError(f"{store.url(OWNER_KEY)} names no owner; remove it if no job owns it")
    return owner


def release(store: ObjectStore, owner: str) -> bool:
    """Remove the marker if ``owner`` holds it (its pipeline was deleted): a pipeline created
    again under the name may then continue from the checkpoints. Whether it was removed."""
    if read_owner(store) != owner:
        return False
    store.delete([OWNER_KEY])
    return True
