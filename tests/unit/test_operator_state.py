"""Non-keyed state on the real backend: the handles, the epoch commit that stores them with the
keyed state, the registry's checks, the blob's format and size limit, the redistribution
rules, a checkpoint rescaled 3 -> 2 through the real restore, and the offline reader."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stator.api.functions import KeyCursor, RuntimeContext
from stator.api.operator_state import ReadOnlyStateError
from stator.checkpoint.metadata import CheckpointMetadata, OperatorSnapshot
from stator.epoch.spec import CheckpointTask, RestoreTask
from stator.errors import StateCompatibilityError
from stator.keygroups import KeyGroupRange, range_for_subtask
from stator.locality.restore import open_state
from stator.locality.snapshot import take_snapshot
from stator.state import operator_state as opstate
from stator.state.backend import KeyedBackend
from stator.state.descriptors import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from stator.state.layout import keyed_key
from stator.state.options import RocksDBOptions
from stator.state.serializers import JSON, UTF8
from stator.state_reader import operator_state_rows
from stator.storage import FileStore
from tests.unit.subtask_epochs import MP, UID, spec

RULES = MapStateDescriptor("rules", serializer=JSON, key_serializer=UTF8)
BUFFER = ListStateDescriptor("buffer")
OFFSETS = ListStateDescriptor("offsets", serializer=JSON)


def opened(path: Path) -> KeyedBackend:
    return KeyedBackend(path, RocksDBOptions(), KeyGroupRange(0, MP), MP, UID).open()


def context(b: KeyedBackend) -> RuntimeContext:
    return RuntimeContext(b, KeyCursor(), UID, 0, 1, MP)


def test_handles_are_committed_with_the_epoch_and_only_then(tmp_path: Path) -> None:
    b = opened(tmp_path / "db")
    ctx = context(b)
    rules, buffer = ctx.get_broadcast_state(RULES), ctx.get_operator_list_state(BUFFER)
    offsets = ctx.get_union_list_state(OFFSETS)
    assert rules.is_empty() and buffer.get() == [] and offsets.get() == []
    rules.put("b", 2)
    rules.put_all({"a": 1, "c": 3})
    rules.remove("c")
    assert (rules.get("a"), rules.get("c", "none"), rules.contains("b")) == (1, "none", True)
    assert list(rules.items()) == [("a", 1), ("b", 2)]  # by serialized key, in every subtask
    assert (list(rules.keys()), list(rules.values())) == (["a", "b"], [1, 2])
    buffer.add(("x", 1))
    buffer.add_all([("y", 2)])
    offsets.update([7, 8])
    keyed = ctx.get_state(ValueStateDescriptor("count"))
    ctx._cursor.kkey = keyed_key("k", MP)
    keyed.update(5)
    b.commit(1, 0)
    buffer.add(("lost", 0))  # never committed: gone with the epoch
    rules.clear()
    b.close()

    b = opened(tmp_path / "db")
    ctx = context(b)
    assert list(ctx.get_broadcast_state(RULES).items()) == [("a", 1), ("b", 2)]
    assert ctx.get_operator_list_state(BUFFER).get() == [("x", 1), ("y", 2)]
    assert ctx.get_union_list_state(OFFSETS).get() == [7, 8]
    assert b.registry["rules"]["kind"] == "broadcast"
    assert b.registry["buffer"]["kind"] == "operator_list"
    assert b.registry["offsets"]["kind"] == "union_list"
    b.close()


def test_read_only_view_and_bad_values_are_refused(tmp_path: Path) -> None:
    b = opened(tmp_path / "db")
    ctx = context(b)
    rules = ctx.get_broadcast_state(RULES)
    rules.put("a", 1)
    view = rules.read_only()
    assert view.get("a") == 1 and list(view.items()) == [("a", 1)]
    for write in (lambda: view.put("b", 2), lambda: view.remove("a"), view.clear):
        with pytest.raises(ReadOnlyStateError, match="'rules' is read-only"):
            write()
    with pytest.raises(ValueError, match="remove"):
        rules.put("a", None)
    with pytest.raises(ValueError, match="None"):
        ctx.get_operator_list_state(BUFFER).add(None)
    b.close()


def test_declarations_are_checked_against_the_registry(tmp_path: Path) -> None:
    b = opened(tmp_path / "db")
    ctx = context(b)
    with pytest.raises(TypeError, match="takes a MapStateDescriptor"):
        ctx.get_broadcast_state(ListStateDescriptor("rules"))  # type: ignore[arg-type]
    ctx.get_operator_list_state(BUFFER)
    with pytest.raises(StateCompatibilityError, match="declared both as operator_list and"):
        ctx.get_union_list_state(BUFFER)
    ctx.get_state(ValueStateDescriptor("count"))
    b.commit(1, 0)
    b.close()

    b = opened(tmp_path / "db")
    ctx = context(b)
    with pytest.raises(StateCompatibilityError, match="stored as operator_list state but declared"):
        ctx.get_union_list_state(BUFFER)
    with pytest.raises(StateCompatibilityError, match="stored as value state"):
        ctx.get_broadcast_state(MapStateDescriptor("count"))
    with pytest.raises(StateCompatibilityError, match="serializer 'pickle'"):
        ctx.get_operator_list_state(ListStateDescriptor("buffer", serializer=JSON))
    b.close()


def test_undeclared_operator_state_is_kept_or_dropped_as_keyed_state_is(tmp_path: Path) -> None:
    b = opened(tmp_path / "db")
    ctx = context(b)
    ctx.get_operator_list_state(BUFFER).add(1)
    ctx.get_broadcast_state(RULES).put("a", 1)
    b.commit(1, 0)
    b.close()
    b = opened(tmp_path / "db")
    context(b).get_broadcast_state(RULES)  # the code no longer declares "buffer"
    assert b.undeclared_states() == ["buffer"]
    b.commit(2, 0)  # not dropped unless asked: kept as it was
    assert opstate.decode(b.operator_blob)["buffer"].elements
    b.drop_states(b.undeclared_states())
    b.commit(3, 0)
    b.close()
    b = opened(tmp_path / "db")
    assert "buffer" not in b.registry and context(b).get_operator_list_state(BUFFER).get() == []
    assert context(b).get_broadcast_state(RULES).get("a") == 1
    b.close()


def test_state_past_the_size_limit_fails_the_commit_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(opstate, "MAX_BLOB_BYTES", 1000)
    b = opened(tmp_path / "db")
    ctx = context(b)
    ctx.get_union_list_state(OFFSETS).add("x" * 2000)
    value = ctx.get_state(ValueStateDescriptor("count"))
    ctx._cursor.kkey = keyed_key("k", MP)
    value.update(1)
    with pytest.raises(
        opstate.OperatorStateError, match=r"'offsets' 2002 bytes\. .* hold the data"
    ):
        b.commit(1, 0)
    b.close()
    b = opened(tmp_path / "db")  # nothing of the epoch was written, keyed state included
    assert (b.epoch, b.operator_blob) == (0, b"")
    b.close()


# ---------------------------------------------------------------------------- the blob

_elements = st.lists(st.binary(max_size=6), max_size=4).map(tuple)
_raw = st.one_of(
    st.builds(
        opstate.RawState,
        st.sampled_from(
            [opstate.OperatorStateKind.SPLIT_LIST, opstate.OperatorStateKind.UNION_LIST]
        ),
        _elements,
        st.sampled_from(["pickle", "json"]),
    ),
    st.builds(
        opstate.RawState,
        st.just(opstate.OperatorStateKind.BROADCAST),
        _elements.map(lambda e: e + e),  # key, value pairs
        st.just("pickle"),
        st.just("utf8"),
    ),
)
images = st.dictionaries(st.text(min_size=1, max_size=5), _raw, max_size=4)


@settings(max_examples=200, deadline=None)
@given(image=images)
def test_blob_round_trip_and_every_truncation_is_named(image: opstate.Image) -> None:
    blob = opstate.encode(image)
    assert opstate.decode(blob) == image
    assert opstate.decode(opstate.from_text(opstate.to_text(blob), "f"), "f") == image
    for cut in range(1, len(blob)):
        with pytest.raises(opstate.OperatorStateError, match="of x"):
            opstate.decode(blob[:cut], "of x")


def test_unknown_blob_versions_and_kinds_are_refused() -> None:
    with pytest.raises(opstate.OperatorStateError, match="format version 9, this Stator reads 1"):
        opstate.decode(b"STOS\x09\x00\x00\x00\x00")
    with pytest.raises(opstate.OperatorStateError, match="3 bytes after its last state"):
        opstate.decode(opstate.encode({}) + b"abc")
    bad = opstate.encode({"a": opstate.RawState(opstate.OperatorStateKind.SPLIT_LIST, ())})
    bad = bad.replace(b"a\x01\x00", b"a\x07\x00")
    with pytest.raises(opstate.OperatorStateError, match="unknown kind code 7"):
        opstate.decode(bad)


# ---------------------------------------------------------------------------- redistribution

SPLIT, UNION = opstate.OperatorStateKind.SPLIT_LIST, opstate.OperatorStateKind.UNION_LIST
BROADCAST = opstate.OperatorStateKind.BROADCAST
KINDS = {"s": SPLIT, "u": UNION, "b": BROADCAST}


@settings(max_examples=300, deadline=None)
@given(
    lists=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 3)), min_size=1, max_size=6),
    new=st.integers(1, 7),
)
def test_redistribution_rules(lists: list[tuple[int, int]], new: int) -> None:
    old = []
    for i, (n_split, n_union) in enumerate(lists):
        split = tuple(f"s{i}.{j}".encode() for j in range(n_split))
        union = tuple(f"u{i}.{j}".encode() for j in range(n_union))
        old.append(
            {
                "s": opstate.RawState(SPLIT, split),
                "u": opstate.RawState(UNION, union),
                "b": opstate.RawState(BROADCAST, (b"k", b"v")),
            }
        )
    shares = [opstate.redistribute(old, new, i, KINDS) for i in range(new)]
    if new == len(old):  # the same parallelism: each keeps its own
        assert shares == old
        return
    every_split = [e for o in old for e in o["s"].elements]
    got = [e for share in shares for e in share["s"].elements]
    assert got == every_split  # concatenated in subtask order, cut in order
    sizes = [len(share["s"].elements) for share in shares]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    every_union = [e for o in old for e in o["u"].elements]
    assert all(list(share["u"].elements) == every_union for share in shares)
    assert all(share["b"].elements == (b"k", b"v") for share in shares)


# ---------------------------------------------------------------------------- restore


def _subtask_epoch(root: Path, store: FileStore, index: int, p: int) -> tuple[object, str]:
    """Old subtask ``index`` of ``p``: one epoch with operator state, checkpoint 1 after it."""
    kg = range_for_subtask(index, p, MP)
    s = spec(root, 1, parallelism={UID: p}, checkpoint=CheckpointTask(1, store, True, {}))
    backend, _ = open_state(s, UID, index, kg)
    try:
        ctx = RuntimeContext(backend, KeyCursor(), UID, index, p, MP)
        ctx.get_broadcast_state(RULES).put("rule", "same")
        ctx.get_operator_list_state(BUFFER).add_all([f"{index}.{j}" for j in range(index + 1)])
        ctx.get_union_list_state(OFFSETS).add(index)
        backend.commit(1, 0)
        snap, _ = take_snapshot(s, UID, index, kg, backend)
        return snap, backend.commit_token
    finally:
        backend.close()


def test_a_checkpoint_restored_at_another_parallelism_redistributes(tmp_path: Path) -> None:
    store = FileStore(f"file://{tmp_path}/ck")
    snaps = tuple(_subtask_epoch(tmp_path / "a", store, i, 3)[0] for i in range(3))
    restore = RestoreTask(store, 1, 1, rescale={UID: snaps})  # type: ignore[dict-item]
    got = []
    for index in range(2):
        s = spec(tmp_path / "b", 2, parallelism={UID: 2}, restore=restore, commits={})
        backend, report = open_state(s, UID, index, range_for_subtask(index, 2, MP))
        try:
            assert report.source == "remote" and backend.epoch == 1
            ctx = RuntimeContext(backend, KeyCursor(), UID, index, 2, MP)
            assert list(ctx.get_broadcast_state(RULES).items()) == [("rule", "same")]
            assert ctx.get_union_list_state(OFFSETS).get() == [0, 1, 2]
            got.append(ctx.get_operator_list_state(BUFFER).get())
        finally:
            backend.close()
    # 6 elements, in old subtask order, split 3 + 3
    assert got == [["0.0", "1.0", "1.1"], ["2.0", "2.1", "2.2"]]


def test_the_reader_lists_every_subtasks_non_keyed_state(tmp_path: Path) -> None:
    store = FileStore(f"file://{tmp_path}/ck")
    snaps = tuple(_subtask_epoch(tmp_path / "a", store, i, 2)[0] for i in range(2))
    op = OperatorSnapshot(UID, 2, snaps)  # type: ignore[arg-type]
    meta = CheckpointMetadata(1, 1, "job", 1, MP, True, {UID: op}, {}, {}, 0)
    meta = CheckpointMetadata.from_json(meta.to_json())
    rows = operator_state_rows(meta)
    assert Counter(r[2] for r in rows) == {"broadcast": 2, "operator_list": 3, "union_list": 2}
    assert (UID, "rules", "broadcast", -1, "1", '"rule"', '"same"') in rows
    assert (UID, "buffer", "operator_list", -1, "1", "1", json.dumps("1.1")) in rows
    assert (UID, "offsets", "union_list", -1, "0", "0", "0") in rows
