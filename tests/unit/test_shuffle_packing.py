"""What the shuffle carries between a task and a keyed subtask: a header packed by the task
(and the memo-less pickling beneath it, which the warm cache file uses too)."""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

from stator import pickling
from stator.tasks.routing import Header, pack, unpack


def _header(values: list[Any]) -> Header:
    kkeys = [bytes([0, i, 0, 1]) + b"k" for i in range(len(values))]
    return ((3, 1), 42, 0, (kkeys, values, list(range(len(values)))))


def test_a_header_comes_back_equal_and_in_order() -> None:
    values: list[Any] = [("k1", 1, 10), ["a", {"b": 2.5}], None, b"\x00raw", 2**70]
    header = _header(values)
    assert unpack(pack(header)) == header


def test_a_shared_object_arrives_as_equal_copies() -> None:
    """No memo: a repeated object is written per reference, the reader sees equal values."""
    shared = {"payload": "x" * 100}
    header = _header([shared, shared])
    got = unpack(pack(header))
    assert got == header
    values = got[3][1]
    assert values[0] == values[1] == shared


def test_a_cyclic_value_is_packed_with_the_memo() -> None:
    cyclic: list[Any] = [1]
    cyclic.append(cyclic)
    got = unpack(pack(_header([cyclic])))
    value = got[3][1][0]
    assert value[0] == 1 and value[1] is value


def test_a_user_type_of_a_module_workers_cannot_import_travels_by_value() -> None:
    """Records of a class defined where the workers cannot import it (a pipeline file, a
    notebook): pickled by value, as PySpark's own serializer does."""

    @dataclass(frozen=True)
    class Event:  # local: plain pickle cannot find it by name
        key: str
        n: int

    blob = pack(_header([Event("a", 1)]))
    value = unpack(blob)[3][1][0]
    assert (value.key, value.n) == ("a", 1)


def test_plain_pickling_without_the_memo_falls_back_for_a_cycle() -> None:
    cyclic: dict[str, Any] = {"n": 1}
    cyclic["self"] = cyclic
    value = pickle.loads(pickling.dumps({7: (cyclic, True)}))  # noqa: S301 - our own bytes
    assert value[7][0]["self"] is value[7][0] and value[7][1] is True
    assert pickle.loads(pickling.dumps([b"k", 2**63, None])) == [b"k", 2**63, None]  # noqa: S301
