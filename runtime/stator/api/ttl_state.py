"""State handles of TTL-enabled states (``state/ttl.py``): the same methods as the handles in
``functions.py``, with expiry applied by their tables (``state/ttl_tables.py``). Separate
classes, so that states without TTL keep their handles' per-record paths unchanged."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from ..state.markers import MISSING

if TYPE_CHECKING:
    from ..state.ttl_tables import (
        TtlAggregatingTable,
        TtlListTable,
        TtlMapTable,
        TtlReducingTable,
        TtlValueTable,
    )
    from .functions import KeyCursor


class TtlValueState:
    __slots__ = ("_cur", "_t")

    def __init__(self, table: TtlValueTable, cursor: KeyCursor) -> None:
        self._t, self._cur = table, cursor

    def value(self, default: Any = None) -> Any:
        v = self._t.read(self._cur.kkey)
        return default if v is MISSING else v

    def update(self, value: Any) -> None:
        if value is None:
            raise ValueError("ValueState.update(None): use clear() to remove the value")
        self._t.write(self._cur.kkey, value)

    def clear(self) -> None:
        self._t.delete(self._cur.kkey)


class TtlReducingState:
    __slots__ = ("_cur", "_t")

    def __init__(self, table: TtlReducingTable, cursor: KeyCursor) -> None:
        self._t, self._cur = table, cursor

    def get(self, default: Any = None) -> Any:
        v = self._t.read(self._cur.kkey)
        return default if v is MISSING else v

    def add(self, value: Any) -> None:
        self._t.add(self._cur.kkey, value)

    def clear(self) -> None:
        self._t.delete(self._cur.kkey)


class TtlAggregatingState:
    __slots__ = ("_cur", "_t")

    def __init__(self, table: TtlAggregatingTable, cursor: KeyCursor) -> None:
        self._t, self._cur = table, cursor

    def get(self) -> Any:
        acc = self._t.read(self._cur.kkey)
        return None if acc is MISSING else self._t.function.result(acc)

    def add(self, value: Any) -> None:
        self._t.add(self._cur.kkey, value)

    def clear(self) -> None:
        self._t.delete(self._cur.kkey)


class TtlListState:
    __slots__ = ("_cur", "_t")

    def __init__(self, table: TtlListTable, cursor: KeyCursor) -> None:
        self._t, self._cur = table, cursor

    def get(self) -> list[Any]:
        return self._t.get(self._cur.kkey)

    def add(self, value: Any) -> None:
        self._t.add(self._cur.kkey, value)

    def add_all(self, values: Iterable[Any]) -> None:
        for value in values:
            self._t.add(self._cur.kkey, value)

    def update(self, values: Iterable[Any]) -> None:
        self._t.update(self._cur.kkey, list(values))

    def clear(self) -> None:
        self._t.delete(self._cur.kkey)


class TtlMapState:
    """``get``, ``contains`` and iteration are reads (they restamp with ON_READ_AND_WRITE);
    ``is_empty`` is not."""

    __slots__ = ("_cur", "_t", "_uks")

    def __init__(self, table: TtlMapTable, cursor: KeyCursor) -> None:
        self._t, self._cur = table, cursor
        self._uks = table.user_key_serializer

    def _skey(self) -> bytes:
        return self._cur.kkey + self._t.sid_byte

    def get(self, user_key: Any, default: Any = None) -> Any:
        v = self._t.read(self._skey(), self._uks.dumps(user_key))
        return default if v is MISSING else v

    def put(self, user_key: Any, value: Any) -> None:
        self._t.write(self._skey(), self._uks.dumps(user_key), value)

    def remove(self, user_key: Any) -> None:
        self._t.remove(self._skey(), self._uks.dumps(user_key))

    def contains(self, user_key: Any) -> bool:
        return self._t.read(self._skey(), self._uks.dumps(user_key)) is not MISSING

    def items(self) -> Iterator[tuple[Any, Any]]:
        loads = self._uks.loads
        return iter([(loads(k), v) for k, v in self._t.live_items(self._skey())])

    def keys(self) -> Iterator[Any]:
        return (k for k, _ in self.items())

    def values(self) -> Iterator[Any]:
        return (v for _, v in self.items())

    def is_empty(self) -> bool:
        return not self._t.has_live(self._skey())

    def clear(self) -> None:
        self._t.clear_key(self._skey())
