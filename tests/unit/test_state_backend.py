"""The RocksDB keyed backend: state kinds, atomic epochs, compatibility checks, snapshots."""

from __future__ import annotations

from pathlib import Path

import pytest

from stator.api.functions import KeyCursor, RuntimeContext
from stator.api.serializers import INT64, JSON, UTF8
from stator.api.state import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from stator.errors import StateCompatibilityError
from stator.keygroups import KeyGroupRange
from stator.state.backend import KeyedBackend
from stator.state.layout import EVENT_TIME, keyed_key
from stator.state.options import RocksDBOptions

MP = 16


def backend(path: Path, mp: int = MP) -> KeyedBackend:
    return KeyedBackend(path, RocksDBOptions(), KeyGroupRange(0, mp), mp, "op")


class Harness:
    """A function's view of the backend: a cursor and state handles."""

    def __init__(self, b: KeyedBackend) -> None:
        self.b, self.cursor = b, KeyCursor()
        self.ctx = RuntimeContext(b, self.cursor, "op", 0, 1, MP)

    def key(self, k: object) -> None:
        self.cursor.kkey = keyed_key(k, MP)


def test_all_state_kinds_survive_commit_and_reopen(tmp_path: Path) -> None:
    with backend(tmp_path / "db") as b:
        h = Harness(b)
        value = h.ctx.get_state(ValueStateDescriptor("v", INT64))
        lst = h.ctx.get_state(ListStateDescriptor("l", UTF8))
        mp = h.ctx.get_state(MapStateDescriptor("m", JSON, UTF8))
        red = h.ctx.get_state(ReducingStateDescriptor("r", max, INT64))
        for k in ("a", "b"):
            h.key(k)
            value.update(len(k) + 10)
            lst.add(f"{k}1")
            lst.add(f"{k}2")
            mp.put("x", {"k": k})
            mp.put("y", [1, 2])
            red.add(3)
            red.add(7)
            red.add(5)
        h.key("b")
        mp.remove("y")
        b.commit(1, 100)
    with backend(tmp_path / "db") as b:
        h = Harness(b)
        assert (b.epoch, b.watermark) == (1, 100)
        value = h.ctx.get_state(ValueStateDescriptor("v", INT64))
        lst = h.ctx.get_state(ListStateDescriptor("l", UTF8))
        mp = h.ctx.get_state(MapStateDescriptor("m", JSON, UTF8))
        red = h.ctx.get_state(ReducingStateDescriptor("r", max, INT64))
        h.key("a")
        assert value.value() == 11 and lst.get() == ["a1", "a2"] and red.get() == 7
        assert list(mp.items()) == [("x", {"k": "a"}), ("y", [1, 2])]
        h.key("b")
        assert list(mp.items()) == [("x", {"k": "b"})]
        h.key("nobody")
        assert value.value() is None and lst.get() == [] and mp.is_empty()


def test_uncommitted_writes_are_lost_with_the_task(tmp_path: Path) -> None:
    """A task that dies before commit leaves the previous epoch intact: no half epochs."""
    with backend(tmp_path / "db") as b:
        h = Harness(b)
        v = h.ctx.get_state(ValueStateDescriptor("v", INT64))
        h.key("a")
        v.update(1)
        b.commit(1, 0)
        v.update(2)
        h.key("b")
        v.update(2)
        # no commit: the task "crashes"
    with backend(tmp_path / "db") as b:
        h = Harness(b)
        v = h.ctx.get_state(ValueStateDescriptor("v", INT64))
        assert b.epoch == 1
        h.key("a")
        assert v.value() == 1
        h.key("b")
        assert v.value() is None


def test_map_clear_and_put_in_the_same_epoch(tmp_path: Path) -> None:
    with backend(tmp_path / "db") as b:
        h = Harness(b)
        m = h.ctx.get_state(MapStateDescriptor("m"))
        h.key(1)
        m.put("a", 1)
        m.put("b", 2)
        b.commit(1, 0)
        m.clear()
        m.put("c", 3)
        assert dict(m.items()) == {"c": 3}
        b.commit(2, 0)
        assert dict(m.items()) == {"c": 3}
        assert m.get("a") is None and m.contains("c")


def test_serializer_change_names_the_state(tmp_path: Path) -> None:
    with backend(tmp_path / "db") as b:
        Harness(b).ctx.get_state(ValueStateDescriptor("total", INT64))
        b.commit(1, 0)
    with backend(tmp_path / "db") as b, pytest.raises(StateCompatibilityError) as err:
        Harness(b).ctx.get_state(ValueStateDescriptor("total", JSON))
    assert "state 'total' of operator 'op'" in str(err.value)
    assert "int64" in str(err.value) and "json" in str(err.value)


def test_kind_change_is_refused(tmp_path: Path) -> None:
    with backend(tmp_path / "db") as b:
        Harness(b).ctx.get_state(ValueStateDescriptor("s"))
        b.commit(1, 0)
    with backend(tmp_path / "db") as b, pytest.raises(StateCompatibilityError, match="list"):
        Harness(b).ctx.get_state(ListStateDescriptor("s"))


def test_max_parallelism_is_fixed(tmp_path: Path) -> None:
    with backend(tmp_path / "db") as b:
        b.commit(1, 0)
    with pytest.raises(StateCompatibilityError, match="maxParallelism=16"):
        backend(tmp_path / "db", mp=32).open()


def test_timers_fire_in_timestamp_then_key_order_and_only_once(tmp_path: Path) -> None:
    with backend(tmp_path / "db") as b:
        assert b.timers is not None
        for key, ts in [("b", 5), ("a", 5), ("c", 1), ("a", 9), ("a", 5)]:
            b.timers.register(keyed_key(key, MP), EVENT_TIME, ts)
        b.commit(1, 0)
        b.timers.delete(keyed_key("c", MP), EVENT_TIME, 1)
        fired = b.timers.pop_due(EVENT_TIME, 5, range(MP))
        assert [ts for ts, _ in fired] == [5, 5]
        assert sorted(kk for _, kk in fired) == sorted([keyed_key("a", MP), keyed_key("b", MP)])
        assert b.timers.pop_due(EVENT_TIME, 5, range(MP)) == []
        b.commit(2, 5)
        assert b.timers.count(range(MP)) == 1  # ("a", 9) is left


def test_snapshot_is_an_openable_copy(tmp_path: Path) -> None:
    with backend(tmp_path / "db") as b:
        h = Harness(b)
        v = h.ctx.get_state(ValueStateDescriptor("v", INT64))
        for i in range(5000):
            h.key(i)
            v.update(i * 2)
        b.commit(3, 7)
        files = b.snapshot_to(tmp_path / "snap")
        assert any(f.shared and f.name.endswith(".sst") for f in files)
        assert any(not f.shared and f.name.startswith("MANIFEST") for f in files)
        h.key(1)
        v.update(-1)
        b.commit(4, 8)  # later epochs do not touch the snapshot (hard links, immutable SSTs)
    with backend(tmp_path / "snap") as copy:
        h = Harness(copy)
        v = h.ctx.get_state(ValueStateDescriptor("v", INT64))
        assert (copy.epoch, copy.watermark) == (3, 7)
        h.key(1)
        assert v.value() == 2
        h.key(4999)
        assert v.value() == 9998
