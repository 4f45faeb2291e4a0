"""`Deduplicator`: drop envelopes whose message id was already accepted. Bounded memory.

State per (origin_node, origin_incarnation): a high-water mark H (every seq <= H counts as seen)
and a ring of `window` flags for the seqs in (H, H + window]. A seq past H + window slides the
window up to it; the seqs it slides over count as seen from then on, so a seq that arrives more
than `window` below the highest one seen is dropped as a duplicate even if it never arrived before.
That is safe as long as `window` exceeds the sender's maximum number of unacknowledged envelopes
in flight: a sender only re-sends what is unacked, in order (see `OutboundQueue.max_in_flight`).

At most `max_incarnations` incarnations are tracked per origin node; when a newer one appears the
oldest is forgotten, and envelopes of incarnations older than every tracked one are dropped too
(such an origin process has been superseded several times). Memory: about `window` bytes per
tracked (node, incarnation). A restarted receiver starts empty (at-least-once across its restart).
"""

from __future__ import annotations

from sidecar.hlc import MessageId

__all__ = ["Deduplicator"]


class _Window:
    __slots__ = ("high", "ring", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.high = 0  # every seq <= high is seen
        self.ring = bytearray(size)  # flag of seq s in (high, high + size] at s % size

    def accept(self, seq: int) -> bool:
        high, size, ring = self.high, self.size, self.ring
        if seq <= high:
            return False
        if seq > high + size:  # slide: the window ends at seq
            new_high = seq - size
            if new_high - high >= size:
                ring[:] = bytes(size)
            else:
                for s in range(high + 1, new_high + 1):
                    ring[s % size] = 0
            high = new_high
        slot = seq % size
        if ring[slot]:
            self.high = high
            return False
        ring[slot] = 1
        while ring[(high + 1) % size]:  # advance over the contiguous run
            high += 1
            ring[high % size] = 0
        self.high = high
        return True


class Deduplicator:
    """Accepts each message id once (within the window; see the module docstring)."""

    def __init__(self, window: int = 65_536, max_incarnations: int = 4) -> None:
        if window < 1 or max_incarnations < 1:
            raise ValueError("window and max_incarnations must be at least 1")
        self.window = window
        self.max_incarnations = max_incarnations
        self._origins: dict[str, dict[int, _Window]] = {}
        self.duplicates = 0
        self.stale = 0

    def accept(self, msg: MessageId) -> bool:
        """True the first time msg is seen: deliver it. False: drop it (counted)."""
        node, incarnation, seq = msg
        windows = self._origins.get(node)
        if windows is None:
            windows = self._origins[node] = {}
        window = windows.get(incarnation)
        if window is None:
            if len(windows) >= self.max_incarnations:
                oldest = min(windows)
                if incarnation < oldest:
                    self.stale += 1
                    return False
                del windows[oldest]
            window = windows[incarnation] = _Window(self.window)
        if window.accept(seq):
            return True
        self.duplicates += 1
        return False

    def high_water(self, node: str, incarnation: int) -> int:
        """Every seq up to this one counts as seen for (node, incarnation)."""
        window = self._origins.get(node, {}).get(incarnation)
        return 0 if window is None else window.high

    def forget(self, node: str) -> None:
        """Drop all state for an origin node (it left the cluster)."""
        self._origins.pop(node, None)
