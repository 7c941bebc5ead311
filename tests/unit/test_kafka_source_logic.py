"""The Kafka source's pure logic: start positions, split order, argument checks, idleness
decisions, lag bookkeeping, and the planner's discovery of splits added while running."""

from __future__ import annotations

from typing import Any

import pytest

from stator.api.nodes import SourceNode
from stator.api.time import BoundedOutOfOrderness
from stator.config import EpochConfig
from stator.driver.idleness import IdleTracker
from stator.driver.planning import EpochPlanner
from stator.errors import StatorError
from stator.sources import KafkaSource, StartFrom
from stator.sources.base import Source, SplitLag, SplitRange
from stator.sources.kafka.discovery import TopicSelection
from stator.sources.kafka.lag import LagMeter
from stator.sources.kafka.start import parse_start, resolve


def test_each_start_mode_resolves_to_its_offset_clamped_into_the_partition() -> None:
    lo, hi = 10, 50
    assert resolve(StartFrom.earliest(), "t:0", lo, hi) == 10
    assert resolve(StartFrom.latest(), "t:0", lo, hi) == 50
    assert resolve(StartFrom.timestamp(1_000), "t:0", lo, hi, by_time=33) == 33
    assert resolve(StartFrom.timestamp(1_000), "t:0", lo, hi, by_time=None) == 50  # none later
    assert resolve(StartFrom.group_offsets(), "t:0", lo, hi, committed=42) == 42
    assert resolve(StartFrom.group_offsets(), "t:0", lo, hi, committed=None) == 10
    assert resolve(StartFrom.group_offsets("latest"), "t:0", lo, hi, committed=None) == 50
    given = StartFrom.given({"t:0": 20, ("t", 1): 5, "t:2": 99}, fallback="latest")
    assert given.offsets == {"t:0": 20, "t:1": 5, "t:2": 99}
    assert resolve(given, "t:0", lo, hi) == 20
    assert resolve(given, "t:1", lo, hi) == 10  # deleted by retention: the earliest kept
    assert resolve(given, "t:2", lo, hi) == 50  # past the end: the end
    assert resolve(given, "t:3", lo, hi) == 50  # not listed: the fallback


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: parse_start("newest", None),
            "start must be 'earliest', 'latest', 'group-offsets'",
        ),
        (lambda: parse_start("group-offsets", None), "needs group_id="),
        (lambda: StartFrom.timestamp(-5), "StartFrom.timestamp(ms) takes epoch milliseconds"),
        (lambda: StartFrom.timestamp(True), "StartFrom.timestamp(ms) takes epoch milliseconds"),
        (lambda: StartFrom.group_offsets("middle"), "fallback) must be 'earliest' or 'latest'"),
        (lambda: StartFrom.given({"orders": 1}), "key 'orders' is not 'topic:partition'"),
        (lambda: StartFrom.given({"t:0": -1}), "offset of t:0 must be an int >= 0"),
        (lambda: KafkaSource("b:9092"), "exactly one of topic=, topics=[...] or topic_pattern="),
        (lambda: KafkaSource("b:9092", "t", topics=["u"]), "got ['topic', 'topics']"),
        (lambda: KafkaSource("b:9092", topics="t"), "topics= takes a list"),
        (lambda: KafkaSource("b:9092", topic_pattern="(a"), "topic_pattern '(a'"),
        (lambda: KafkaSource("b:9092", "t", discovery_interval_ms=-1), "discovery_interval_ms"),
        (lambda: KafkaSource("b:9092", "t", dead_letter=""), "dead_letter must be a topic"),
        (
            lambda: KafkaSource("b:9092", "t", commit_offsets_on_checkpoint=True),
            "commit_offsets_on_checkpoint=True needs group_id",
        ),
        (lambda: BoundedOutOfOrderness(0, -1), "idleness_ms must be >= 0"),
    ],
)
def test_bad_settings_are_refused_naming_the_argument(make: Any, message: str) -> None:
    with pytest.raises(ValueError, match=None) as err:
        make()
    assert message in str(err.value)


def test_group_id_turns_offset_commits_on_unless_told_otherwise() -> None:
    assert KafkaSource("b", "t", group_id="g").commit_offsets is True
    assert (
        KafkaSource("b", "t", group_id="g", commit_offsets_on_checkpoint=False).commit_offsets
        is False
    )
    assert KafkaSource("b", "t").commit_offsets is False
    assert KafkaSource("b", "t", bounded=True).discovery_interval_ms == 0  # bounded: fixed input


def test_splits_are_sorted_by_topic_then_partition_number() -> None:
    listed = {"b": [1, 0], "a": [10, 9, 2], "__consumer_offsets": [0], "c": None, "ab": [0]}
    assert TopicSelection.of(None, ["b", "a"], None).splits(listed) == [
        "a:2",
        "a:9",
        "a:10",
        "b:0",
        "b:1",
    ]
    # fullmatch: "ab" does not match "a"; internal and broken topics never match
    assert TopicSelection.of(None, None, "a|b|c|__.*").splits(listed) == [
        "a:2",
        "a:9",
        "a:10",
        "b:0",
        "b:1",
    ]
    assert TopicSelection.of(None, None, "zzz.*").splits(listed) == []  # may match later
    with pytest.raises(StatorError, match="Kafka topic\\(s\\) c, d not readable"):
        TopicSelection.of(None, ["a", "c", "d"], None).splits(listed)


def r(split: str, start: int, end: int) -> SplitRange:
    return SplitRange(split, start, end, 0)


def test_a_split_is_idle_after_idleness_ms_without_input_and_active_again_with_input() -> None:
    idle = IdleTracker({"src": 100, "never": 0})
    idle.reset(1_000)

    def marks(rs: list[SplitRange], now: int) -> tuple[list[bool], bool]:
        out, became = idle.mark("src", rs, now)
        return [x.idle for x in out], became

    assert marks([r("a", 0, 5), r("b", 0, 0)], 1_050) == ([False, False], False)
    # b: 100 ms since the start; turning idle is news (the epoch moves the watermark)
    assert marks([r("a", 5, 5), r("b", 0, 0)], 1_100) == ([False, True], True)
    assert marks([r("a", 5, 5), r("b", 0, 0)], 1_149) == ([False, True], False)
    assert marks([r("a", 5, 5), r("b", 0, 0)], 1_150) == ([True, True], True)  # a: 100 ms idle
    assert marks([r("a", 5, 5), r("b", 0, 3)], 1_160) == ([True, False], False)  # b has input
    assert marks([r("a", 5, 5), r("b", 3, 3)], 1_259) == ([True, False], False)
    assert marks([r("a", 5, 5), r("b", 3, 3)], 1_260) == ([True, True], True)
    assert idle.mark("never", [r("a", 0, 0)], 10**9)[0][0].idle is False


def test_lag_counts_records_and_ages_the_next_unread_record_peeking_only_when_it_moved() -> None:
    peeks: list[tuple[str, int]] = []

    def peek(split: str, offset: int) -> int | None:
        peeks.append((split, offset))
        return 10_000 + offset

    meter = LagMeter()
    meter.measure("t:0", 5, 5, 20_000, peek)
    assert meter.lag["t:0"] == SplitLag(0, 0.0) and peeks == []  # caught up: no fetch
    meter.measure("t:0", 5, 8, 20_000, peek)
    assert meter.lag["t:0"] == SplitLag(3, 9.995)
    meter.measure("t:0", 5, 9, 20_400, peek)  # same position: same record, older now
    assert meter.lag["t:0"] == SplitLag(4, 10.395) and len(peeks) == 1
    meter.measure("t:0", 7, 9, 20_500, peek)  # moved, but peeked < 1 s ago: ages
    assert meter.lag["t:0"] == SplitLag(2, 10.495) and len(peeks) == 1
    meter.measure("t:0", 7, 9, 21_000, peek)
    assert meter.lag["t:0"] == SplitLag(2, 10.993) and peeks[-1] == ("t:0", 7)
    meter.forget({"t:1"})
    assert meter.lag == {}


class GrowingSource(Source):
    """Splits ``s:<n>`` that grow while the job runs; each holds ``size`` records."""

    discovery_interval_ms = 50
    split_key = staticmethod(lambda s: int(s.split(":")[1]))

    def __init__(self, splits: list[str], size: int = 3) -> None:
        self.splits, self.size = splits, size

    def discover_splits(self) -> list[str]:
        return list(self.splits)

    def initial_position(self, split: str) -> Any:
        return self.size  # "latest"

    def new_split_position(self, split: str) -> Any:
        return 0  # "earliest"

    def plan(self, positions: dict[str, Any], budget: int, now_ms: int) -> list[SplitRange]:
        return [SplitRange(s, p, self.size, 99) for s, p in positions.items() if p < self.size]

    def read(self, rng: SplitRange) -> list[Any]:
        return list(range(rng.start, rng.end))


def planner(source: Source) -> EpochPlanner:
    node = SourceNode(1, [], "src", "src", source, None, BoundedOutOfOrderness(0, 0))
    return EpochPlanner({"src": node}, EpochConfig())


def test_splits_added_while_running_join_at_their_beginning_in_split_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from stator.driver import planning

    clock = [1_000]
    monkeypatch.setattr(planning, "now_ms", lambda: clock[0])
    src = GrowingSource(["s:2", "s:10"])
    p = planner(src)
    p.rewind(None)
    assert {s: st.position for s, st in p.positions["src"].items()} == {"s:2": 3, "s:10": 3}
    assert p.plan() is None  # at the end; nothing to read
    src.splits = ["s:2", "s:10", "s:1"]
    clock[0] += 49
    assert p.plan() is None  # not due yet
    clock[0] += 1
    plan = p.plan()
    assert plan is not None
    assert [(x.split, x.start, x.end, x.order) for x in plan["src"]] == [
        ("s:1", 0, 3, 0),  # the planner's order, not the source's 99
        ("s:2", 3, 3, 1),
        ("s:10", 3, 3, 2),
    ]
    # A rewind to a checkpoint that did not know s:1 starts it at its beginning again.
    p.rewind({"src": {"s:2": {"position": 3, "max_timestamp": 0, "finished": False}}})
    assert {s: st.position for s, st in p.positions["src"].items()} == {
        "s:1": 0,
        "s:2": 3,
        "s:10": 0,
    }
