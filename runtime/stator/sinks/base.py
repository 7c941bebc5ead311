"""Sinks: executor-side writers per epoch, driver-side commits per completed checkpoint.

An exactly-once sink stages each epoch's output where readers do not look and commits it
(idempotently) when the checkpoint covering that epoch completes. Part names are
deterministic, so a replayed epoch rewrites the same parts instead of adding new ones.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..storage import ObjectStore


class SinkWriter(ABC):
    @abstractmethod
    def write(self, values: list[Any]) -> None: ...

    @abstractmethod
    def finish(self) -> tuple[dict[str, Any], Any]:
        """Stage what was written. Returns a JSON-able descriptor (kept in checkpoint metadata
        until committed) and an optional payload that travels to the driver in the report."""


@dataclass(frozen=True)
class SinkContext:
    """What the driver tells a sink before the job's first epoch (``Sink.bind``)."""

    job: str
    uid: str
    store: ObjectStore  # the job's (or region's) checkpoint store: staged output goes beside it
    checkpoints: bool  # checkpoint.enabled: without, every epoch commits when it ends


class Sink(ABC):
    """Implementations must be picklable: they travel to executors."""

    exactly_once: bool = True

    @abstractmethod
    def writer(self, uid: str, epoch: int, part: str) -> SinkWriter: ...

    def commit(  # noqa: B027 - optional hook
        self, uid: str, epoch: int, parts: list[dict[str, Any]], payloads: list[Any]
    ) -> None:
        """Make ``epoch``'s staged parts visible. Must be idempotent: it may run again after a
        driver restart. ``payloads`` is empty when re-committing from checkpoint metadata."""

    def discard_after(self, uid: str, epoch: int) -> None:  # noqa: B027 - optional hook
        """Remove staged output of epochs after ``epoch`` (they will be replayed)."""

    def bind(self, context: SinkContext) -> None:  # noqa: B027 - optional hook
        """Called on the driver before the first epoch, before the sink travels to
        executors: a sink that stages output or names itself after the job learns where."""

    def connect(self) -> None:  # noqa: B027 - optional hook
        """Build what a worker process needs to write now rather than at its first write:
        a pre-started driver's Python workers do it before the hand-over."""
