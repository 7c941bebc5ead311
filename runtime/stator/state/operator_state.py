"""Non-keyed state of an operator subtask: broadcast state (a map, the same in every subtask)
and operator list state (a list per subtask, redistributed split or union on a rescale).

Small by nature (Flink keeps it on the heap), so it lives on the heap for an epoch and is
stored as one blob per subtask: one RocksDB entry outside every key-group
(``layout.META_OPERATOR_STATE``), written in the epoch's commit batch (atomic with the keyed
state, kept by local recovery and by every copy of the database), and carried inline in the
checkpoint's and savepoint's metadata, so a restore at another parallelism reads every old
subtask's blob without downloading their databases (``redistribute``).

    blob      := MAGIC VERSION:u8 states:u32 state*      (exactly ``states`` states)
    state     := name:bytes kind:u8 count:u32 serializer:bytes key_serializer:bytes element*
    element   := bytes                           (lists: each element as serialized)
               | key:bytes value:bytes           (broadcast: each entry)
    bytes     := length:u32 data
"""

from __future__ import annotations

import base64
import binascii
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from .descriptors import ListStateDescriptor, MapStateDescriptor
from .serializers import Serializer

MAGIC = b"STOS"
VERSION = 1
# One subtask's non-keyed state, encoded; it is inline in every checkpoint's metadata.
MAX_BLOB_BYTES = 4 * 1024 * 1024
_HEAD = struct.Struct(">4sBI")
_LEN = struct.Struct(">I")
_KIND = struct.Struct(">BI")  # kind, element count


class OperatorStateKind(StrEnum):
    """How a non-keyed state is redistributed when the operator's parallelism changes."""

    BROADCAST = "broadcast"  # every new subtask gets one old subtask's copy
    SPLIT_LIST = "operator_list"  # the old elements, concatenated and split evenly
    UNION_LIST = "union_list"  # every new subtask gets every old element


OPERATOR_KINDS = frozenset(k.value for k in OperatorStateKind)
_CODES = {OperatorStateKind.BROADCAST: 0, OperatorStateKind.SPLIT_LIST: 1}
_CODES[OperatorStateKind.UNION_LIST] = 2
_KINDS = {code: kind for kind, code in _CODES.items()}


class OperatorStateError(ValueError):
    """A blob of non-keyed state that cannot be read."""


@dataclass(frozen=True)
class RawState:
    """One state of a blob, its elements as serialized (broadcast: key, value, key, ...),
    and its serializers' names (the offline reader decodes with them)."""

    kind: OperatorStateKind
    elements: tuple[bytes, ...]
    serializer: str = ""
    key_serializer: str = ""


Image = dict[str, RawState]  # a subtask's non-keyed state: name -> raw state


# ------------------------------------------------------------------------------ blob format


def encode(image: Image) -> bytes:
    parts = [_HEAD.pack(MAGIC, VERSION, len(image))]
    for name in sorted(image):
        state = image[name]
        data = name.encode()
        count = len(state.elements) // (2 if state.kind is OperatorStateKind.BROADCAST else 1)
        parts += [_LEN.pack(len(data)), data, _KIND.pack(_CODES[state.kind], count)]
        for serializer in (state.serializer.encode(), state.key_serializer.encode()):
            parts += [_LEN.pack(len(serializer)), serializer]
        for element in state.elements:
            parts += [_LEN.pack(len(element)), element]
    return b"".join(parts)


def decode(blob: bytes, where: str = "") -> Image:
    """A blob's states; an empty blob is a subtask without non-keyed state."""
    if not blob:
        return {}
    try:
        if blob[:4] != MAGIC:
            raise OperatorStateError("not a non-keyed state blob")
        if blob[4:5] and blob[4] != VERSION:
            raise OperatorStateError(f"format version {blob[4]}, this Stator reads {VERSION}")
        _, _, states = _HEAD.unpack_from(blob)
        image: Image = {}
        pos = _HEAD.size
        for _ in range(states):
            name, pos = _bytes(blob, pos)
            code, count = _KIND.unpack_from(blob, pos)
            pos += _KIND.size
            if code not in _KINDS:
                raise OperatorStateError(f"state {name!r} has unknown kind code {code}")
            kind = _KINDS[code]
            serializer, pos = _bytes(blob, pos)
            key_serializer, pos = _bytes(blob, pos)
            elements = []
            for _ in range(count * (2 if kind is OperatorStateKind.BROADCAST else 1)):
                element, pos = _bytes(blob, pos)
                elements.append(element)
            image[name.decode()] = RawState(
                kind, tuple(elements), serializer.decode(), key_serializer.decode()
            )
        if pos != len(blob):
            raise OperatorStateError(f"{len(blob) - pos} bytes after its last state")
        return image
    except (struct.error, UnicodeDecodeError) as exc:
        raise OperatorStateError(f"non-keyed state {where} is truncated: {exc}") from exc
    except OperatorStateError as exc:
        raise OperatorStateError(f"non-keyed state {where}: {exc}") from exc


def _bytes(blob: bytes, pos: int) -> tuple[bytes, int]:
    (n,) = _LEN.unpack_from(blob, pos)
    end = pos + _LEN.size + n
    if end > len(blob):
        raise OperatorStateError(f"an element of {n} bytes runs past the end ({len(blob)})")
    return blob[pos + _LEN.size : end], end


def to_text(blob: bytes) -> str:
    """The blob as metadata carries it (base64; "" for none)."""
    return base64.b64encode(blob).decode() if blob else ""


def from_text(text: str, where: str) -> bytes:
    """The blob of a metadata field, checked readable (a corrupt one fails the metadata)."""
    try:
        blob = base64.b64decode(text, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"{where} is not base64: {exc}") from exc
    try:
        decode(blob, where)
    except OperatorStateError as exc:
        raise ValueError(str(exc)) from exc
    return blob


def check_size(blob: bytes, uid: str, image: Image) -> None:
    if len(blob) <= MAX_BLOB_BYTES:
        return
    sizes = sorted(
        ((sum(len(e) for e in s.elements), name) for name, s in image.items()), reverse=True
    )
    largest = ", ".join(f"'{name}' {size} bytes" for size, name in sizes[:3])
    raise OperatorStateError(
        f"operator '{uid}': its non-keyed state (broadcast and operator list state) is "
        f"{len(blob)} bytes in one subtask, above the limit of {MAX_BLOB_BYTES} (it is "
        f"written whole into every checkpoint's metadata); largest: {largest}. Keep it "
        f"small, or hold the data in keyed state"
    )


# ------------------------------------------------------------------------------ redistribution


def redistribute(
    old: list[Image], new_parallelism: int, subtask: int, kinds: dict[str, OperatorStateKind]
) -> Image:
    """Subtask ``subtask``'s non-keyed state out of every old subtask's (in subtask order).

    At the same parallelism each subtask keeps its own (a restore, by whichever way, gives
    the state the subtask committed). At another: broadcast state is old subtask 0's copy
    (all are equal); split lists are the old elements concatenated in subtask order and cut
    into ``new_parallelism`` contiguous runs whose lengths differ by at most one (the longer
    first); union lists are all old elements on every new subtask. ``kinds``: the states'
    kinds, as the old registries record them (a state missing from a blob is empty)."""
    if len(old) == new_parallelism:
        return dict(old[subtask])
    image: Image = {}
    for name, kind in sorted(kinds.items()):
        parts = [o[name].elements for o in old if name in o]
        if kind is OperatorStateKind.BROADCAST:
            elements = parts[0] if parts else ()
        else:
            every = tuple(e for part in parts for e in part)
            if kind is OperatorStateKind.SPLIT_LIST:
                start, end = split_bounds(len(every), new_parallelism, subtask)
                every = every[start:end]
            elements = every
        first = next((o[name] for o in old if name in o), RawState(kind, ()))
        image[name] = RawState(kind, elements, first.serializer, first.key_serializer)
    return image


def split_bounds(total: int, parallelism: int, subtask: int) -> tuple[int, int]:
    """The run of ``total`` elements subtask ``subtask`` of ``parallelism`` gets."""
    share, extra = divmod(total, parallelism)
    start = subtask * share + min(subtask, extra)
    return start, start + share + (1 if subtask < extra else 0)


# ------------------------------------------------------------------------------ heap tables


class OperatorTable:
    """One declared non-keyed state on the heap for an epoch; ``changed`` once modified."""

    def __init__(self, name: str, kind: OperatorStateKind, serializer: Serializer) -> None:
        self.name, self.kind, self.serializer = name, kind, serializer
        self.changed = False

    def raw(self) -> RawState:
        raise NotImplementedError


class OperatorListTable(OperatorTable):
    def __init__(
        self, desc: ListStateDescriptor, kind: OperatorStateKind, raw: RawState | None
    ) -> None:
        super().__init__(desc.name, kind, desc.serializer)
        loads = desc.serializer.loads
        self.items: list[Any] = [loads(e) for e in raw.elements] if raw else []

    def raw(self) -> RawState:
        dumps = self.serializer.dumps
        items = tuple(dumps(v) for v in self.items)
        return RawState(self.kind, items, self.serializer.name)


class BroadcastTable(OperatorTable):
    """Entries by their key's serialized bytes: iteration is in that order, the same in every
    subtask whatever order the entries were put or restored in."""

    def __init__(self, desc: MapStateDescriptor, raw: RawState | None) -> None:
        super().__init__(desc.name, OperatorStateKind.BROADCAST, desc.serializer)
        self.key_serializer = desc.key_serializer
        self.entries: dict[bytes, Any] = {}
        if raw is not None:
            loads = desc.serializer.loads
            pairs = raw.elements
            self.entries = {pairs[i]: loads(pairs[i + 1]) for i in range(0, len(pairs), 2)}

    def sorted_items(self) -> Iterator[tuple[bytes, Any]]:
        for key in sorted(self.entries):
            yield key, self.entries[key]

    def raw(self) -> RawState:
        dumps = self.serializer.dumps
        flat = tuple(x for k, v in self.sorted_items() for x in (k, dumps(v)))
        return RawState(self.kind, flat, self.serializer.name, self.key_serializer.name)
