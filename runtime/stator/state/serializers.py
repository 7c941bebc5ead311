"""Value serializers for state. Each has a stable name and a version, recorded with the state,
so a restore can tell an incompatible serializer from a compatible one and say which state."""

from __future__ import annotations

import json
import pickle
import struct
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Serializer(Protocol):
    name: str
    version: int

    def dumps(self, value: Any) -> bytes: ...

    def loads(self, data: bytes) -> Any: ...


class PickleSerializer:
    """Any picklable value. The default; fast for small Python values."""

    name, version = "pickle", 1

    def dumps(self, value: Any) -> bytes:
        return pickle.dumps(value, protocol=5)

    def loads(self, data: bytes) -> Any:
        return pickle.loads(data)  # noqa: S301 - state written by this job


class IntSerializer:
    """Signed 64-bit integers, 8 bytes big-endian."""

    name, version = "int64", 1
    _s = struct.Struct(">q")
    # The struct's own packer, not a method wrapping it: one call less per value written.
    dumps: Callable[[Any], bytes] = staticmethod(_s.pack)

    def loads(self, data: bytes) -> Any:
        return self._s.unpack(data)[0]


class FloatSerializer:
    name, version = "float64", 1
    _s = struct.Struct(">d")
    dumps: Callable[[Any], bytes] = staticmethod(_s.pack)

    def loads(self, data: bytes) -> Any:
        return self._s.unpack(data)[0]


class StrSerializer:
    name, version = "utf8", 1

    def dumps(self, value: Any) -> bytes:
        return str(value).encode()

    def loads(self, data: bytes) -> Any:
        return data.decode()


class BytesSerializer:
    name, version = "bytes", 1

    def dumps(self, value: Any) -> bytes:
        return bytes(value)

    def loads(self, data: bytes) -> Any:
        return bytes(data)


class JsonSerializer:
    """JSON: readable by other languages and by the offline state reader."""

    name, version = "json", 1

    def dumps(self, value: Any) -> bytes:
        return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()

    def loads(self, data: bytes) -> Any:
        return json.loads(data)


PICKLE = PickleSerializer()
INT64 = IntSerializer()
FLOAT64 = FloatSerializer()
UTF8 = StrSerializer()
BYTES = BytesSerializer()
JSON = JsonSerializer()


BUILTIN: dict[str, Serializer] = {s.name: s for s in (PICKLE, INT64, FLOAT64, UTF8, BYTES, JSON)}


def by_name(name: str) -> Serializer | None:
    """A built-in serializer by its recorded name (None for a custom one)."""
    return BUILTIN.get(name)
