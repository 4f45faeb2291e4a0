"""`QueueRoom`: how many messages the next inject batch may carry (pure; the clock is passed in).

A batch puts a whole frame into its subscribers' queues within one Mosquitto loop iteration,
while a subscriber's PUBACKs, read one per iteration, take one message each off its queue;
past `max_queued_messages` Mosquitto drops silently. So, with the option on, a backlog
draining at `pacing.DRAIN_RATE` overran a subscriber reading slower than that (the one-PUBLISH-
at-a-time path was throttled by the receiving sidecar's own cost per message instead). The
plugin's reply to each batch gives the fullest live subscriber's queue once the batch was
routed (`queued`); batches go only while that queue plus the messages of unanswered batches
stays under LIMIT_SHARE of `max_queued_messages`. Without room and with nothing unanswered, one
message goes every PROBE_AFTER to measure again. A queue that stays at the limit without
shrinking for GIVE_UP_AFTER (a subscriber that does not read) lifts the bound until it is under
the limit again: then that subscriber loses messages as on a single Mosquitto, and the others
are not held up by it for longer. A subscriber that reads, but slower than its topics' traffic,
and holds another subscriber of the same batches back is left out of `queued` by the plugin
itself (deploy/mosquitto-plugin/src/inject.c): it loses what overflows, as on one broker.

Limits: only QoS 1 and 2 queues are measured (QoS 0 has no queue on a live connection); the
measure covers the subscribers of the last batch only, so a batch without a slow subscriber's
topics may open room that its next messages then take (at most the limit once more, which
still fits in `max_queued_messages`).
"""

from __future__ import annotations

LIMIT_SHARE = 0.5
PROBE_AFTER = 0.01
GIVE_UP_AFTER = 5.0


class QueueRoom:
    """Room in the fullest subscriber's queue, as the plugin's inject replies report it."""

    def __init__(self, max_queued: int) -> None:
        """`max_queued`: Mosquitto's `max_queued_messages` (0: unlimited, no bound)."""
        self.limit = int(max(0, max_queued) * LIMIT_SHARE)
        self.in_flight = 0     # messages in batches not answered yet
        self.queued = 0        # the fullest queue at the last measuring reply
        self.lifted = False    # the bound is off (a subscriber that does not read)
        self._stuck_since: float | None = None
        self._lowest = 0

    def room(self) -> float:
        """Messages that may go now (inf: no bound)."""
        if not self.limit or self.lifted:
            return float("inf")
        return self.limit - self.queued - self.in_flight

    def sent(self, n: int) -> None:
        self.in_flight += n

    def answered(self, n: int, queued: int | None, now: float) -> bool:
        """A batch of `n` was answered (`queued`: the reply's measure; None or -1: none).
        True when this lifted the bound (worth a warning)."""
        self.in_flight = max(0, self.in_flight - n)
        if queued is None or queued < 0:
            return False
        self.queued = queued
        if queued < self.limit or not self.limit:
            self._stuck_since = None
            self.lifted = False
            return False
        if self._stuck_since is None or queued < self._lowest:
            self._stuck_since, self._lowest = now, queued   # full, but draining
            return False
        if not self.lifted and now - self._stuck_since >= GIVE_UP_AFTER:
            self.lifted = True
            return True
        return False
