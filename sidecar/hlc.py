"""Hybrid logical clock (Kulkarni et al. 2014) and message ids. Sans-IO: wall time is passed in.

A `Timestamp` is ``(wall_ms, logical)``, ordered as a tuple, packed into one uint64 as
``wall_ms << 16 | logical`` (the packing preserves order). `HybridClock` hands out timestamps that
strictly increase whatever the wall clock does (also when it goes backwards) and that exceed every
remote timestamp it has been updated with, so causally related events are ordered.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = [
    "LOGICAL_BITS",
    "MAX_LOGICAL",
    "MAX_WALL_MS",
    "ClockDriftError",
    "HybridClock",
    "MessageId",
    "Timestamp",
]

LOGICAL_BITS = 16
MAX_LOGICAL = (1 << LOGICAL_BITS) - 1
MAX_WALL_MS = (1 << (64 - LOGICAL_BITS)) - 1  # year 10889


class Timestamp(NamedTuple):
    """An HLC time: milliseconds since the epoch (the largest seen) and a counter within it."""

    wall_ms: int
    logical: int = 0

    def pack(self) -> int:
        """As one uint64, ``wall_ms << 16 | logical``; a < b iff a.pack() < b.pack()."""
        if not (0 <= self.wall_ms <= MAX_WALL_MS and 0 <= self.logical <= MAX_LOGICAL):
            raise ValueError(f"timestamp out of range: {self}")
        return self.wall_ms << LOGICAL_BITS | self.logical

    @classmethod
    def unpack(cls, value: int) -> Timestamp:
        """The inverse of `pack`."""
        if not 0 <= value < 1 << 64:
            raise ValueError(f"packed timestamp out of uint64 range: {value}")
        return cls(value >> LOGICAL_BITS, value & MAX_LOGICAL)


class MessageId(NamedTuple):
    """Identity of one published message cluster-wide (assigned by its origin sidecar)."""

    origin_node: str
    origin_incarnation: int
    origin_seq: int


class ClockDriftError(ValueError):
    """A remote timestamp is further ahead of our wall clock than the allowed drift."""


class HybridClock:
    """A hybrid logical clock.

    `now(wall_ms)` for a local event (e.g. a publish to forward); `update(remote, wall_ms)` when a
    timestamp arrives from a peer. Both return a timestamp greater than every timestamp this clock
    returned or was updated with before. When the logical counter would overflow 16 bits, the
    clock moves its wall part one millisecond ahead instead (it runs slightly ahead of the wall
    clock until the wall clock catches up).

    `update` raises `ClockDriftError` and leaves the clock unchanged if ``remote.wall_ms`` is more
    than `max_drift_ms` ahead of ``max(wall_ms, our last time)``: one peer with a wrong clock must
    not drag every node's clock into the future. The caller logs it and carries on without the
    update (``max_drift_ms=None`` disables the check).
    """

    __slots__ = ("_last", "max_drift_ms")

    def __init__(self, max_drift_ms: int | None = 5_000, start: Timestamp | None = None) -> None:
        self.max_drift_ms = max_drift_ms
        self._last = start if start is not None else Timestamp(0, 0)

    @property
    def last(self) -> Timestamp:
        """The latest timestamp returned (or the start)."""
        return self._last

    def now(self, wall_ms: int) -> Timestamp:
        """A new timestamp for a local event at wall time `wall_ms`."""
        last_wall, last_logical = self._last
        if wall_ms > last_wall:
            ts = Timestamp(wall_ms, 0)
        elif last_logical < MAX_LOGICAL:
            ts = Timestamp(last_wall, last_logical + 1)
        else:
            ts = Timestamp(last_wall + 1, 0)
        self._last = ts
        return ts

    def observe(self, packed: int, wall_ms: int) -> bool:
        """Merge a peer's packed timestamp, as `update`; False (the clock unchanged) if it is
        too far ahead or not a timestamp, for the caller to count."""
        try:
            self.update(Timestamp.unpack(packed), wall_ms)
        except ValueError:  # ClockDriftError included
            return False
        return True

    def update(self, remote: Timestamp, wall_ms: int) -> Timestamp:
        """Merge a peer's timestamp (received at `wall_ms`); return a time after both."""
        last_wall, last_logical = self._last
        remote_wall, remote_logical = remote
        if self.max_drift_ms is not None:
            ahead = remote_wall - max(wall_ms, last_wall)
            if ahead > self.max_drift_ms:
                raise ClockDriftError(
                    f"remote time {remote_wall} ms is {ahead} ms ahead of ours"
                    f" (allowed drift {self.max_drift_ms} ms)"
                )
        wall = max(last_wall, remote_wall, wall_ms)
        if wall == last_wall and wall == remote_wall:
            logical = max(last_logical, remote_logical) + 1
        elif wall == last_wall:
            logical = last_logical + 1
        elif wall == remote_wall:
            logical = remote_logical + 1
        else:
            logical = 0
        if logical > MAX_LOGICAL:
            wall, logical = wall + 1, 0
        ts = Timestamp(wall, logical)
        self._last = ts
        return ts
