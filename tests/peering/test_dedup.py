"""Deduplicator: each message id accepted once, bounded memory per origin incarnation."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.hlc import MessageId
from sidecar.peering.dedup import Deduplicator


def M(seq: int, node: str = "n1", inc: int = 1) -> MessageId:
    return MessageId(node, inc, seq)


@given(st.lists(st.tuples(st.sampled_from(["n1", "n2"]), st.integers(1, 3), st.integers(1, 200)),
                max_size=400))
def test_any_interleaving_with_repeats_accepts_each_id_once(ids):
    dedup = Deduplicator(window=256)
    accepted = [i for i in ids if dedup.accept(MessageId(*i))]
    assert sorted(accepted) == sorted(set(ids))
    assert dedup.duplicates == len(ids) - len(set(ids))


@given(st.lists(st.tuples(st.integers(0, 64), st.integers(1, 100)), min_size=1, max_size=40))
def test_ordered_stream_with_rewinds_accepts_each_id_once(steps):
    """How senders behave: in order, re-sending from any point within the window."""
    window = 64
    dedup = Deduplicator(window=window)
    seen: list[int] = []
    top = 0
    for back, length in steps:
        start = max(1, top + 1 - back)  # back = 0: no rewind
        end = top + length
        seen += [s for s in range(start, end + 1) if dedup.accept(M(s))]
        top = end
    assert seen == list(range(1, top + 1))


def test_contiguous_high_water_and_sparse_sequences():
    dedup = Deduplicator(window=8)
    assert all(dedup.accept(M(s)) for s in (1, 2, 4))
    assert dedup.high_water("n1", 1) == 2
    assert dedup.accept(M(3)) and dedup.high_water("n1", 1) == 4
    assert all(dedup.accept(M(s)) for s in range(10, 100, 3))  # a sparse subsequence
    assert dedup.high_water("n1", 1) == 97 - 8
    assert not dedup.accept(M(94))  # never seen, but more than a window below the top
    assert dedup.accept(M(96)) and not dedup.accept(M(96))


def test_jump_far_ahead_clears_the_window():
    dedup = Deduplicator(window=4)
    assert dedup.accept(M(2))
    assert dedup.accept(M(1_000))
    assert dedup.high_water("n1", 1) == 996
    assert dedup.accept(M(998)) and not dedup.accept(M(1_000)) and not dedup.accept(M(2))


def test_incarnations_are_separate_and_bounded():
    dedup = Deduplicator(window=16, max_incarnations=2)
    assert dedup.accept(M(1, inc=5)) and dedup.accept(M(1, inc=6))
    assert not dedup.accept(M(1, inc=5))
    assert dedup.accept(M(1, inc=7))  # forgets incarnation 5
    assert not dedup.accept(M(2, inc=4))  # older than every tracked incarnation
    assert dedup.stale == 1
    assert dedup.accept(M(1, node="n2"))
    dedup.forget("n2")
    assert dedup.accept(M(1, node="n2"))


def test_bad_parameters():
    with pytest.raises(ValueError):
        Deduplicator(window=0)
