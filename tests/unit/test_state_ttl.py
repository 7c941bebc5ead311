"""State TTL and AggregatingState on the real KeyedBackend: expiry at once, update types,
visibility, the cleanup bound (bytes gone from the database and snapshots), and TTL stamps
surviving commit/reopen, snapshots (native), key-group export/import (canonical savepoints,
rescale), the offline reader and the registry's compatibility check."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stator.api.functions import KeyCursor, RuntimeContext
from stator.api.windows import Count
from stator.errors import StateCompatibilityError
from stator.keygroups import KeyGroupRange
from stator.savepoint.transfer import export_key_groups, import_rows, savepoint_rows, state_catalog
from stator.state.backend import KeyedBackend
from stator.state.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from stator.state.layout import keyed_key
from stator.state.options import RocksDBOptions
from stator.state.serializers import BYTES, JSON
from stator.state.ttl import StateTtlConfig, TtlUpdateType, TtlVisibility
from stator.state_reader import database_rows
from stator.storage import FileStore

MP = 16
ALL = KeyGroupRange(0, MP)
DEFAULT = RocksDBOptions()
PLAIN = RocksDBOptions(compression="none")  # stored bytes readable in the SST files
TTL = StateTtlConfig(100)
READS = StateTtlConfig(100, TtlUpdateType.ON_READ_AND_WRITE)
EXPIRED_TOO = StateTtlConfig(100, visibility=TtlVisibility.RETURN_EXPIRED_IF_NOT_CLEANED_UP)


class Avg:
    """An aggregate function: the mean, from a (sum, count) accumulator."""

    def create(self) -> Any:
        return (0, 0)

    def add(self, acc: Any, value: Any) -> Any:
        return (acc[0] + value, acc[1] + 1)

    def merge(self, a: Any, b: Any) -> Any:
        return (a[0] + b[0], a[1] + b[1])

    def result(self, acc: Any) -> Any:
        return acc[0] / acc[1]


class Job:
    """One subtask's backend at a processing time, and a function's handles on it."""

    def __init__(
        self,
        path: Path,
        groups: KeyGroupRange = ALL,
        options: RocksDBOptions = DEFAULT,
    ) -> None:
        self.b = KeyedBackend(path, options, groups, MP, "op").open()
        self.cursor = KeyCursor()
        self.ctx = RuntimeContext(self.b, self.cursor, "op", 0, 1, MP)
        self.epoch = self.b.epoch

    def at(self, now: int) -> Job:
        self.b.clock.now_ms = now
        return self

    def key(self, k: object) -> Job:
        self.cursor.kkey = keyed_key(k, MP)
        return self

    def commit(self) -> None:
        self.epoch += 1
        self.b.commit(self.epoch, 0)

    def close(self) -> None:
        self.b.close()


@pytest.fixture
def job(tmp_path: Path) -> Iterator[Job]:
    j = Job(tmp_path / "db")
    yield j
    j.close()


def test_every_kind_expires_at_once_after_its_ttl(job: Job) -> None:
    v = job.ctx.get_state(ValueStateDescriptor("v", ttl=TTL))
    lst = job.ctx.get_state(ListStateDescriptor("l", ttl=TTL))
    m = job.ctx.get_state(MapStateDescriptor("m", ttl=TTL))
    r = job.ctx.get_state(ReducingStateDescriptor("r", ttl=TTL))
    a = job.ctx.get_state(AggregatingStateDescriptor("a", Avg(), ttl=TTL))
    job.at(1000).key("k")
    v.update(1)
    lst.add(1)
    m.put("x", 1)
    r.add(5)
    a.add(4)
    job.at(1050)
    lst.add(2)  # its own stamp: lives until 1150
    m.put("y", 2)
    job.commit()
    job.at(1099)  # the last millisecond of the first writes
    assert (v.value(), lst.get(), dict(m.items()), r.get(), a.get()) == (
        1,
        [1, 2],
        {"x": 1, "y": 2},
        5,
        4,
    )
    job.at(1100)
    assert v.value() is None and r.get() is None and a.get() is None
    assert lst.get() == [2] and dict(m.items()) == {"y": 2}
    assert m.get("x") is None and not m.contains("x") and not m.is_empty()
    r.add(1)  # an expired value does not take part in the reduction
    a.add(10)
    assert r.get() == 1 and a.get() == 10
    job.at(1150)
    assert lst.get() == [] and m.is_empty()


def test_update_type_on_read_restarts_the_time_to_live(job: Job) -> None:
    created = job.ctx.get_state(ValueStateDescriptor("c", ttl=TTL))
    read = job.ctx.get_state(ValueStateDescriptor("r", ttl=READS))
    lst = job.ctx.get_state(ListStateDescriptor("l", ttl=READS))
    m = job.ctx.get_state(MapStateDescriptor("m", ttl=READS))
    job.at(0).key("k")
    created.update("c")
    read.update("r")
    lst.add(1)
    m.put(1, 1)
    m.put(2, 2)
    job.commit()
    job.at(90)
    assert created.value() == "c" and read.value() == "r" and lst.get() == [1]
    assert m.get(1) == 1  # entry 1 read, entry 2 not
    job.commit()
    job.at(150)
    assert created.value() is None and read.value() == "r" and lst.get() == [1]
    assert dict(m.items()) == {1: 1}


def test_return_expired_if_not_cleaned_up_returns_it_once(job: Job) -> None:
    v = job.ctx.get_state(ValueStateDescriptor("v", ttl=EXPIRED_TOO))
    lst = job.ctx.get_state(ListStateDescriptor("l", ttl=EXPIRED_TOO))
    job.at(0).key("k")
    v.update(1)
    lst.add(1)
    job.commit()
    job.at(500)
    assert v.value() == 1 and lst.get() == [1]  # still stored: returned, and removed
    assert v.value() is None and lst.get() == []


def test_aggregating_state_without_ttl(job: Job) -> None:
    avg = job.ctx.get_state(AggregatingStateDescriptor("avg", Avg(), JSON))
    count = job.ctx.get_state(AggregatingStateDescriptor("n", Count()))
    job.key("a")
    assert avg.get() is None and count.get() is None
    for x in (1, 2, 6):
        avg.add(x)
        count.add(x)
    job.commit()
    job.close()
    again = Job(job.b.path)
    avg = again.ctx.get_state(AggregatingStateDescriptor("avg", Avg(), JSON))
    again.key("a")
    assert avg.get() == 3
    avg.clear()
    assert avg.get() is None
    again.close()
    job.b.open()


def test_bad_descriptors_name_the_field_and_the_fix() -> None:
    with pytest.raises(ValueError, match=r"StateTtlConfig.ttl_ms must be a positive int"):
        StateTtlConfig(0)
    with pytest.raises(ValueError, match=r"update_type must be a TtlUpdateType"):
        StateTtlConfig(5, "on_read")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"state 'v': ttl must be a StateTtlConfig"):
        ValueStateDescriptor("v", ttl=1000)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"state 'a': aggregate_function must have create"):
        AggregatingStateDescriptor("a", max)  # type: ignore[arg-type]


def test_enabling_or_disabling_ttl_on_stored_state_is_refused(tmp_path: Path) -> None:
    job = Job(tmp_path / "db")
    job.ctx.get_state(ValueStateDescriptor("v", ttl=TTL))
    job.ctx.get_state(ListStateDescriptor("l"))
    job.commit()
    job.close()
    job = Job(tmp_path / "db")
    with pytest.raises(
        StateCompatibilityError, match=r"state 'v' of operator 'op' was written with TTL"
    ):
        job.ctx.get_state(ValueStateDescriptor("v"))
    with pytest.raises(StateCompatibilityError, match=r"'l' .* without TTL .* new name"):
        job.ctx.get_state(ListStateDescriptor("l", ttl=TTL))
    # A new duration is a compatible change: it applies to the stored stamps at once.
    job.at(60).ctx.get_state(ValueStateDescriptor("v", ttl=StateTtlConfig(50)))
    assert job.b.registry["v"]["ttl"]["ttl_ms"] == 50
    job.close()


def _payload_in(directory: Path, payload: bytes) -> bool:
    return any(payload in f.read_bytes() for f in directory.rglob("*") if f.is_file())


def test_expired_bytes_leave_the_database_and_snapshots_within_the_bound(tmp_path: Path) -> None:
    """With E entries and a scan of N per commit (a pass: P = ceil(E / N) commits), an
    expired entry is gone from the database within P commits of expiring, and its bytes
    from the SST files (so from every snapshot) within 2P."""
    job = Job(tmp_path / "db", options=PLAIN)
    ttl = StateTtlConfig(100, cleanup_scan_per_epoch=50)
    v = job.ctx.get_state(ValueStateDescriptor("v", BYTES, ttl=ttl))
    keep = job.ctx.get_state(ValueStateDescriptor("keep", BYTES))
    job.at(0)
    for i in range(100):
        job.key(i)
        v.update(b"SECRET-%05d" % i)
        keep.update(b"kept-%05d" % i)
    job.commit()
    job.commit()  # the cursor is now mid-pass: the worst case for what expires next
    db = job.b.db
    assert db is not None
    entries = sum(1 for _ in db.items())
    passes = -(-entries // 50)
    job.b.snapshot_to(tmp_path / "before")
    assert _payload_in(tmp_path / "before", b"SECRET-00042")
    job.at(100)  # all expired from now; nothing reads them
    for _ in range(passes):
        job.commit()
    assert not [k for k, value in db.items() if b"SECRET" in bytes(value)]
    for _ in range(passes):
        job.commit()
    job.b.snapshot_to(tmp_path / "after")
    assert not _payload_in(tmp_path / "after", b"SECRET-")
    assert _payload_in(tmp_path / "after", b"kept-00042")
    job.close()


def test_cleanup_leaves_what_the_epoch_writes(tmp_path: Path) -> None:
    """An expired entry the epoch overwrites (without reading it first) is the epoch's to
    write: the cleanup scan passing over it must not remove the new value."""
    job = Job(tmp_path / "db")
    ttl = StateTtlConfig(100, cleanup_scan_per_epoch=1000)
    v = job.ctx.get_state(ValueStateDescriptor("v", ttl=ttl))
    lst = job.ctx.get_state(ListStateDescriptor("l", ttl=ttl))
    m = job.ctx.get_state(MapStateDescriptor("m", ttl=ttl))
    job.at(0).key("k")
    v.update("old")
    lst.add("old")
    m.put("x", "old")
    job.commit()
    job.at(500)
    v.update("new")
    lst.update(["new"])
    m.put("x", "new")
    job.commit()  # the scan covers the whole database in this commit
    assert (v.value(), lst.get(), m.get("x")) == ("new", ["new"], "new")
    job.close()
    again = Job(tmp_path / "db").at(500).key("k")
    assert again.ctx.get_state(ValueStateDescriptor("v", ttl=ttl)).value() == "new"
    assert again.ctx.get_state(ListStateDescriptor("l", ttl=ttl)).get() == ["new"]
    assert again.ctx.get_state(MapStateDescriptor("m", ttl=ttl)).get("x") == "new"
    again.close()


def _stamped_state(job: Job) -> tuple[Any, ...]:
    return (
        job.ctx.get_state(ValueStateDescriptor("v", ttl=TTL)),
        job.ctx.get_state(ListStateDescriptor("l", ttl=READS)),
        job.ctx.get_state(MapStateDescriptor("m", ttl=TTL)),
        job.ctx.get_state(AggregatingStateDescriptor("a", Avg(), ttl=TTL)),
    )


def _write_stamped(job: Job) -> None:
    v, lst, m, a = _stamped_state(job)
    for i in range(20):
        job.key(i).at(0)
        v.update(i)
        lst.add(i)
        m.put("old", i)
        a.add(i)
        job.at(60)
        lst.add(-i)
        m.put("new", i)
    job.commit()


def _check_stamped(job: Job, keys: range) -> None:
    v, lst, m, a = _stamped_state(job)
    for i in keys:
        job.key(i).at(99)
        assert (v.value(), a.get(), dict(m.items())) == (i, i, {"old": i, "new": i})
        job.at(100)
        assert (v.value(), a.get(), dict(m.items()), lst.get()) == (None, None, {"new": i}, [-i])


def test_stamps_survive_reopen_snapshot_and_key_group_transfer(tmp_path: Path) -> None:
    job = Job(tmp_path / "db")
    _write_stamped(job)
    job.b.snapshot_to(tmp_path / "native")  # what a native checkpoint or savepoint holds
    store = FileStore(f"file://{tmp_path}/sp")
    files = export_key_groups(job.b, store, "op", "zlib")  # a canonical savepoint
    catalog = state_catalog(job.b.registry)
    job.close()
    _check_stamped(Job(tmp_path / "db"), range(20))
    _check_stamped(Job(tmp_path / "native"), range(20))
    for half in (KeyGroupRange(0, 8), KeyGroupRange(8, 16)):  # rescaled to two subtasks
        part = Job(tmp_path / f"part-{half.start}", half)
        import_rows(part.b, catalog, savepoint_rows(store, files, half))
        owned = [i for i in range(20) if keyed_key(i, MP)[1] in range(half.start, half.end)]
        _check_stamped(part, range(0))  # registry carries TTL: declared again as before
        for i in owned:
            _check_stamped(part, range(i, i + 1))
        part.close()


def test_the_offline_reader_strips_stamps_and_skips_expired_values(tmp_path: Path) -> None:
    job = Job(tmp_path / "db")
    _write_stamped(job)
    job.close()
    rows = database_rows(tmp_path / "db", "op", KeyGroupRange(0, MP), MP, now_ms=80)
    mine = sorted((r[1], r[5], r[6]) for r in rows if r[4] == "3")
    assert mine == [
        ("a", None, "[3, 1]"),
        ("l", None, "[3, -3]"),
        ("m", '"new"', "3"),
        ("m", '"old"', "3"),
        ("v", None, "3"),
    ]
    later = database_rows(tmp_path / "db", "op", KeyGroupRange(0, MP), MP, now_ms=150)
    assert sorted((r[1], r[5], r[6]) for r in later if r[4] == "3") == [
        ("l", None, "[-3]"),
        ("m", '"new"', "3"),
    ]
