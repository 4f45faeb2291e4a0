"""Copies Mosquitto dropped before sending them to the forwarding client, and their recovery
in publish order (sans-IO: fed packet ids and times, answers what to do).

Mosquitto 2.0.11 caps a client's unwritten packets at `max_queued_messages` and discards a
packet past it silently, even a QoS 1/2 message it already counts as in flight to us
(`packet__queue`); such a message is only resent when the session reconnects. It numbers a
client's outgoing QoS > 0 messages 1, 2, ... 65535, 1, ... in the order it routes them and
sends them in that order, resent ones (DUP) first after a reconnect. So an id skipped that we
neither hold nor acknowledged shows a dropped packet. From there on copies are held back (not
taken, not acknowledged) and the client reconnects: Mosquitto resends the dropped copy and
everything after it, in order. A probe (a targeted message from the plugin, next in id order)
shows drops at the tail of a burst, when nothing follows. An id still missing after
`GIVE_UP` resends was never kept (Mosquitto's queue for us overflowed: in flight plus queued
beyond Receive Maximum + `max_queued_messages`): it is counted as lost and no longer waited for.
"""

from __future__ import annotations

import enum
import heapq
from collections import deque

__all__ = ["MID_SPACE", "CopyTracker", "Verdict"]

MID_SPACE = 65535
RECENT_ACKS = 16_384
"""Acknowledged ids remembered: a copy resent because our PUBACK was lost in a reconnect is
acknowledged again, not taken twice. Far below the id space minus the largest backlog."""
RECOVERY_INTERVAL = 0.2
"""Seconds between two forced reconnects."""
PROBE_AFTER_QUIET = 0.5
"""Seconds without copies after which a probe checks the tail of the last burst."""
PROBE_TIMEOUT = 2.0
"""Seconds after which an unanswered probe (dropped too, or stuck behind dropped packets) makes
the client reconnect and is sent again."""
GIVE_UP = 3
"""Resends an id may miss (the ids after it came, it did not) before it is counted as lost."""


class Verdict(enum.Enum):
    TAKE = "take"      # a new copy: hand it to the forwarder
    HOLD = "hold"      # after a dropped one: leave it unacknowledged, it comes again in order
    SKIP = "skip"      # a resent copy we hold already
    REACK = "reack"    # a resent copy we acknowledged already (the PUBACK was lost)


class CopyTracker:
    """What the forwarding client received and owes or gave an ack for; decides what to do
    with each copy and when to reconnect or probe. Not thread-safe.

    Copies are taken in id order: `frontier` is the last id taken, every awaited (dropped) id
    is newer, and a copy newer than an awaited id is held back."""

    def __init__(self) -> None:
        self.unacked: set[int] = set()
        self._acked: set[int] = set()
        self._acked_order: deque[int] = deque()
        self._last: int | None = None  # the last id that arrived
        self._frontier: int | None = None  # the last id taken
        self._awaited: dict[int, int] = {}  # dropped id -> times it was missed
        self._heap: list[tuple[int, int]] = []  # (order key, id) of awaited ids, lazily pruned
        self._anchor = 0  # order keys count from here (the frontier when awaiting began)
        self._counted: set[int] = set()  # awaited ids missed on this connection already
        self._missed_now = False  # something was missed on this connection: reconnect
        self.dropped_seen = 0
        self.lost = 0
        self.recoveries = 0
        self._last_recovery = -1e9
        self._active_at = -1e9
        self._probed_at = -1e9
        self._probe_out = False

    @property
    def awaited(self) -> int:
        """Dropped copies not yet resent."""
        return len(self._awaited)

    @property
    def holding(self) -> bool:
        """Copies are held back (a dropped one must come first)."""
        return bool(self._awaited)

    def on_connect(self, session_present: bool = True) -> None:
        """A (re)connect. A resumed session resends what is in flight first, in id order; a new
        one numbers from 1 and holds nothing of before."""
        self._probe_out = False
        self._missed_now = False
        self._counted.clear()
        if not session_present:
            self._frontier = 0
            self.unacked.clear()
            self._awaited.clear()
            self._heap.clear()
        self._last = self._frontier  # gaps count from what we took

    def _key(self, mid: int) -> int:
        return (mid - self._anchor) % MID_SPACE

    def _oldest_awaited(self) -> int | None:
        while self._heap and self._heap[0][1] not in self._awaited:
            heapq.heappop(self._heap)
        return self._heap[0][1] if self._heap else None

    def _see(self, mid: int) -> None:
        """`mid` arrived; the ids between the previous arrival and it did not (Mosquitto sends
        in id order): the ones we neither hold nor acknowledged were dropped."""
        last, self._last = self._last, mid
        if last is None:
            return
        skipped = (mid - last - 1) % MID_SPACE
        if skipped > MID_SPACE // 2:  # older than the previous one: a resend restarting lower
            return
        for step in range(1, skipped + 1):
            gap = (last - 1 + step) % MID_SPACE + 1
            if gap in self.unacked or gap in self._acked:
                continue
            if gap not in self._awaited:
                if not self._awaited:
                    self._heap.clear()
                    self._anchor = self._frontier or 0
                self._awaited[gap] = 0
                heapq.heappush(self._heap, (self._key(gap), gap))
                self.dropped_seen += 1
            if gap not in self._counted:
                self._counted.add(gap)
                self._missed(gap)

    def _missed(self, mid: int) -> None:
        self._missed_now = True
        self._awaited[mid] += 1
        if self._awaited[mid] > GIVE_UP:  # never resent: Mosquitto did not keep it
            del self._awaited[mid]
            self.lost += 1
            self._remember(mid)

    def on_copy(self, mid: int, qos: int, dup: bool, now: float) -> Verdict:
        """One message from Mosquitto (QoS 0 copies carry no id and are always taken)."""
        self._active_at = now
        if qos == 0:
            return Verdict.TAKE
        if dup and mid in self.unacked:
            self._last = mid
            return Verdict.SKIP
        if dup and mid in self._acked:
            self._last = mid
            return Verdict.REACK
        self._see(mid)
        oldest = self._oldest_awaited()
        if oldest is not None and oldest != mid and self._key(oldest) < self._key(mid):
            return Verdict.HOLD  # it comes again, after the dropped one
        self._awaited.pop(mid, None)
        self.unacked.add(mid)
        self._frontier = mid
        return Verdict.TAKE

    def on_probe(self, mid: int) -> None:
        """A probe arrived (it is acknowledged at once)."""
        self._probe_out = False
        self._see(mid)
        self._awaited.pop(mid, None)
        self._remember(mid)

    def on_ack(self, mid: int) -> None:
        self.unacked.discard(mid)
        self._remember(mid)

    def _remember(self, mid: int) -> None:
        if mid not in self._acked:
            self._acked.add(mid)
            self._acked_order.append(mid)
            if len(self._acked_order) > RECENT_ACKS:
                self._acked.discard(self._acked_order.popleft())

    def should_recover(self, now: float) -> bool:
        """True (once per interval) when a copy was missed on this connection: reconnect now
        (while a resend is still coming, wait for it)."""
        if not self._missed_now or now - self._last_recovery < RECOVERY_INTERVAL:
            return False
        self._missed_now = False
        self._last_recovery = now
        self.recoveries += 1
        return True

    def should_probe(self, now: float) -> bool:
        """True (once) when a probe is due: quiet after a burst or while copies are missing,
        or the last one unanswered."""
        if self._probe_out:  # unanswered: Mosquitto sends us nothing, a reconnect unblocks it
            due = now - self._probed_at >= PROBE_TIMEOUT
            self._missed_now = self._missed_now or due
        else:  # after a burst; and again while copies are missing, until resent or given up
            wanted = self._active_at > self._probed_at or bool(self._awaited)
            due = wanted and now - max(self._active_at, self._probed_at) >= PROBE_AFTER_QUIET
        if due:
            self._probed_at = now
            self._probe_out = True
        return due
