"""What a peer's acks mean to the origin (sidecar.routing.acks)."""

from __future__ import annotations

from sidecar.routing.acks import sort_acks
from sidecar.routing.receiver import ACK_OK, ACK_QUEUED, ACK_REJECTED


def test_acks_of_an_earlier_incarnation_only_clear_the_queue():
    acks = [(5, 1, ACK_OK), (7, 2, ACK_OK), (7, 3, ACK_REJECTED), (5, 4, ACK_REJECTED),
            (7, 4, ACK_QUEUED)]
    out = sort_acks(acks, incarnation=7)
    assert out.by_incarnation == {5: [1, 4], 7: [2, 3, 4]}
    assert out.settled == [2, 4]  # a queued ack settles too: the peer holds it durably
    assert out.rejected == [3]


def test_no_acks():
    out = sort_acks([], incarnation=1)
    assert (out.by_incarnation, out.settled, out.rejected) == ({}, [], [])
