"""Asynchronous checkpoint uploads: a checkpoint completes only on the confirmations of the
attempts the driver kept, in the order taken; a failed or timed-out upload fails that
checkpoint only and deletes what only it wrote; files an in-flight checkpoint references
survive the subsuming of older ones. The real uploader writes to a file store."""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stator.checkpoint.coordinator import CheckpointCoordinator
from stator.checkpoint.metadata import CheckpointMetadata, SubtaskSnapshot, metadata_key
from stator.checkpoint.pending import CheckpointState, PendingCheckpoint
from stator.checkpoint.transfer import plan_upload
from stator.checkpoint.uploads import CONFIRMED, FAILED, UploadJob, confirmation_key, run_upload
from stator.driver.completion import PendingOutput, acknowledge
from stator.driver.in_flight import InFlightCheckpoints
from stator.epoch.reports import StateReport
from stator.state.backend import LocalFile
from stator.storage import FileStore

UID = "count"


class Subtask:
    """One subtask's local snapshot files and the upload job a task would submit."""

    def __init__(self, tmp: Path, store: FileStore, index: int, executor: str = "") -> None:
        self.dir = tmp / f"local-{index}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.store, self.index, self.executor = store, index, executor

    def snapshot(
        self, checkpoint_id: int, names: dict[str, bytes], previous: CheckpointMetadata | None
    ) -> tuple[StateReport, UploadJob]:
        files = []
        for name, data in names.items():
            (self.dir / name).write_bytes(data)
            files.append(LocalFile(name, len(data), name.endswith(".sst")))
        base = {}
        if previous is not None:
            base = {f.name: f for f in previous.operators[UID].subtasks[self.index].files}
        plan = plan_upload(checkpoint_id, UID, self.index, self.dir, files, base, True)
        snap = SubtaskSnapshot(
            self.index, 2, (self.index * 64, self.index * 64 + 63), 1, plan.files
        )
        report = StateReport(
            UID, self.index, 1, 0, 0, 0, snap, upload=plan.token, executor=self.executor
        )
        deadline = int(time.time() * 1000) + 60_000
        return report, UploadJob(
            self.store, checkpoint_id, UID, self.index, self.dir, plan, deadline, False
        )


def draft(
    coordinator: CheckpointCoordinator,
    checkpoint_id: int,
    epoch: int,
    states: list[StateReport],
    started: float | None = None,
) -> PendingCheckpoint:
    """Checkpoint ``checkpoint_id``, triggered and acknowledged by ``states``."""
    pending = PendingCheckpoint(checkpoint_id, epoch, True)
    coordinator.pending[checkpoint_id] = pending
    started = time.monotonic() if started is None else started
    refused = acknowledge(
        pending, "job", "", {UID: 2}, 128, states, {}, PendingOutput({}), coordinator, started
    )
    assert refused is None and pending.state is CheckpointState.ACKNOWLEDGED, refused
    return pending


def take(
    tracker: InFlightCheckpoints,
    subs: list[Subtask],
    checkpoint_id: int,
    names: dict[str, bytes],
    previous: CheckpointMetadata | None = None,
    base: int = 0,
) -> list[UploadJob]:
    """Every subtask snapshots ``names`` for ``checkpoint_id`` (epoch = id), the driver
    tracks the checkpoint (built on in-flight ``base``); returns the upload jobs, not run."""
    taken = [s.snapshot(checkpoint_id, names, previous) for s in subs]
    reports = [r for r, _ in taken]
    pending = draft(tracker.coordinator, checkpoint_id, checkpoint_id, reports)
    tracker.add(pending, reports, base)
    return [job for _, job in taken]


@pytest.fixture
def store(tmp_path: Path) -> FileStore:
    return FileStore(f"file://{tmp_path}/ck")


def test_a_checkpoint_completes_when_every_upload_is_confirmed_and_in_order(
    tmp_path: Path, store: FileStore
) -> None:
    coord = CheckpointCoordinator(store, retained=2)
    tracker = InFlightCheckpoints(store, coord, timeout_ms=60_000)
    subs = [Subtask(tmp_path, store, i) for i in (0, 1)]
    one = take(tracker, subs, 1, {"000001.sst": b"a" * 10, "MANIFEST-1": b"m1"})
    two = take(tracker, subs, 2, {"000002.sst": b"b" * 20, "MANIFEST-2": b"m2"})

    assert tracker.poll() == [] and len(tracker) == 2
    for job in two:  # checkpoint 2 is confirmed first: it still waits for 1
        assert run_upload(job)
    assert tracker.poll() == []
    assert run_upload(one[0])
    assert tracker.poll() == [], "one of two subtasks confirmed"
    assert not store.exists(metadata_key(1))
    assert run_upload(one[1])

    outcomes = tracker.poll()
    assert [(o.checkpoint_id, o.meta is not None) for o in outcomes] == [(1, True), (2, True)]
    assert [m.checkpoint_id for m in coord.completed] == [1, 2] and len(tracker) == 0
    for meta in coord.completed:  # every file the metadata names is there, with its size
        assert all(store.size(f.key) == f.size for f in meta.files())


def test_the_confirmation_of_another_attempt_does_not_count(
    tmp_path: Path, store: FileStore
) -> None:
    coord = CheckpointCoordinator(store)
    tracker = InFlightCheckpoints(store, coord, timeout_ms=60_000)
    sub = Subtask(tmp_path, store, 0)
    kept, _ = sub.snapshot(1, {"000001.sst": b"x" * 5, "MANIFEST-1": b"m"}, None)
    _, retried = sub.snapshot(1, {"000001.sst": b"x" * 5, "MANIFEST-1": b"m"}, None)
    pending = draft(coord, 1, 1, [kept, _other(kept)])
    tracker.add(pending, [kept, _other(kept)])
    assert run_upload(retried)  # a failed attempt's upload, under its own token
    store.put(confirmation_key(1, UID, 1, "tok", CONFIRMED), b"{}")
    assert tracker.poll() == []


def _other(report: StateReport) -> StateReport:
    """Subtask 1, already confirmed under token "tok"."""
    assert report.snapshot is not None
    return StateReport(UID, 1, 1, 0, 0, 0, report.snapshot, upload="tok")


def test_a_failed_upload_fails_its_checkpoint_only_and_deletes_what_only_it_wrote(
    tmp_path: Path, store: FileStore
) -> None:
    coord = CheckpointCoordinator(store, retained=1)
    tracker = InFlightCheckpoints(store, coord, timeout_ms=60_000)
    subs = [Subtask(tmp_path, store, i) for i in (0, 1)]
    for job in take(tracker, subs, 1, {"000001.sst": b"a" * 10, "MANIFEST-1": b"m1"}):
        run_upload(job)
    (first,) = tracker.poll()
    assert first.meta is not None
    # Checkpoint 2 re-references 000001.sst and adds 000002.sst; subtask 1's file vanished.
    names = {"000001.sst": b"a" * 10, "000002.sst": b"b" * 7, "MANIFEST-2": b"m2"}
    two = take(tracker, subs, 2, names, first.meta)
    (subs[1].dir / "000002.sst").unlink()
    assert run_upload(two[0]) and not run_upload(two[1])
    assert store.exists(confirmation_key(2, UID, 1, two[1].plan.token, FAILED))

    (failed,) = tracker.poll()
    assert failed.meta is None and failed.error is not None
    assert "operator 'count' subtask 1" in failed.error and "000002.sst" in failed.error
    assert not store.listing("chk-0000000002/"), "the failed checkpoint's own files are gone"
    new_keys = {f.key for job in two for f in job.plan.files if "000002" in f.name}
    assert not any(store.exists(k) for k in new_keys)
    assert all(store.size(f.key) == f.size for f in first.meta.files()), "checkpoint 1 intact"
    assert [m.checkpoint_id for m in coord.completed] == [1]


def test_subsuming_an_older_checkpoint_keeps_the_files_an_in_flight_one_references(
    tmp_path: Path, store: FileStore
) -> None:
    coord = CheckpointCoordinator(store, retained=1)
    tracker = InFlightCheckpoints(store, coord, timeout_ms=60_000)
    subs = [Subtask(tmp_path, store, i) for i in (0, 1)]
    shared = {"000001.sst": b"a" * 10}
    for job in take(tracker, subs, 1, {**shared, "MANIFEST-1": b"1"}):
        run_upload(job)
    (first,) = tracker.poll()
    assert first.meta is not None
    # 2 and 3 are both based on 1 (the latest completed when they were taken).
    two = take(tracker, subs, 2, {**shared, "000002.sst": b"2" * 3, "MANIFEST-2": b"2"}, first.meta)
    three = take(
        tracker, subs, 3, {**shared, "000003.sst": b"3" * 4, "MANIFEST-3": b"3"}, first.meta
    )
    for job in two:
        run_upload(job)
    assert [o.checkpoint_id for o in tracker.poll()] == [2]
    coord.subsume()  # retained=1: checkpoint 1 goes; 000001.sst is still needed by 3
    for job in three:
        run_upload(job)
    (third,) = tracker.poll()
    assert third.meta is not None
    assert all(store.size(f.key) == f.size for f in third.meta.files())


def test_an_upload_that_is_never_confirmed_times_out_and_its_late_files_are_swept(
    tmp_path: Path, store: FileStore
) -> None:
    coord = CheckpointCoordinator(store)
    tracker = InFlightCheckpoints(store, coord, timeout_ms=200)
    sub = Subtask(tmp_path, store, 0)
    report, job = sub.snapshot(1, {"000001.sst": b"a" * 10, "MANIFEST-1": b"m"}, None)
    started = time.monotonic()
    pending = draft(coord, 1, 1, [report, _other(report)], started)
    tracker.add(pending, [report, _other(report)])
    store.put(confirmation_key(1, UID, 1, "tok", CONFIRMED), b"{}")
    assert tracker.poll() == []
    time.sleep(0.3)
    (timed_out,) = tracker.poll()
    assert timed_out.meta is None and "checkpoint.timeout_ms (200)" in (timed_out.error or "")
    assert "subtask 0" in (timed_out.error or "")
    # The executor was only slow: its upload writes after the checkpoint failed...
    late = UploadJob(job.store, 1, UID, 0, job.local_dir, job.plan, 1, False)
    assert not run_upload(late)  # past its own deadline it sends nothing
    run_upload(UploadJob(job.store, 1, UID, 0, job.local_dir, job.plan, 2**62, False))
    assert store.listing("")
    # ...and what it wrote is swept once its writes must have ended.
    coord.sweep(time.monotonic() + 59)
    assert store.listing("")
    coord.sweep(time.monotonic() + 61)  # LATE_WRITES_S after the deadline
    assert store.listing("") == []


def test_a_lost_executor_fails_its_checkpoint_at_once_not_at_the_deadline(
    tmp_path: Path, store: FileStore
) -> None:
    coord = CheckpointCoordinator(store, retained=2)
    tracker = InFlightCheckpoints(store, coord, timeout_ms=600_000)
    subs = [Subtask(tmp_path, store, i, executor=str(i + 1)) for i in (0, 1)]
    one = take(tracker, subs, 1, {"000009.sst": b"x" * 10})
    assert run_upload(one[1])  # subtask 1's executor confirmed; subtask 0's never will
    tracker.alive = lambda: {"1", "2"}
    assert tracker.poll() == [], "both executors live: keep waiting"
    tracker.alive = lambda: {"2", "3"}
    (lost,) = tracker.poll()
    assert lost.checkpoint_id == 1 and lost.meta is None
    assert "executor 1 was lost while it uploaded operator 'count' subtask 0" in (lost.error or "")
    assert not store.listing("chk-0000000001/"), "nothing of the failed checkpoint is left"


def test_an_upload_outlives_the_worker_that_submitted_it(tmp_path: Path, store: FileStore) -> None:
    """Spark closes idle Python workers and a failed task's worker exits with os._exit: the
    uploader process finishes what it was given all the same."""
    (_, job) = Subtask(tmp_path, store, 0).snapshot(1, {"000009.sst": b"x" * 4096}, None)
    script = (
        "import os, pickle, sys\n"
        "from stator.checkpoint import uploads\n"
        "assert uploads.submit(pickle.load(sys.stdin.buffer))\n"
        "os._exit(0)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", script], input=pickle.dumps(job), env=env, check=True)
    key = confirmation_key(1, UID, 0, job.plan.token, CONFIRMED)
    deadline = time.monotonic() + 30
    while not store.exists(key) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert store.exists(key), "the upload was confirmed after its worker had exited"
    ((_, todo_key),) = job.plan.todo
    assert store.size(todo_key) == 4096


def test_the_next_checkpoint_builds_on_the_one_in_flight_and_completes_after_it(
    tmp_path: Path, store: FileStore
) -> None:
    coord = CheckpointCoordinator(store, retained=1)
    tracker = InFlightCheckpoints(store, coord, timeout_ms=60_000)
    subs = [Subtask(tmp_path, store, i) for i in (0, 1)]
    one = take(tracker, subs, 1, {"000001.sst": b"a" * 10, "MANIFEST-1": b"m1"})
    base = tracker.newest()
    assert base is not None and base.checkpoint_id == 1
    names = {"000001.sst": b"a" * 10, "000002.sst": b"b" * 5, "MANIFEST-2": b"m2"}
    two = take(tracker, subs, 2, names, base, base=1)
    assert [sorted(n for n, _ in job.plan.todo) for job in two] == [
        ["000002.sst", "MANIFEST-2"]
    ] * 2
    for job in [*two, *one]:
        assert run_upload(job)
    outcomes = tracker.poll()
    assert [(o.checkpoint_id, o.meta is not None) for o in outcomes] == [(1, True), (2, True)]
    second = outcomes[1].meta
    assert second is not None and all(store.size(f.key) == f.size for f in second.files())


def test_the_next_checkpoint_fails_with_the_one_in_flight_it_builds_on(
    tmp_path: Path, store: FileStore
) -> None:
    coord = CheckpointCoordinator(store, retained=2)
    tracker = InFlightCheckpoints(store, coord, timeout_ms=60_000)
    subs = [Subtask(tmp_path, store, i) for i in (0, 1)]
    one = take(tracker, subs, 1, {"000001.sst": b"a" * 10, "MANIFEST-1": b"m1"})
    names = {"000001.sst": b"a" * 10, "000002.sst": b"b" * 5, "MANIFEST-2": b"m2"}
    two = take(tracker, subs, 2, names, tracker.newest(), base=1)
    for job in two:
        assert run_upload(job)
    assert run_upload(one[0])
    (subs[1].dir / "000001.sst").unlink()  # subtask 1's part of checkpoint 1 cannot be sent
    assert not run_upload(one[1])
    outcomes = tracker.poll()
    assert [(o.checkpoint_id, o.meta is None) for o in outcomes] == [(1, True), (2, True)]
    assert "checkpoint 1, whose files it re-references, failed" in (outcomes[1].error or "")
    assert store.listing("") == [], "nothing either of them wrote is left"
    assert coord.completed == []


def test_an_executor_has_one_uploader_that_outlives_its_workers(
    tmp_path: Path, store: FileStore
) -> None:
    """The Python daemon starts one uploader (``executor_uploader.start``); workers forked
    after it (here: processes that inherit its environment) hand it their jobs and exit at
    once; it finishes them, and exits once the daemon is gone."""
    jobs = [
        Subtask(tmp_path, store, i).snapshot(1, {"000009.sst": b"x" * 4096}, None)[1]
        for i in (0, 1)
    ]
    worker = (
        "import os, pickle, sys\n"
        "from stator.checkpoint import uploads\n"
        "assert uploads.submit(pickle.load(sys.stdin.buffer))\n"
        "assert type(uploads._uploaders[os.getpid()]).__name__ == 'ExecutorUploader'\n"
        "os._exit(0)\n"
    )
    daemon = (
        "import os, pickle, subprocess, sys\n"
        "from stator.checkpoint import executor_uploader\n"
        "executor_uploader.start()\n"
        "print(os.environ['STATOR_UPLOADER_SOCKET'], flush=True)\n"
        "for job in pickle.load(sys.stdin.buffer):\n"
        f"    subprocess.run([sys.executable, '-c', {worker!r}], input=job, check=True)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("STATOR_UPLOADER_SOCKET", None)
    done = subprocess.run(
        [sys.executable, "-c", daemon],
        input=pickle.dumps([pickle.dumps(j) for j in jobs]),
        env=env,
        capture_output=True,
        check=True,
    )
    socket_path = done.stdout.decode().strip()
    assert socket_path.endswith("/socket")
    keys = [confirmation_key(1, UID, j.subtask, j.plan.token, CONFIRMED) for j in jobs]
    deadline = time.monotonic() + 30
    while not all(store.exists(k) for k in keys) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(store.exists(k) for k in keys), "both workers' uploads were confirmed"
    # The daemon is gone: the uploader exits and removes its socket's directory.
    while Path(socket_path).parent.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(socket_path).parent.exists()


def test_a_killed_uploaders_directory_is_removed_by_the_next_start(tmp_path: Path) -> None:
    """SIGKILL skips the uploader's clean-up: the next start removes a directory whose socket
    nobody listens on, but not one an uploader listens on, nor one too young to judge (an
    executor that is starting), nor other files."""
    from stator.checkpoint.executor_uploader import DIR_PREFIX, STALE_AFTER_S, remove_stale

    def uploader_dir(name: str, listening: bool) -> tuple[Path, socket.socket]:
        d = tmp_path / f"{DIR_PREFIX}{name}"
        d.mkdir()
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(d / "socket"))
        if listening:
            s.listen(1)
        return d, s

    dead, s1 = uploader_dir("dead", listening=False)
    s1.close()  # the file stays; nobody listens: a killed uploader's
    alive, s2 = uploader_dir("alive", listening=True)
    (tmp_path / "stator-other").mkdir()
    try:
        assert remove_stale(str(tmp_path)) == []  # both just created: too young to judge
        later = time.time() + STALE_AFTER_S + 1
        assert remove_stale(str(tmp_path), now=later) == [str(dead)]
        assert not dead.exists() and alive.exists() and (tmp_path / "stator-other").exists()
    finally:
        s2.close()
