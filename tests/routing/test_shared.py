"""The one shared-subscription choice (sidecar.routing.shared)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sidecar.routing.shared import RoundRobin


def test_round_robin_per_key_from_the_seed():
    rr = RoundRobin(seed=1)
    assert [rr.pick("k", ["a", "b", "c"]) for _ in range(4)] == ["b", "c", "a", "b"]
    assert rr.pick("other", ["a", "b"]) == "b"
    assert rr.pick("k", []) is None
    rr.forget("k")
    assert rr.pick("k", ["a", "b", "c"]) == "b"


@given(n=st.integers(1, 6), rounds=st.integers(1, 5), seed=st.integers(0, 100))
def test_every_candidate_gets_an_equal_share(n, rounds, seed):
    rr = RoundRobin(seed)
    picks = [rr.pick("k", list(range(n))) for _ in range(n * rounds)]
    assert all(picks.count(c) == rounds for c in range(n))
