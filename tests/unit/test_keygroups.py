"""Key-group assignment: stable across processes, contiguous ranges, exact inverse."""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stator.keygroups import (
    KeyGroupRange,
    decode_key,
    encode_key,
    key_group,
    range_for_subtask,
    stable_hash,
    subtask_for_key_group,
)


@given(st.integers(1, 1024).flatmap(lambda m: st.tuples(st.just(m), st.integers(1, m))))
def test_ranges_partition_all_key_groups_and_invert_the_assignment(mp_p: tuple[int, int]) -> None:
    mp, p = mp_p
    ranges = [range_for_subtask(i, p, mp) for i in range(p)]
    assert ranges[0].start == 0 and ranges[-1].end == mp
    assert all(a.end == b.start for a, b in itertools.pairwise(ranges))
    assert all(len(r) >= 1 for r in ranges)
    for i, r in enumerate(ranges):
        for kg in r:
            assert subtask_for_key_group(kg, mp, p) == i


def test_flink_compatible_ranges() -> None:
    # maxParallelism 128, parallelism 3: Flink assigns [0,43), [43,86), [86,128)
    assert [range_for_subtask(i, 3, 128) for i in range(3)] == [
        KeyGroupRange(0, 43),
        KeyGroupRange(43, 86),
        KeyGroupRange(86, 128),
    ]


@given(
    st.one_of(
        st.text(),
        st.integers(-(2**63), 2**63 - 1),
        st.binary(),
        st.tuples(st.text(), st.integers()),
        st.integers(2**63, 2**70),
    )
)
def test_encode_round_trip(key: object) -> None:
    assert decode_key(encode_key(key)) == key


def test_types_do_not_collide() -> None:
    assert encode_key("1") != encode_key(1) != encode_key(b"1")


def test_hash_is_stable_across_processes() -> None:
    """Python's hash() is salted per process; the key-group must not be."""
    code = (
        "from stator.keygroups import encode_key, key_group;"
        "print([key_group(encode_key(k), 128) for k in ['a', 'user-42', 7, ('x', 1)]])"
    )
    runs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": str(seed)},
        ).stdout
        for seed in (1, 2, 3)
    }
    assert len(runs) == 1
    assert runs.pop().strip() == str(
        [key_group(encode_key(k), 128) for k in ["a", "user-42", 7, ("x", 1)]]
    )


def test_known_values_never_change() -> None:
    """Changing the hash would move every key's state: pin a few values."""
    assert stable_hash(b"abc") == 3505490737
    assert [key_group(encode_key(f"k{i}"), 128) for i in range(5)] == [11, 18, 9, 20, 100]


def test_similar_keys_spread_evenly() -> None:
    counts = Counter(key_group(encode_key(f"k{i}"), 128) for i in range(128_000))
    assert len(counts) == 128
    assert max(counts.values()) < 1.25 * 1000 and min(counts.values()) > 0.75 * 1000


def test_bad_parallelism_is_explained() -> None:
    with pytest.raises(ValueError, match="parallelism must be in"):
        range_for_subtask(0, 200, 128)
    with pytest.raises(ValueError, match="maxParallelism must be in"):
        range_for_subtask(0, 1, 40000)
