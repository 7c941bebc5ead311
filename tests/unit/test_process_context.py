"""The key a process function sees: looked up in bulk per batch, decoded where not memoized."""

from __future__ import annotations

from typing import Any

from stator.keygroups import encode_key
from stator.state.layout import HEADER
from stator.tasks.operators import user_keys


class TouchyKey:
    """A key type whose equality refuses other types (as some user types do)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TouchyKey):
            raise TypeError(f"cannot compare TouchyKey with {type(other).__name__}")
        return self.n == other.n

    def __hash__(self) -> int:
        return hash(self.n)


def _kkey(key: Any) -> bytes:
    kb = encode_key(key)
    return HEADER.pack(3, len(kb)) + kb


def test_keys_of_every_type_come_back_in_order_memoized_or_not() -> None:
    """Whether any key still needs decoding is asked by identity: asking ``None in keys``
    would call a user key's ``__eq__`` with None."""
    keys: list[Any] = [TouchyKey(5), "a", 7, (1, "b"), b"raw"]
    kkeys = [_kkey(k) for k in keys]
    for _ in range(2):  # first decoded, then from the memo
        got = user_keys(kkeys)
        assert isinstance(got[0], TouchyKey) and got[0].n == 5
        assert got[1:] == keys[1:]
    assert user_keys([_kkey(None), _kkey("a")]) == [None, "a"]  # None is a key like others
