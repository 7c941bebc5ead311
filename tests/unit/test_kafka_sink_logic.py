"""Pure parts of the transactional Kafka sink: the staged frame format, the marker, the
commit ids, the explanations of failed commits, argument checks and failpoint parsing."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stator.errors import StatorError
from stator.failpoints import _parse
from stator.sinks import KafkaSink
from stator.sinks.kafka.frames import FrameWriter, count_frames, read_frames
from stator.sinks.kafka.publisher import HISTORY, TransactionalPublisher, _parse_marker, commit_id

frames = st.lists(
    st.tuples(
        st.none() | st.binary(max_size=20),
        st.none() | st.binary(max_size=50),
        st.none() | st.integers(0, 2**62),
    ),
    max_size=30,
)


@given(frames)
def test_frames_round_trip(records: list[tuple[bytes | None, bytes | None, int | None]]) -> None:
    w = FrameWriter()
    for r in records:
        w.add(*r)
    blob = w.close()
    assert count_frames(blob) == len(records)
    assert list(read_frames(blob, "x")) == records


def test_truncated_or_foreign_objects_are_refused() -> None:
    w = FrameWriter()
    for i in range(5):
        w.add(b"k", b"v%d" % i, i)
    blob = w.close()
    with pytest.raises(StatorError, match="truncated or corrupt"):
        list(read_frames(blob[:-20] + blob[-8:], "s3://b/x.kfr"))
    with pytest.raises(StatorError, match="not a staged Kafka sink object"):
        list(read_frames(b"hello world, not frames", "s3://b/y.kfr"))


def test_commit_ids_name_the_attempts_that_staged() -> None:
    a = commit_id("out", 7, ["epoch=7/p0.aaa.kfr", "epoch=7/p1.bbb.kfr"])
    assert a == commit_id("out", 7, ["epoch=7/p1.bbb.kfr", "epoch=7/p0.aaa.kfr"])
    assert a != commit_id("out", 7, ["epoch=7/p0.ccc.kfr", "epoch=7/p1.bbb.kfr"])  # a replay
    assert a != commit_id("out", 8, ["epoch=7/p0.aaa.kfr", "epoch=7/p1.bbb.kfr"])


def test_marker_parsing() -> None:
    assert _parse_marker(-1001, None) == ([], 0)  # no committed offset yet
    ids = [f"id{i}" for i in range(3)]
    assert _parse_marker(12, json.dumps({"v": 1, "ids": ids})) == (ids, 12)
    assert _parse_marker(5, "someone else's metadata") == ([], 5)
    assert HISTORY * 20 < 4096  # ids fit the broker's offset.metadata.max.bytes default


class _Err:
    def __init__(self, name: str) -> None:
        self._name = name

    def name(self) -> str:
        return self._name


def test_failed_commits_are_explained_with_the_fix() -> None:
    p = TransactionalPublisher("b:9092", "out", "stator-job-out", {}, 30)
    p.txn_timeout_ms = 1_000
    timed_out = p._explain(Exception(_Err("INVALID_PRODUCER_EPOCH")), 4, 1_500)
    assert "transaction.timeout.ms=1000" in timed_out and "epoch.max_records" in timed_out
    fenced = p._explain(Exception(_Err("_FENCED")), 4, 10)
    assert "taken over" in fenced and "stator-job-out" in fenced
    assert "epoch 4" in p._explain(Exception(_Err("UNKNOWN")), 4, 10)


def test_bad_arguments_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="delivery must be one of exactly-once, at-least-once"):
        KafkaSink("b:9092", "t", delivery="exactly_once")
    with pytest.raises(ValueError, match="pass transactional_id_prefix="):
        KafkaSink("b:9092", "t", producer_config={"transactional.id": "x"})
    with pytest.raises(ValueError, match="topic"):
        KafkaSink("b:9092", "")
    assert not KafkaSink("b:9092", "t", delivery="at-least-once").exactly_once
    assert KafkaSink("b:9092", "t").exactly_once  # the default with checkpoints


def test_failpoint_specs() -> None:
    assert _parse("") == {}
    assert _parse("a@3, b") == {"a": 3, "b": 1}
