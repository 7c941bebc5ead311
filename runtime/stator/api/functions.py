"""What user code implements and what it sees: keyed process functions, their contexts, and
state handles bound to the key being processed."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, overload

from ..state import ttl_tables
from ..state.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from ..state.markers import MISSING
from ..state.operator_state import (
    BroadcastTable,
    OperatorListTable,
    OperatorStateKind,
    OperatorTable,
)
from .operator_state import BroadcastState, OperatorListState
from .ttl_state import (
    TtlAggregatingState,
    TtlListState,
    TtlMapState,
    TtlReducingState,
    TtlValueState,
)

if TYPE_CHECKING:
    from ..state.tables import AggregatingTable, ListTable, MapTable, ReducingTable, Table


class KeyCursor:
    """The key being processed (its kkey: key-group, length, encoded key). Shared by every
    state handle of an operator, so setting it once per record rebinds them all."""

    __slots__ = ("kkey",)

    def __init__(self) -> None:
        self.kkey: bytes = b""


class _NoKey(bytes):
    """The cursor's key where there is none (``process_broadcast_element``): any use of it by a
    keyed state handle or a timer raises at once, at no cost to the per-record path."""

    def _refuse(self, *args: object) -> Any:
        raise RuntimeError(
            "there is no current key here (process_broadcast_element, or a non-keyed "
            "BroadcastProcessFunction): keyed state and timers need one; in "
            "process_broadcast_element reach keyed state with ctx.apply_to_keyed_state()"
        )

    __hash__ = _refuse
    __eq__ = _refuse
    __add__ = _refuse
    __getitem__ = _refuse
    __len__ = _refuse


NO_KEY = _NoKey()


# ---------------------------------------------------------------------------- state handles


class ValueState:
    # The table's cache and dirty set are held directly: value() and update() run once per
    # record, and each attribute hop shows (as does a method call where a subscript will do).
    __slots__ = ("_cache", "_cur", "_dirty", "_missing", "_t")

    def __init__(self, table: Table, cursor: KeyCursor) -> None:
        self._t, self._cur, self._missing = table, cursor, MISSING
        self._cache, self._dirty = table.cache, table.dirty

    def value(self, default: Any = None) -> Any:
        try:
            v = self._cache[self._cur.kkey]
        except KeyError:  # not read yet this epoch (or absent from a complete cache)
            v = self._t.load(self._cur.kkey)
        return default if v is self._missing else v

    def update(self, value: Any) -> None:
        if value is None:
            raise ValueError("ValueState.update(None): use clear() to remove the value")
        kk = self._cur.kkey
        self._cache[kk] = value
        self._dirty.add(kk)

    def clear(self) -> None:
        self._t.delete(self._cur.kkey)


class ReducingState:
    __slots__ = ("_cur", "_missing", "_t")

    def __init__(self, table: ReducingTable, cursor: KeyCursor) -> None:
        self._t, self._cur, self._missing = table, cursor, MISSING

    def get(self, default: Any = None) -> Any:
        v = self._t.load(self._cur.kkey)
        return default if v is self._missing else v

    def add(self, value: Any) -> None:
        self._t.add(self._cur.kkey, value)

    def clear(self) -> None:
        self._t.delete(self._cur.kkey)


class AggregatingState:
    """``add`` folds a value into the key's accumulator; ``get`` is its result (None while
    the key has none)."""

    __slots__ = ("_cur", "_missing", "_t")

    def __init__(self, table: AggregatingTable, cursor: KeyCursor) -> None:
        self._t, self._cur, self._missing = table, cursor, MISSING

    def get(self) -> Any:
        acc = self._t.load(self._cur.kkey)
        return None if acc is self._missing else self._t.function.result(acc)

    def add(self, value: Any) -> None:
        self._t.add(self._cur.kkey, value)

    def clear(self) -> None:
        self._t.delete(self._cur.kkey)


class ListState:
    __slots__ = ("_cur", "_missing", "_t")

    def __init__(self, table: ListTable, cursor: KeyCursor) -> None:
        self._t, self._cur, self._missing = table, cursor, MISSING

    def get(self) -> list[Any]:
        """A copy of the list (empty if the key has none)."""
        v = self._t.load(self._cur.kkey)
        return [] if v is self._missing else list(v)

    def add(self, value: Any) -> None:
        key = self._cur.kkey
        v = self._t.load(key)
        if v is self._missing:
            self._t.store(key, [value])
        else:
            v.append(value)
            self._t.dirty.add(key)

    def add_all(self, values: Iterable[Any]) -> None:
        for value in values:
            self.add(value)

    def update(self, values: Iterable[Any]) -> None:
        items = list(values)
        if items:
            self._t.store(self._cur.kkey, items)
        else:
            self._t.delete(self._cur.kkey)

    def clear(self) -> None:
        self._t.delete(self._cur.kkey)


class MapState:
    __slots__ = ("_cur", "_missing", "_t", "_uks")

    def __init__(self, table: MapTable, cursor: KeyCursor) -> None:
        self._t, self._cur, self._missing = table, cursor, MISSING
        self._uks = table.user_key_serializer

    def _skey(self) -> bytes:
        return self._cur.kkey + self._t.sid_byte

    def get(self, user_key: Any, default: Any = None) -> Any:
        v = self._t.get(self._skey(), self._uks.dumps(user_key))
        return default if v is self._missing else v

    def put(self, user_key: Any, value: Any) -> None:
        self._t.put(self._skey(), self._uks.dumps(user_key), value)

    def remove(self, user_key: Any) -> None:
        self._t.remove(self._skey(), self._uks.dumps(user_key))

    def contains(self, user_key: Any) -> bool:
        return self._t.get(self._skey(), self._uks.dumps(user_key)) is not self._missing

    def items(self) -> Iterator[tuple[Any, Any]]:
        loads = self._uks.loads
        for ukey, value in self._t.items(self._skey()):
            yield loads(ukey), value

    def keys(self) -> Iterator[Any]:
        return (k for k, _ in self.items())

    def values(self) -> Iterator[Any]:
        return (v for _, v in self.items())

    def is_empty(self) -> bool:
        return next(iter(self._t.items(self._skey())), None) is None

    def clear(self) -> None:
        self._t.clear_key(self._skey())


# ---------------------------------------------------------------------------- contexts


class StateProvider(Protocol):
    def table(self, desc: StateDescriptor) -> Table: ...
    def operator_table(
        self, desc: ListStateDescriptor | MapStateDescriptor, kind: OperatorStateKind
    ) -> OperatorTable: ...


class RuntimeContext:
    """Given to ``open``: where a function declares its state."""

    def __init__(
        self,
        backend: StateProvider,
        cursor: KeyCursor,
        operator_uid: str,
        subtask_index: int,
        parallelism: int,
        max_parallelism: int,
    ) -> None:
        self._backend, self._cursor = backend, cursor
        self.operator_uid = operator_uid
        self.subtask_index = subtask_index
        self.parallelism = parallelism
        self.max_parallelism = max_parallelism

    @overload
    def get_state(self, desc: ValueStateDescriptor) -> ValueState: ...
    @overload
    def get_state(self, desc: ListStateDescriptor) -> ListState: ...
    @overload
    def get_state(self, desc: MapStateDescriptor) -> MapState: ...
    @overload
    def get_state(self, desc: ReducingStateDescriptor) -> ReducingState: ...
    @overload
    def get_state(self, desc: AggregatingStateDescriptor) -> AggregatingState: ...

    def get_state(self, desc: StateDescriptor) -> Any:
        table = self._backend.table(desc)
        if desc.ttl is not None:
            return _ttl_handle(table, self._cursor)
        if isinstance(desc, AggregatingStateDescriptor):
            return AggregatingState(table, self._cursor)  # type: ignore[arg-type]
        if isinstance(desc, MapStateDescriptor):
            return MapState(table, self._cursor)  # type: ignore[arg-type]
        if isinstance(desc, ListStateDescriptor):
            return ListState(table, self._cursor)  # type: ignore[arg-type]
        if isinstance(desc, ReducingStateDescriptor):
            return ReducingState(table, self._cursor)  # type: ignore[arg-type]
        return ValueState(table, self._cursor)

    # Non-keyed state (``api/operator_state.py``): one per operator subtask, not per key.

    def get_broadcast_state(self, desc: MapStateDescriptor) -> BroadcastState:
        """The operator's broadcast state: a map every subtask holds identically (writable;
        ``.read_only()`` is the view for code that must not change it)."""
        table = self._backend.operator_table(desc, OperatorStateKind.BROADCAST)
        assert isinstance(table, BroadcastTable)
        return BroadcastState(table)

    def get_operator_list_state(self, desc: ListStateDescriptor) -> OperatorListState:
        """This subtask's list; on a rescale the old subtasks' elements are split evenly
        between the new ones. (``get_state(ListStateDescriptor)`` is keyed list state.)"""
        return self._operator_list(desc, OperatorStateKind.SPLIT_LIST)

    def get_union_list_state(self, desc: ListStateDescriptor) -> OperatorListState:
        """This subtask's list; on a rescale every new subtask gets all old elements."""
        return self._operator_list(desc, OperatorStateKind.UNION_LIST)

    def _operator_list(
        self, desc: ListStateDescriptor, kind: OperatorStateKind
    ) -> OperatorListState:
        table = self._backend.operator_table(desc, kind)
        assert isinstance(table, OperatorListTable)
        return OperatorListState(table)


def _ttl_handle(table: Table, cursor: KeyCursor) -> Any:
    """The handle of a TTL-enabled state (``ttl_state.py``), by its table's kind."""
    if isinstance(table, ttl_tables.TtlMapTable):
        return TtlMapState(table, cursor)
    if isinstance(table, ttl_tables.TtlListTable):
        return TtlListState(table, cursor)
    if isinstance(table, ttl_tables.TtlReducingTable):
        return TtlReducingState(table, cursor)
    if isinstance(table, ttl_tables.TtlAggregatingTable):
        return TtlAggregatingState(table, cursor)
    assert isinstance(table, ttl_tables.TtlValueTable)
    return TtlValueState(table, cursor)


class TimerService(Protocol):
    def register_event_time_timer(self, timestamp: int) -> None: ...
    def delete_event_time_timer(self, timestamp: int) -> None: ...
    def register_processing_time_timer(self, timestamp: int) -> None: ...
    def delete_processing_time_timer(self, timestamp: int) -> None: ...
    def current_watermark(self) -> int: ...
    def current_processing_time(self) -> int: ...


class Timestamped(NamedTuple):
    """An output record with its own event timestamp (by default an output takes the
    timestamp of the record or timer that produced it), e.g. a join's ``max`` of both."""

    value: Any
    timestamp: int


@dataclass(frozen=True)
class OutputTag:
    """Names a side output: ``ctx.output(tag, value)`` emits to it, ``stream.side_output(tag)``
    reads it as a stream of its own."""

    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"OutputTag needs a non-empty string name, got {self.name!r}")


class Context(Protocol):
    """Given to ``process_element`` and ``on_timer``."""

    @property
    def current_key(self) -> Any: ...
    @property
    def timestamp(self) -> int | None: ...
    @property
    def timer_service(self) -> TimerService: ...
    def output(self, tag: OutputTag, value: Any) -> None:
        """Emit ``value`` to the side output ``tag`` (with the current record's timestamp)."""


class KeyedProcessFunction:
    """Processes one keyed record at a time with keyed state and timers.

    ``process_element`` and ``on_timer`` return an iterable of output records (or None).
    Records within one key are processed in input order; a replayed epoch is processed in
    exactly the same order, so deterministic functions give identical output after recovery.
    """

    def open(self, ctx: RuntimeContext) -> None:
        """Declare state here, with ``ctx.get_state(descriptor)``."""

    def process_element(self, value: Any, ctx: Context) -> Iterable[Any] | None:
        raise NotImplementedError

    def on_timer(self, timestamp: int, ctx: Context) -> Iterable[Any] | None:
        return None

    def close(self) -> None:
        """Called when the task's epoch ends (after the state is committed)."""


class KeyedCoProcessFunction:
    """Processes two keyed inputs connected by key (``a.key_by(f).connect(b.key_by(g))``):
    both share the key's state and timers. The operator's watermark is the minimum of both
    inputs'. Within an epoch, records are processed in a deterministic order (by upstream
    task, not by timestamp), the same on every replay."""

    def open(self, ctx: RuntimeContext) -> None:
        """Declare state here, with ``ctx.get_state(descriptor)``."""

    def process_element1(self, value: Any, ctx: Context) -> Iterable[Any] | None:
        raise NotImplementedError

    def process_element2(self, value: Any, ctx: Context) -> Iterable[Any] | None:
        raise NotImplementedError

    def on_timer(self, timestamp: int, ctx: Context) -> Iterable[Any] | None:
        return None

    def close(self) -> None:
        """Called when the task's epoch ends (after the state is committed)."""


class KeyedBroadcastProcessFunction:
    """Processes a keyed stream connected with a broadcast stream
    (``keyed.connect(stream.broadcast())``). Every subtask receives every broadcast record and
    applies it, in the same order, to its broadcast state (``ctx.get_broadcast_state(desc)``
    in ``process_broadcast_element``, writable there; read-only in ``process_element``), so
    all subtasks hold the same broadcast state. Within an epoch a subtask applies the epoch's
    broadcast records before its keyed records: a rule that arrived in an epoch applies to
    that epoch's records, on every replay. ``process_broadcast_element`` has no current key:
    keyed state is reached there through ``ctx.apply_to_keyed_state(desc, fn)``."""

    def open(self, ctx: RuntimeContext) -> None:
        """Declare keyed state here, with ``ctx.get_state(descriptor)``."""

    def process_element(self, value: Any, ctx: Any) -> Iterable[Any] | None:
        raise NotImplementedError

    def process_broadcast_element(self, value: Any, ctx: Any) -> Iterable[Any] | None:
        raise NotImplementedError

    def on_timer(self, timestamp: int, ctx: Context) -> Iterable[Any] | None:
        return None

    def close(self) -> None:
        """Called when the task's epoch ends (after the state is committed)."""


class BroadcastProcessFunction:
    """Processes a non-keyed stream connected with a broadcast stream
    (``stream.connect(rules.broadcast())``): as :class:`KeyedBroadcastProcessFunction`, with
    no key, so no keyed state and no timers; each upstream task's records go to one subtask,
    and every subtask holds the same broadcast state."""

    def open(self, ctx: RuntimeContext) -> None:
        """Declare broadcast state here, or get it from the context per call."""

    def process_element(self, value: Any, ctx: Any) -> Iterable[Any] | None:
        raise NotImplementedError

    def process_broadcast_element(self, value: Any, ctx: Any) -> Iterable[Any] | None:
        raise NotImplementedError

    def close(self) -> None:
        """Called when the task's epoch ends (after the state is committed)."""


class ProcessFunction:
    """Processes a non-keyed stream (``stream.process(fn, uid=...)``) in parallel subtasks:
    each upstream task's records go to one subtask. No key, so no keyed state and no timers;
    a subtask keeps operator state (``ctx.get_operator_list_state`` / union list state),
    redistributed on rescale, and may emit side outputs."""

    def open(self, ctx: RuntimeContext) -> None:
        """Declare operator state here."""

    def process_element(self, value: Any, ctx: Any) -> Iterable[Any] | None:
        raise NotImplementedError

    def close(self) -> None:
        """Called when the task's epoch ends (after the state is committed)."""


AnyProcessFunction = (
    ProcessFunction
    | KeyedProcessFunction
    | KeyedCoProcessFunction
    | KeyedBroadcastProcessFunction
    | BroadcastProcessFunction
)
