"""Reading and writing the control API's frozen dataclasses (``schema.py``) as JSON data, from
their field declarations alone: the schema is written once, as the classes.

``from_wire`` trusts nothing: a driver runs the user's code, so its answer is the user's. It
refuses (:class:`WireError`, naming the field) a value of the wrong type, a missing field
that has no default, a negative or infinite number, and a string or list longer than an
answer the client reads at all (``MAX_TEXT``, ``MAX_ITEMS``). Unknown keys are ignored: a
newer driver may add fields. What the operator copies into a status is cut further
(operator ``untrusted.py``): that bound is etcd's, not the schema's.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeAlias, TypeVar

from ..errors import StatorError

MAX_TEXT = 1 << 20  # characters of one string: the client reads at most 1 MiB of answer
MAX_ITEMS = 1 << 16  # entries of one list or mapping
MAX_INT = (1 << 63) - 1
OMIT_NONE = {"omit_none": True}  # field metadata: the key is left out while the value is None

T = TypeVar("T")
Json: TypeAlias = bool | int | float | str | list["Json"] | dict[str, "Json"] | None  # JSON data


class WireError(StatorError, ValueError):
    """An answer that does not have the schema's shape (the message names the field)."""


def camel(name: str) -> str:
    """``state_bytes`` -> ``stateBytes``: the status and stored-operation spelling of a field."""
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def to_wire(value: object) -> Json:
    """JSON data of a schema object (tuples become lists; an ``OMIT_NONE`` field that is None
    is left out)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: to_wire(v)
            for f in dataclasses.fields(value)
            if not ((v := getattr(value, f.name)) is None and f.metadata.get("omit_none"))
        }
    if isinstance(value, tuple | list):
        return [to_wire(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): to_wire(v) for k, v in value.items()}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"{type(value).__name__} is not JSON data")


def from_wire(cls: type[T], obj: object, where: str = "") -> T:
    """The ``cls`` that JSON data ``obj`` describes, or :class:`WireError`."""
    return typing.cast(T, _read(cls, obj, where or cls.__name__))


@functools.cache
def _hints(cls: type) -> dict[str, object]:
    return typing.get_type_hints(cls)


def _read(tp: Any, obj: object, where: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is types.UnionType or origin is typing.Union:
        if obj is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _read(inner, obj, where)
    if dataclasses.is_dataclass(tp):
        return _read_object(typing.cast(type, tp), obj, where)
    if origin is tuple:
        items = _sized(obj, list, "a list", where)
        if len(args) == 2 and args[1] is Ellipsis:
            args = (args[0],) * len(items)
        elif len(items) != len(args):
            raise WireError(f"{where}: expected {len(args)} entries, got {len(items)}")
        pairs = enumerate(zip(args, items, strict=True))
        return tuple(_read(a, v, f"{where}[{i}]") for i, (a, v) in pairs)
    if origin in (dict, Mapping):
        entries = _sized(obj, dict, "an object", where)
        return {
            _read(str, k, f"{where} key"): _read(args[1], v, f"{where}[{k!r:.60}]")
            for k, v in entries.items()
        }
    return _read_scalar(tp, obj, where)


def _read_scalar(tp: Any, obj: object, where: str) -> Any:
    if tp is bool:
        if not isinstance(obj, bool):
            raise WireError(f"{where}: expected true or false, got {_shown(obj)}")
        return obj
    if tp is int:
        if isinstance(obj, bool) or not isinstance(obj, int):
            raise WireError(f"{where}: expected an integer, got {_shown(obj)}")
        if not 0 <= obj <= MAX_INT:
            raise WireError(f"{where}: {obj} is out of range (0 to {MAX_INT})")
        return obj
    if tp is float:  # an int is a float too (JSON does not tell 1 from 1.0)
        if isinstance(obj, bool) or not isinstance(obj, int | float) or not math.isfinite(obj):
            raise WireError(f"{where}: expected a number, got {_shown(obj)}")
        if obj < 0:
            raise WireError(f"{where}: {obj} is negative")
        return float(obj)
    if tp is str:
        if not isinstance(obj, str):
            raise WireError(f"{where}: expected a string, got {_shown(obj)}")
        if len(obj) > MAX_TEXT:
            raise WireError(f"{where}: a string of {len(obj)} characters; at most {MAX_TEXT}")
        return obj
    raise TypeError(f"{where}: the schema uses a type the wire cannot carry: {tp!r}")


def _read_object(cls: type, obj: object, where: str) -> Any:
    data = _sized(obj, dict, "an object", where)
    hints, values = _hints(cls), {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            values[f.name] = _read(hints[f.name], data[f.name], f"{where}.{f.name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise WireError(f"{where}: the field {f.name!r} is missing")
    return cls(**values)


def _sized(obj: object, kind: type, named: str, where: str) -> Any:
    if not isinstance(obj, kind):
        raise WireError(f"{where}: expected {named}, got {_shown(obj)}")
    if len(obj) > MAX_ITEMS:  # type: ignore[arg-type]
        raise WireError(f"{where}: {len(obj)} entries; at most {MAX_ITEMS}")  # type: ignore[arg-type]
    return obj


def _shown(obj: object) -> str:
    text = repr(obj)
    return f"{type(obj).__name__} {text if len(text) <= 40 else text[:40] + '...'}"
