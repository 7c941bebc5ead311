"""Stored JSON (checkpoint and savepoint metadata) read field by field. A file that parses but
has the wrong shape (edited by hand, truncated into ``null``, written by something else) is
refused when it is read, naming the field, rather than crashing whatever uses the field first.
Every problem is a ValueError; the metadata modules turn it into their "unusable" error."""

from __future__ import annotations

import json
from typing import Any

# The largest timestamp a summary can print (9999-12-31T23:59:59.999Z), in epoch ms.
MAX_TIMESTAMP_MS = 253_402_300_799_999


class Fields:
    """A JSON object, and where it is in its document (for messages)."""

    def __init__(self, value: object, path: str = "") -> None:
        if not isinstance(value, dict):
            raise ValueError(f"{path or 'the document'} must be a JSON object, got {_kind(value)}")
        self.raw: dict[str, Any] = value
        self.path = path

    def _at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def value(self, key: str) -> Any:
        """A field of any type, which must be there."""
        if key not in self.raw:
            raise ValueError(f"{self._at(key)} is missing")
        return self.raw[key]

    def integer(self, key: str, low: int | None = None) -> int:
        """An integer field (not a bool, not a float)."""
        value = self.value(key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{self._at(key)} must be an integer, got {_kind(value)}")
        if low is not None and value < low:
            raise ValueError(f"{self._at(key)} must be >= {low}, got {value}")
        return value

    def timestamp_ms(self, key: str) -> int:
        """Epoch milliseconds that a date can be made of."""
        value = self.integer(key, low=0)
        if value > MAX_TIMESTAMP_MS:
            raise ValueError(f"{self._at(key)} is not a time in epoch milliseconds: {value}")
        return value

    def text(self, key: str) -> str:
        value = self.value(key)
        if not isinstance(value, str):
            raise ValueError(f"{self._at(key)} must be a string, got {_kind(value)}")
        return value

    def flag(self, key: str) -> bool:
        value = self.value(key)
        if not isinstance(value, bool):
            raise ValueError(f"{self._at(key)} must be true or false, got {_kind(value)}")
        return value

    def array(self, key: str) -> list[Any]:
        value = self.value(key)
        if not isinstance(value, list):
            raise ValueError(f"{self._at(key)} must be a JSON array, got {_kind(value)}")
        return value

    def fields(self, key: str) -> Fields:
        """A nested object."""
        return Fields(self.value(key), self._at(key))

    def texts(self, key: str) -> list[str]:
        """An array of strings."""
        values = self.array(key)
        for i, value in enumerate(values):
            if not isinstance(value, str):
                raise ValueError(f"{self._at(key)}[{i}] must be a string, got {_kind(value)}")
        return values

    def each(self) -> dict[str, Fields]:
        """This object's values, each of which must be an object (e.g. operators by uid)."""
        return {k: Fields(v, self._at(k)) for k, v in self.raw.items()}

    def objects(self, key: str) -> dict[str, Fields]:
        """A nested object whose every value is an object."""
        return self.fields(key).each()

    def nested_objects(self, key: str) -> dict[str, dict[str, dict[str, Any]]]:
        """An object of objects of objects (e.g. split states by split by source uid)."""
        return {
            k: {k2: v2.raw for k2, v2 in v.each().items()} for k, v in self.objects(key).items()
        }

    def items(self, key: str) -> list[Fields]:
        """A nested array whose every element is an object."""
        return [Fields(v, f"{self._at(key)}[{i}]") for i, v in enumerate(self.array(key))]


def _kind(value: object) -> str:
    """A wrong value as a user would recognize it in the file."""
    if value is None:
        return "null"
    if isinstance(value, dict | list):
        return "an object" if isinstance(value, dict) else "an array"
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."
