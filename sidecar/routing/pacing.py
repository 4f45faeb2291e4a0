"""`Pacing`: how much of a peer's outbound queue may leave now, and whether a small batch
waits for company (pure; the clock is passed in).

- **Drain budget**: live traffic is unlimited, but a backlog bursts out at DRAIN_RATE (a token
  bucket): the one found when a peer's stream comes back (more than BACKLOG queued), or a
  replay out of Mosquitto (its backlog for the forwarding client above `replay_above`, only
  possible with `overload.backlog_max` raised, or after this sidecar stalled). All at once it
  could overrun a subscriber's queue (`max_queued_messages`) on the receiving node, where
  Mosquitto drops silently. The drain ends when the queue is under BACKLOG / 2 and the replay
  under half its threshold.
- **Linger**: while the origin is behind (Mosquitto holds more than LINGER_BACKLOG copies for
  it), a batch under LINGER_BELOW messages waits up to LINGER for more: each gRPC write costs
  about as much as 10 small messages, and the messages wait anyway. A moderate rate never
  waits.
"""

from __future__ import annotations

from dataclasses import dataclass

BATCH_MESSAGES = 500
BACKLOG = 2000  # queued messages at reconnect above which a peer's backlog drains paced
DRAIN_RATE = 2000.0  # messages/s while a backlog drains
LINGER = 0.0005  # seconds a small batch waits for company while Mosquitto holds a backlog
LINGER_BELOW = 64  # messages: a batch this small may linger
LINGER_BACKLOG = 200  # copies Mosquitto holds for the forwarding client (the plugin's
# estimate) above which the origin is behind
REPLAY_SHARE = 0.8  # of max_queued_messages: a backlog in Mosquitto above it is a replay


@dataclass(frozen=True, slots=True)
class Budget:
    """Messages `peer` may get now (inf: no limit); `replay_started`: a replay drain began now
    (worth a warning: this sidecar stalled)."""

    messages: float
    replay_started: bool = False


class Pacing:
    """Drain budgets and linger deadlines of every peer of one node."""

    def __init__(self, max_queued: int) -> None:
        """`max_queued`: Mosquitto's `max_queued_messages` (0: unlimited, no replay pacing)."""
        self.replay_above = int(REPLAY_SHARE * max(0, max_queued))
        self._drain: dict[str, tuple[float, float]] = {}  # draining peer -> tokens, at
        self._linger_until: dict[str, float] = {}  # peer -> when its lingering batch leaves

    def on_reconnected(self, peer: str, queued: int, now: float) -> None:
        """`peer`'s stream is up again with `queued` messages waiting."""
        if queued > BACKLOG:
            self._drain[peer] = (float(BATCH_MESSAGES), now)

    def forget(self, peer: str) -> None:
        self._drain.pop(peer, None)
        self._linger_until.pop(peer, None)

    def draining(self, peer: str) -> bool:
        return peer in self._drain

    def budget(self, peer: str, queued: int, plugin_backlog: int, now: float) -> Budget:
        """How many queued messages may go to `peer` now (call `spent` after sending)."""
        replay = self.replay_above
        started = False
        if peer not in self._drain:
            if not replay or plugin_backlog <= replay:
                return Budget(float("inf"))
            self._drain[peer] = (DRAIN_RATE / 4, now)
            started = True
        elif queued <= BACKLOG // 2 and (not replay or plugin_backlog <= replay // 2):
            del self._drain[peer]
            return Budget(float("inf"))
        tokens, at = self._drain[peer]
        tokens = min(tokens + (now - at) * DRAIN_RATE, DRAIN_RATE / 4)
        self._drain[peer] = (tokens, now)
        return Budget(tokens, started)

    def spent(self, peer: str, left: float, now: float) -> None:
        """What is left of `peer`'s budget after a send."""
        if peer in self._drain:
            self._drain[peer] = (left, now)

    def linger(self, peer: str, unsent: int, plugin_backlog: int,
               now: float) -> tuple[float, bool] | None:
        """Whether `peer`'s next batch (`unsent` messages) waits: None to send now, else (when
        it leaves at the latest, whether that wait starts now: then the caller arms a timer)."""
        if plugin_backlog <= LINGER_BACKLOG or unsent >= LINGER_BELOW:
            self._linger_until.pop(peer, None)
            return None
        until = self._linger_until.get(peer)
        if until is None:
            until = self._linger_until[peer] = now + LINGER
            return until, True
        if now < until:
            return until, False
        del self._linger_until[peer]
        return None
