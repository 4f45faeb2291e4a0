"""`Receiver`: the receiving side of cross-node routing (pure; the clock is passed in).

Envelopes from a peer are deduplicated by message id, then either re-injected on the local
Mosquitto or (a shared-subscription pick) delivered to one local member of the group. A QoS
> 0 message is acknowledged to its origin once Mosquitto accepted the re-injection, once the
member got it (or `ACK_REJECTED` when no member could take it: the origin picks again), or at
once for a duplicate. Acks to one peer linger ACK_LINGER for company (one gRPC write per
message otherwise costs the receiver a write and the origin a read); ACK_BATCH waiting acks
leave at once. Acks only release the origin's hold on its Mosquitto, never a delivery.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sidecar.hlc import MessageId
from sidecar.peering.dedup import Deduplicator
from sidecar.routing.forwarder import Envelope
from sidecar.routing.records import WireRecord
from sidecar.routing.shared import RoundRobin

ACK_OK, ACK_QUEUED, ACK_REJECTED = 1, 2, 3
ACK_LINGER = 0.005  # seconds an ack to a peer waits for company
ACK_BATCH = 256  # acks to one peer that leave at once without waiting

Ack = tuple[int, int, int]  # origin incarnation, origin seq, status


@dataclass(frozen=True, slots=True)
class Reinject:
    """Publish `envelope` on the local Mosquitto; report it with `on_reinjecting`."""

    peer: str
    envelope: Envelope


@dataclass(frozen=True, slots=True)
class DeliverShared:
    """Deliver `envelope` to local member `client` of its shared group; report the outcome
    with `on_shared_result`. `client` None: no local member holds it."""

    peer: str
    envelope: Envelope
    client: str | None


@dataclass(frozen=True, slots=True)
class SendAcks:
    """Send these acks to their peers now (one frame per peer)."""

    acks: dict[str, list[Ack]]


Action = Reinject | DeliverShared | SendAcks


@dataclass
class Receiver:
    """Deduplication, re-injection bookkeeping and ack batching for one node."""

    dedup: Deduplicator = field(default_factory=Deduplicator)
    members: RoundRobin[str] = field(default_factory=RoundRobin)
    counters: dict[str, int] = field(default_factory=lambda: {
        "received": 0, "duplicates": 0, "reinjected": 0, "shared_delivered": 0,
        "shared_repicked": 0, "shared_dropped": 0, "invalid": 0})
    ack_due: float | None = None
    """When the lingering acks must leave (None: none wait); call `on_timer` then."""
    _acks: dict[str, list[Ack]] = field(default_factory=dict)
    _reinjecting: dict[int, tuple[str, int, int]] = field(default_factory=dict)

    # ---- envelopes in --------------------------------------------------------------------
    def accept(self, peer: str, mid: MessageId, qos: int, now: float) -> tuple[bool, list[Action]]:
        """First sight of `mid`? A duplicate is acknowledged again (its first ack may be
        lost) and goes no further."""
        self.counters["received"] += 1
        if self.dedup.accept(mid):
            return True, []
        self.counters["duplicates"] += 1
        return False, (self._ack(peer, mid.origin_incarnation, mid.origin_seq, ACK_OK, now)
                       if qos else [])

    def route(self, peer: str, env: Envelope, members: list[str]) -> Action:
        """Where an accepted envelope goes: a shared pick to one of `members` (the local
        holders of its group, online ones first), anything else to Mosquitto."""
        if env.shared_group is None:
            self.counters["reinjected"] += 1
            return Reinject(peer, env)
        return DeliverShared(peer, env, self.pick_member(env, members))

    def refuse(self, peer: str, env: Envelope | WireRecord, now: float) -> list[Action]:
        """An accepted envelope that cannot be published here (`sidecar.message.
        publish_problem`): it goes no further, and its origin is told not to resend it."""
        self.counters["invalid"] += 1
        if not env.qos:
            return []
        return self._ack(peer, env.origin_incarnation, env.origin_seq, ACK_REJECTED, now)

    def settled(self, peer: str, env: Envelope, now: float) -> list[Action]:
        """An accepted envelope with nothing to do here (a cut for a copy this node does not
        have): its origin is told it arrived."""
        return self._ack(peer, env.origin_incarnation, env.origin_seq, ACK_OK, now) \
            if env.qos else []

    def pick_member(self, env: Envelope, members: list[str]) -> str | None:
        """One local member of the envelope's shared group, round robin."""
        return self.members.pick((env.shared_group, env.shared_filter), members)

    def on_reinjecting(self, ticket: int, peer: str, env: Envelope | WireRecord) -> None:
        """`Reinject` (or a peer's record) was published as `ticket` (QoS > 0: its confirmation
        acks the origin)."""
        if env.qos:
            self._reinjecting[ticket] = (peer, env.origin_incarnation, env.origin_seq)

    def retarget(self, old: int, new: int) -> None:
        """Re-injection `old` goes again as `new` (a batch the plugin did not take)."""
        entry = self._reinjecting.pop(old, None)
        if entry is not None:
            self._reinjecting[new] = entry

    def on_confirmed(self, tickets: list[int], now: float) -> list[Action]:
        """Mosquitto accepted these re-injections."""
        out: list[Action] = []
        for ticket in tickets:
            entry = self._reinjecting.pop(ticket, None)
            if entry is not None:
                out += self._ack(entry[0], entry[1], entry[2], ACK_OK, now)
        return out

    def on_shared_result(self, peer: str, env: Envelope, delivered: bool,
                         now: float) -> list[Action]:
        """A shared delivery's outcome: the origin is told (rejected: it picks again).

        A rejected QoS 0 copy is not acknowledged, so nobody picks again: it is dropped."""
        if delivered:
            self.counters["shared_delivered"] += 1
        else:
            self.counters["shared_repicked" if env.qos else "shared_dropped"] += 1
        if not env.qos:
            return []
        return self._ack(peer, env.origin_incarnation, env.origin_seq,
                         ACK_OK if delivered else ACK_REJECTED, now)

    # ---- acks out ------------------------------------------------------------------------
    def on_timer(self, now: float) -> list[Action]:
        """The linger ran out: every waiting ack leaves."""
        if self.ack_due is None or now < self.ack_due:
            return []
        return self._flush()

    def on_inbound_down(self, peer: str) -> None:
        """`peer`'s stream to us dropped: its unsent acks go (it re-sends those messages)."""
        self._acks.pop(peer, None)

    def _ack(self, peer: str, inc: int, seq: int, status: int, now: float) -> list[Action]:
        acks = self._acks.setdefault(peer, [])
        acks.append((inc, seq, status))
        if len(acks) >= ACK_BATCH:
            return self._flush()
        if self.ack_due is None:
            self.ack_due = now + ACK_LINGER
        return []

    def _flush(self) -> list[Action]:
        self.ack_due = None
        acks = {peer: batch for peer, batch in self._acks.items() if batch}
        self._acks.clear()
        return [SendAcks(acks)] if acks else []
