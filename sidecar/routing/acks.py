"""`sort_acks`: what a batch of a peer's acks means to the origin (pure).

Acks name the origin incarnation they answer: the outbound queue drops every acked message
(of any incarnation: a restarted sidecar's queue still holds its predecessor's), while only
this incarnation's messages hold copies in Mosquitto, which the acks settle, except the
rejected ones (`ACK_REJECTED`: a shared delivery no member took), which the forwarder routes
again.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from sidecar.routing.receiver import ACK_REJECTED


@dataclass
class SortedAcks:
    """`by_incarnation`: acked sequence numbers per origin incarnation (for the queue);
    `settled`: this incarnation's accepted ones; `rejected`: this incarnation's rejected."""

    by_incarnation: dict[int, list[int]] = field(default_factory=dict)
    settled: list[int] = field(default_factory=list)
    rejected: list[int] = field(default_factory=list)


def sort_acks(acks: Iterable[tuple[int, int, int]], incarnation: int) -> SortedAcks:
    """Sort `(origin incarnation, origin seq, status)` acks for this `incarnation`."""
    out = SortedAcks()
    for inc, seq, status in acks:
        out.by_incarnation.setdefault(inc, []).append(seq)
        if inc == incarnation:
            (out.rejected if status == ACK_REJECTED else out.settled).append(seq)
    return out
