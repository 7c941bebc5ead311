"""The RocksDB keyed backend: state kinds, atomic epochs, compatibility checks, snapshots."""

from __future__ import annotations

from pathlib import Path

import pytest

from stator.api.functions import KeyCursor, RuntimeContext
from stator.errors import StateCompatibilityError
from stator.keygroups import KeyGroupRange
from stator.state.backend import KeyedBackend
from stator.state.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from stator.state.layout import EVENT_TIME, META_COMMIT, keyed_key
from stator.state.options import RocksDBOptions
from stator.state.serializers import INT64, JSON, UTF8
from stator.state.tables import MISSING

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


JOB_KEY = b"the driver's key"


def _warm_backend(path: Path, warm: int) -> KeyedBackend:
    return KeyedBackend(
        path, RocksDBOptions(), KeyGroupRange(0, MP), MP, "op", warm_entries=warm, warm_key=JOB_KEY
    )


def test_a_scan_that_fits_the_warm_cache_loads_the_whole_state(tmp_path: Path) -> None:
    """A prefetch that scans a state small enough for the warm cache keeps every entry, so
    keys the epoch did not ask for are served without RocksDB, and unknown keys are known
    to be absent; the next epoch in the process inherits that, and a stale cache is never
    used. Every value must equal what a fresh backend reads from RocksDB."""
    from stator.state import warm

    warm.clear()
    keys = [keyed_key(f"k{i}", MP) for i in range(200)]
    with _warm_backend(tmp_path / "db", 1000) as b:
        v = b.table(ValueStateDescriptor("v", INT64))
        lst = b.table(ListStateDescriptor("l", UTF8))
        b.prefetch([v, lst], keys)
        for i, kk in enumerate(keys):
            v.store(kk, i)
            lst.store(kk, [f"x{i}"])
        b.timers.register(keys[0], EVENT_TIME, 5)  # a timer entry must not be read as state
        b.commit(1, 0)
    warm.clear()  # the next epoch runs in another process
    with _warm_backend(tmp_path / "db", 1000) as b:
        assert not b.warm_hit
        v = b.table(ValueStateDescriptor("v", INT64))
        lst = b.table(ListStateDescriptor("l", UTF8))
        new = keyed_key("new", MP)
        b.prefetch([v, lst], [*keys[:50], new])  # 50 of 200 wanted: a scan
        assert v.complete and lst.complete
        assert new not in v.cache and v.load(new) is MISSING and lst.load(new) is MISSING
        assert {kk: v.cache[kk] for kk in keys} == {kk: i for i, kk in enumerate(keys)}
        assert lst.cache[keys[7]] == ["x7"]
        v.store(keys[3], 1003)
        b.commit(2, 0)
    with _warm_backend(tmp_path / "db", 1000) as b:  # the same process, next epoch
        assert b.warm_hit
        v = b.table(ValueStateDescriptor("v", INT64))
        assert v.complete
        b.prefetch([v], [keyed_key("newer", MP)])
        assert v.load(keyed_key("newer", MP)) is MISSING and v.load(keys[3]) == 1003
        v.store(keys[4], 1004)
        b.commit(3, 0)
        fresh_token = b.db.get(META_COMMIT)
    warm.give(str(tmp_path / "db"), b"stale", {0: ({keys[5]: -1}, True)}, 1000)
    with _warm_backend(tmp_path / "db", 1000) as b:  # a cache of another commit: unused
        assert not b.warm_hit and b.db.get(META_COMMIT) == fresh_token
        v = b.table(ValueStateDescriptor("v", INT64))
        assert not v.complete
        assert [v.load(k) for k in keys[3:6]] == [1003, 1004, 5]


def test_a_scan_of_a_state_larger_than_the_warm_cache_keeps_only_what_was_asked(
    tmp_path: Path,
) -> None:
    keys = [keyed_key(f"k{i}", MP) for i in range(200)]
    with _warm_backend(tmp_path / "db", 0) as b:
        v = b.table(ValueStateDescriptor("v", INT64))
        for i, kk in enumerate(keys):
            v.store(kk, i)
        b.commit(1, 0)
    with _warm_backend(tmp_path / "db", 100) as b:
        v = b.table(ValueStateDescriptor("v", INT64))
        b.prefetch([v], keys[:50])
        assert not v.complete and len(v.cache) == 50
        assert v.load(keys[150]) == 150  # read on demand


def test_a_worker_that_sees_subtasks_move_leaves_its_cache_for_the_next_worker(
    tmp_path: Path,
) -> None:
    """Workers are processes: ``warm.clear()`` stands for a task in another worker. Once a
    worker found one of its caches outdated by another worker's commit, it writes its cache
    beside the database at each commit; a worker without a current cache reads it, and only
    at the commit that wrote it."""
    from stator.state import warm

    db = tmp_path / "sub" / "db"
    snapshot = tmp_path / "sub" / warm.SNAPSHOT
    keys = [keyed_key(f"k{i}", MP) for i in range(100)]
    warm.clear()
    with _warm_backend(db, 1000) as b:
        v = b.table(ValueStateDescriptor("v", INT64))
        b.prefetch([v], keys)
        for i, kk in enumerate(keys):
            v.store(kk, i)
        b.commit(1, 0)
    assert not snapshot.exists()  # nothing moved yet: nothing written
    warm.give(str(db), b"\x00" * 16, {}, 1000)  # this worker's cache of an older commit
    with _warm_backend(db, 1000) as b:
        assert not b.warm_hit  # outdated: the subtask moved, and moved back
        v = b.table(ValueStateDescriptor("v", INT64))
        b.prefetch([v], keys)
        v.store(keys[1], 101)
        b.commit(2, 0)
        token = b.db.get(META_COMMIT)
    assert snapshot.read_bytes()[:16] == token
    warm.clear()  # the next epoch in another worker
    with _warm_backend(db, 1000) as b:
        assert b.warm_hit
        v = b.table(ValueStateDescriptor("v", INT64))
        assert v.complete and v.load(keys[1]) == 101 and v.load(keys[99]) == 99
        b.commit(3, 0)  # this worker has not seen a move: the file stays at commit 2
    warm.clear()
    with _warm_backend(db, 1000) as b:
        assert not b.warm_hit  # the file is of commit 2, the database at commit 3
        assert b.table(ValueStateDescriptor("v", INT64)).load(keys[1]) == 101
        token = b.db.get(META_COMMIT)
    snapshot.write_bytes(token + b"torn")
    warm.clear()
    with _warm_backend(db, 1000) as b:
        assert not b.warm_hit
        assert b.table(ValueStateDescriptor("v", INT64)).load(keys[2]) == 2
    warm.clear()


def test_a_worker_holding_several_subtasks_caches_writes_them_beside_each_database(
    tmp_path: Path,
) -> None:
    from stator.state import warm

    warm.clear()
    one, two = tmp_path / "0-of-2" / "db", tmp_path / "1-of-2" / "db"
    one.mkdir(parents=True)
    two.mkdir(parents=True)
    cache = {0: ({b"k": 1}, True)}
    warm.give(str(one), b"1" * 16, cache, 10, JOB_KEY)
    assert not (one.parent / warm.SNAPSHOT).exists()  # one subtask: it stays here
    warm.give(str(two), b"2" * 16, cache, 10, JOB_KEY)
    assert (two.parent / warm.SNAPSHOT).read_bytes()[:16] == b"2" * 16
    warm.clear()
    assert warm.take(str(two), b"2" * 16, JOB_KEY) == cache
    assert warm.take(str(two), b"3" * 16, JOB_KEY) == {}
    warm.give(str(one), b"1" * 16, {0: ({b"k": 1}, True), 1: ({b"j": 2}, False)}, 2, JOB_KEY)
    warm.clear()
    assert warm.take(str(one), b"1" * 16, JOB_KEY) == {}  # over the limit: nothing kept


def test_the_warm_cache_file_is_unpickled_only_with_the_jobs_mac(tmp_path: Path) -> None:
    """Issue 38: the file is unpickled (which runs code) only if the driver's key MAC'd it;
    one planted by another pod on the volume, or left by another driver, is ignored."""
    from stator.state import warm

    warm.clear()
    db, token = str(tmp_path / "db"), b"t" * 16
    tables: warm.Tables = {0: ({b"k": 1}, True)}
    (tmp_path / "db").mkdir()
    warm.give(db, token, tables, 100)  # one subtask in this process: nothing written
    warm.give(db + "2", token, tables, 100)  # a second: would be shared, but no key
    assert not (tmp_path / warm.SNAPSHOT).exists()
    warm.clear()
    warm._moved.add(db)  # this worker has seen its subtask move: it writes the file
    warm.give(db, token, tables, 100, key=b"k1")
    file = tmp_path / warm.SNAPSHOT
    assert file.exists()
    warm.clear()
    assert warm.take(db, token, b"k1") == tables
    assert warm.take(db, token, b"k2") == {}
    raw = bytearray(file.read_bytes())
    raw[-1] ^= 1  # a payload changed after the MAC
    file.write_bytes(bytes(raw))
    assert warm.take(db, token, b"k1") == {}
    assert warm.take(db, token, b"") == {}
