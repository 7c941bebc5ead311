"""State descriptors: how a keyed function declares its state (name, kind, serializers).

The name is the state's identity within its operator (``uid``): a restore matches state by
operator uid and state name, so renaming either is a state migration, not a refactoring.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

from .serializers import PICKLE, Serializer


class StateKind(StrEnum):
    VALUE = "value"
    LIST = "list"
    MAP = "map"
    REDUCING = "reducing"


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"a state descriptor needs a non-empty string name, got {name!r}")


@dataclass(frozen=True)
class ValueStateDescriptor:
    """One value per key."""

    name: str
    serializer: Serializer = field(default=PICKLE, compare=False)
    kind: ClassVar[StateKind] = StateKind.VALUE

    def __post_init__(self) -> None:
        _check_name(self.name)


@dataclass(frozen=True)
class ListStateDescriptor:
    """A list per key; ``serializer`` serializes each element."""

    name: str
    serializer: Serializer = field(default=PICKLE, compare=False)
    kind: ClassVar[StateKind] = StateKind.LIST

    def __post_init__(self) -> None:
        _check_name(self.name)


@dataclass(frozen=True)
class MapStateDescriptor:
    """A map per key. Each user key is its own RocksDB entry, so a map may be large."""

    name: str
    serializer: Serializer = field(default=PICKLE, compare=False)
    key_serializer: Serializer = field(default=PICKLE, compare=False)
    kind: ClassVar[StateKind] = StateKind.MAP

    def __post_init__(self) -> None:
        _check_name(self.name)


@dataclass(frozen=True)
class ReducingStateDescriptor:
    """One value per key, combined with ``reduce_fn`` on each add. ``reduce_fn`` must be
    associative: Stator pre-combines values before they reach the state."""

    name: str
    reduce_fn: Callable[[Any, Any], Any] = field(default=operator.add, compare=False)
    serializer: Serializer = field(default=PICKLE, compare=False)
    kind: ClassVar[StateKind] = StateKind.REDUCING

    def __post_init__(self) -> None:
        _check_name(self.name)


StateDescriptor = (
    ValueStateDescriptor | ListStateDescriptor | MapStateDescriptor | ReducingStateDescriptor
)
