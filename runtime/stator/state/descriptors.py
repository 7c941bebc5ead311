"""State descriptors: how a keyed function declares its state (name, kind, serializers).

The name is the state's identity within its operator (``uid``): a restore matches state by
operator uid and state name, so renaming either is a state migration, not a refactoring.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, Protocol

from .serializers import PICKLE, Serializer
from .ttl import StateTtlConfig, check_ttl


class StateKind(StrEnum):
    VALUE = "value"
    LIST = "list"
    MAP = "map"
    REDUCING = "reducing"
    AGGREGATING = "aggregating"


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"a state descriptor needs a non-empty string name, got {name!r}")


@dataclass(frozen=True)
class ValueStateDescriptor:
    """One value per key."""

    name: str
    serializer: Serializer = field(default=PICKLE, compare=False)
    ttl: StateTtlConfig | None = None
    kind: ClassVar[StateKind] = StateKind.VALUE

    def __post_init__(self) -> None:
        _check_name(self.name)
        check_ttl(self.name, self.ttl)


@dataclass(frozen=True)
class ListStateDescriptor:
    """A list per key; ``serializer`` serializes each element."""

    name: str
    serializer: Serializer = field(default=PICKLE, compare=False)
    ttl: StateTtlConfig | None = None
    kind: ClassVar[StateKind] = StateKind.LIST

    def __post_init__(self) -> None:
        _check_name(self.name)
        check_ttl(self.name, self.ttl)


@dataclass(frozen=True)
class MapStateDescriptor:
    """A map per key. Each user key is its own RocksDB entry, so a map may be large."""

    name: str
    serializer: Serializer = field(default=PICKLE, compare=False)
    key_serializer: Serializer = field(default=PICKLE, compare=False)
    ttl: StateTtlConfig | None = None
    kind: ClassVar[StateKind] = StateKind.MAP

    def __post_init__(self) -> None:
        _check_name(self.name)
        check_ttl(self.name, self.ttl)


@dataclass(frozen=True)
class ReducingStateDescriptor:
    """One value per key, combined with ``reduce_fn`` on each add. ``reduce_fn`` must be
    associative: Stator pre-combines values before they reach the state."""

    name: str
    reduce_fn: Callable[[Any, Any], Any] = field(default=operator.add, compare=False)
    serializer: Serializer = field(default=PICKLE, compare=False)
    ttl: StateTtlConfig | None = None
    kind: ClassVar[StateKind] = StateKind.REDUCING

    def __post_init__(self) -> None:
        _check_name(self.name)
        check_ttl(self.name, self.ttl)


class AggregateFunction(Protocol):
    """Folds added values into an accumulator; the same protocol as the window aggregates
    (``api/windows.Aggregate``), so one object serves both."""

    def create(self) -> Any: ...
    def add(self, acc: Any, value: Any) -> Any: ...
    def merge(self, a: Any, b: Any) -> Any: ...
    def result(self, acc: Any) -> Any: ...


@dataclass(frozen=True)
class AggregatingStateDescriptor:
    """One accumulator per key: ``add`` folds a value in with ``aggregate_function.add``,
    ``get`` returns ``aggregate_function.result`` of it. The serializer stores the
    accumulator."""

    name: str
    aggregate_function: AggregateFunction = field(compare=False)
    serializer: Serializer = field(default=PICKLE, compare=False)
    ttl: StateTtlConfig | None = None
    kind: ClassVar[StateKind] = StateKind.AGGREGATING

    def __post_init__(self) -> None:
        _check_name(self.name)
        check_ttl(self.name, self.ttl)
        missing = [
            m
            for m in ("create", "add", "merge", "result")
            if not callable(getattr(self.aggregate_function, m, None))
        ]
        if missing:
            raise ValueError(
                f"state '{self.name}': aggregate_function must have create(), add(acc, value), "
                f"merge(a, b) and result(acc) (as api.windows.Count does); "
                f"{type(self.aggregate_function).__name__} lacks {', '.join(missing)}"
            )


StateDescriptor = (
    ValueStateDescriptor
    | ListStateDescriptor
    | MapStateDescriptor
    | ReducingStateDescriptor
    | AggregatingStateDescriptor
)
