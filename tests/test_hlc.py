"""Hybrid logical clock: monotonic whatever the wall clock does, after remote times, packable."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.hlc import (
    MAX_LOGICAL,
    MAX_WALL_MS,
    ClockDriftError,
    HybridClock,
    MessageId,
    Timestamp,
)

walls = st.integers(min_value=0, max_value=10**13)
timestamps = st.builds(
    Timestamp, st.integers(0, MAX_WALL_MS), st.integers(0, MAX_LOGICAL)
)


@given(st.lists(walls, max_size=200))
def test_now_is_strictly_monotonic_for_any_wall_sequence(sequence):
    clock = HybridClock()
    previous = clock.last
    for wall in sequence:
        ts = clock.now(wall)
        assert ts > previous
        assert ts.wall_ms >= wall  # never behind the wall clock
        previous = ts


@given(
    st.lists(
        st.tuples(st.booleans(), walls, st.integers(-3_000, 3_000), st.integers(0, MAX_LOGICAL)),
        max_size=200,
    )
)
def test_update_is_after_remote_and_previous(ops):
    clock = HybridClock(max_drift_ms=5_000)
    previous = clock.last
    for is_update, wall, skew, logical in ops:
        if is_update:
            remote = Timestamp(max(0, wall + skew), logical)
            ts = clock.update(remote, wall)
            assert ts > remote
        else:
            ts = clock.now(wall)
        assert ts > previous
        previous = ts


def test_standard_rules():
    clock = HybridClock()
    assert clock.now(100) == Timestamp(100, 0)
    assert clock.now(100) == Timestamp(100, 1)
    assert clock.now(90) == Timestamp(100, 2)  # wall clock went backwards
    assert clock.update(Timestamp(100, 7), 95) == Timestamp(100, 8)  # max(ours, remote) + 1
    assert clock.update(Timestamp(150, 3), 120) == Timestamp(150, 4)  # remote ahead
    assert clock.update(Timestamp(10, 9), 150) == Timestamp(150, 5)  # ours ahead
    assert clock.update(Timestamp(10, 9), 200) == Timestamp(200, 0)  # wall clock ahead


def test_logical_overflow_moves_wall_forward():
    clock = HybridClock(start=Timestamp(100, MAX_LOGICAL - 1))
    assert clock.now(100) == Timestamp(100, MAX_LOGICAL)
    assert clock.now(100) == Timestamp(101, 0)
    assert clock.update(Timestamp(101, MAX_LOGICAL), 50) == Timestamp(102, 0)
    assert clock.now(101) == Timestamp(102, 1)
    assert clock.now(103) == Timestamp(103, 0)


def test_drift_is_refused_and_leaves_the_clock_alone():
    clock = HybridClock(max_drift_ms=1_000)
    clock.now(10_000)
    with pytest.raises(ClockDriftError, match="ahead of ours"):
        clock.update(Timestamp(11_001, 0), 10_000)
    assert clock.last == Timestamp(10_000, 0)
    assert clock.update(Timestamp(11_000, 0), 10_000) == Timestamp(11_000, 1)
    unbounded = HybridClock(max_drift_ms=None)
    assert unbounded.update(Timestamp(10**12, 0), 0) == Timestamp(10**12, 1)


@given(timestamps)
def test_pack_round_trip(ts):
    packed = ts.pack()
    assert 0 <= packed < 1 << 64
    assert Timestamp.unpack(packed) == ts


@given(timestamps, timestamps)
def test_pack_preserves_order(a, b):
    assert (a < b) == (a.pack() < b.pack())
    assert (a == b) == (a.pack() == b.pack())


def test_pack_range_checks():
    with pytest.raises(ValueError):
        Timestamp(MAX_WALL_MS + 1, 0).pack()
    with pytest.raises(ValueError):
        Timestamp(0, MAX_LOGICAL + 1).pack()
    with pytest.raises(ValueError):
        Timestamp.unpack(1 << 64)


def test_message_id_is_a_hashable_value():
    a = MessageId("n1", 7, 42)
    assert a == MessageId(origin_node="n1", origin_incarnation=7, origin_seq=42)
    assert len({a, MessageId("n1", 7, 42), MessageId("n1", 8, 42)}) == 2


def test_observe_merges_a_packed_time_and_refuses_one_too_far_ahead():
    clock = HybridClock(max_drift_ms=1_000)
    assert clock.observe(Timestamp(5_000, 3).pack(), 4_900) is True
    assert clock.last >= Timestamp(5_000, 4)
    before = clock.last
    assert clock.observe(Timestamp(99_000, 0).pack(), 5_000) is False
    assert clock.last == before
