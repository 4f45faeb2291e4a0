"""`Forwarder`: the origin side of the hot path (sans-IO).

The sidecar's forwarding client receives one copy of a local publish per matching forwarding
subscription. For each copy the forwarder asks `RemoteInterest.forward_targets` what to do,
stamps forwarded messages with an id `(node, incarnation, seq)` and an HLC time, and returns
actions for the adapters. For QoS >= 1 it holds the local acknowledgement (manual PUBACK to
Mosquitto) until every target peer has *settled* the message: acked it, or it sits durably in
that peer's outbound queue, or the queue refused it (counted and logged by the caller). So a
sidecar crash loses nothing (Mosquitto redelivers the unacked copy) and one slow peer never
stalls the others.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field, replace

from sidecar.hlc import HybridClock, Timestamp
from sidecar.message import MessageProperties
from sidecar.routing.catchup import RecentCopies
from sidecar.routing.interest import RemoteInterest
from sidecar.routing.table import InterestKey


@dataclass(slots=True)
class LocalCopy:
    """One message copy delivered to the forwarding client by the local Mosquitto (not
    changed once made; not frozen: a frozen dataclass costs five times as much to make, once
    per message on the hot path)."""

    mid: int
    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: MessageProperties = MessageProperties()
    subscription_ids: tuple[int, ...] = ()
    publisher: str = ""
    """Its publisher's client id where the plugin names it (a captured record); "": unknown."""
    captured: bool = False
    """Captured by the plugin (one record per message, plain subscriptions only: issue 25,
    slice 2), not a copy Mosquitto queued for a forwarding subscription."""
    record: bytes = b""
    """A captured copy's record as the plugin wrote it (a peer's record reuses its bytes)."""


@dataclass(frozen=True)
class CutMarker:
    """In the forwarding connection's copies, in order: the plugin's cut for a moving
    session (`cut:<client>`, docs/architecture.md §5 cut mode): every copy Mosquitto routed
    before the cut is ahead of it, every later one behind."""

    client: str
    connect_ms: int = 0
    """A new copy's: when its client connected here (wall clock ms); 0: the old copy's own,
    or an older plugin's."""

    @staticmethod
    def connect_ms_of(text: bytes) -> int:
        """A connect time as the plugin writes it in a cut (decimal wall clock ms); 0 if
        `text` is not one."""
        return int(text) if text.isdigit() and len(text) <= 15 else 0


@dataclass(slots=True)
class Envelope:
    """A message on its way to a peer (the adapter turns it into `peer.proto`'s Envelope);
    not changed once made (`dataclasses.replace` makes a changed copy)."""

    origin_node: str
    origin_incarnation: int
    origin_seq: int
    hlc: int
    topic: str
    payload: bytes
    qos: int
    retain: bool = False
    properties: MessageProperties = MessageProperties()
    shared_group: str | None = None
    shared_filter: str = ""
    subscription_ids: tuple[int, ...] = ()
    """A session backlog's copy only: the Subscription Identifiers it was queued with."""
    publisher: str = ""
    """The publisher's client id, where the origin knows it ("": unknown): No Local."""
    first_seq: int = 0
    """The seq it first went under (kept when a catch-up renumbers it; 0: a replay): with
    `origin_node`, its identity for a moving session's cut mode."""
    cut_client: str = ""
    """Not a message: this origin's cut for `cut_client`'s move (at its own seq)."""
    record: bytes = b""
    """The captured record it came as, if any (`sidecar.routing.records.with_identity`)."""


@dataclass(frozen=True)
class AckLocal:
    """Acknowledge copy `mid` to the local Mosquitto (manual ack)."""

    mid: int
    qos: int


@dataclass(frozen=True)
class SendEnvelope:
    """QoS 0: send now if the peer's stream is up, else drop (fire and forget)."""

    peer: str
    envelope: Envelope


@dataclass(frozen=True)
class QueueEnvelope:
    """QoS >= 1: append to the peer's outbound queue; settle it with `on_settled`."""

    peer: str
    envelope: Envelope


@dataclass(frozen=True)
class DeliverLocalShared:
    """No peer holds the group (any more): deliver to one LOCAL member of
    ``$share/<shared_group>/<shared_filter>``, then call `on_settled(LOCAL, [seq])`."""

    envelope: Envelope


LOCAL = ""
"""The pseudo-peer a local shared delivery settles as."""

ForwardAction = AckLocal | SendEnvelope | QueueEnvelope | DeliverLocalShared


@dataclass
class _Pending:
    """One local copy whose ack waits for (peer, seq) settlements; a re-routed shared delivery
    adds a seq to the same copy."""

    mid: int
    qos: int
    waiting: set[tuple[str, int]] = field(default_factory=set)
    seqs: list[int] = field(default_factory=list)


class Forwarder:
    """Turns local copies into envelopes and releases local acks once peers settled them."""

    def __init__(self, node_id: str, incarnation: int, interest: RemoteInterest,
                 clock: HybridClock, recent: RecentCopies | None = None) -> None:
        """`recent`: where forwarded copies are kept for catch-up (sidecar.routing.catchup)."""
        self.node_id = node_id
        self.recent = recent
        self.incarnation = incarnation
        self.interest = interest
        self.clock = clock
        self._seq = 0
        self._pending: dict[int, _Pending] = {}  # origin seq -> local copy waiting for peers
        # QoS >= 1 shared deliveries awaiting the peer's ack: (seq, peer) -> envelope, tried
        self._shared: dict[tuple[int, str], tuple[Envelope, set[str]]] = {}
        self.forwarded = 0
        self.skipped = 0
        self.local_shared = 0  # shared picks no peer holds: given to a local member

    @property
    def pending(self) -> int:
        """QoS >= 1 messages whose local ack waits for at least one peer."""
        return len({id(p) for p in self._pending.values()})

    def on_copy(self, copy: LocalCopy, wall_ms: int,
                down: Collection[str] = ()) -> list[ForwardAction]:
        """Decide what to do with one copy; the last action acks it locally when nothing waits.
        A retain=1 copy is a client's retained publish: the retained path (`sidecar.retained`)
        stores it on every node and so delivers it to their plain subscribers; only a shared
        group's delivery (Mosquitto picked this sidecar as the member) goes this way (the
        plugin keeps retained re-injections away from shared subscriptions)."""
        decision = (self.interest.captured_targets(copy.topic) if copy.captured else
                    self.interest.forward_targets(copy.topic, copy.subscription_ids, down=down))
        actions: list[ForwardAction] = []
        local = decision.unroutable  # Mosquitto picked us, no peer holds the group (any more)
        if decision.peers and not copy.retain and self.recent is not None:
            self.recent.add(wall_ms, copy.topic, copy.payload, copy.qos, copy.properties,
                            decision.peers)
        targets = [(peer, None, "") for peer in ([] if copy.retain else sorted(decision.peers))]
        targets += [(s.peer, s.group, s.filter) for s in decision.shared]
        if not targets and not local:
            self.skipped += 1
            actions.append(AckLocal(copy.mid, copy.qos))
            return actions
        self._seq += 1
        self.forwarded += bool(targets)
        seq = self._seq
        hlc = self.clock.now(wall_ms).pack()
        for peer, group, shared_filter in targets:
            env = Envelope(self.node_id, self.incarnation, seq, hlc, copy.topic, copy.payload,
                           copy.qos, copy.retain, copy.properties, group, shared_filter,
                           publisher=copy.publisher, first_seq=seq, record=copy.record)
            actions.append(SendEnvelope(peer, env) if copy.qos == 0 else QueueEnvelope(peer, env))
        for key in local:  # as Mosquitto would have, had it picked a local member
            self.local_shared += 1
            actions.append(DeliverLocalShared(Envelope(
                self.node_id, self.incarnation, seq, hlc, copy.topic, copy.payload, copy.qos,
                copy.retain, copy.properties, key.group, key.filter)))
        if copy.qos == 0:
            actions.append(AckLocal(copy.mid, 0))
        else:
            waiting = {(peer, seq) for peer, _, _ in targets} | ({(LOCAL, seq)} if local else set())
            self._pending[seq] = _Pending(copy.mid, copy.qos, waiting, [seq])
            for action in actions:
                if isinstance(action, QueueEnvelope) and action.envelope.shared_group is not None:
                    self._shared[(seq, action.peer)] = (action.envelope, {action.peer})
        return actions

    def replay(self, peer: str, topic: str, payload: bytes, qos: int,
               properties: MessageProperties, wall_ms: int,
               shared: InterestKey | None = None) -> ForwardAction:
        """A catch-up replay for `peer` alone: a new message id, no local ack waits for it; a
        shared delivery (`shared`) is re-routed like any if that peer has no member left."""
        self._seq += 1
        env = Envelope(self.node_id, self.incarnation, self._seq, self.clock.now(wall_ms).pack(),
                       topic, payload, qos, False, properties,
                       shared.group if shared is not None else None,
                       shared.filter if shared is not None else "")
        if qos == 0:
            return SendEnvelope(peer, env)
        if shared is not None:
            self._shared[(env.origin_seq, peer)] = (env, {peer})
        return QueueEnvelope(peer, env)

    def cut(self, client: str, peers: Iterable[str], wall_ms: int, connect_ms: int = 0
            ) -> tuple[int, list[QueueEnvelope]]:
        """A moving session's cut here (docs/architecture.md §5, cut mode): every message
        forwarded so far went under a smaller seq, every later one a larger; each of `peers`
        gets it behind those before. Its HLC is its client's connect here (`connect_ms`,
        when known: a peer applies it only to a copy the client used before), else now."""
        self._seq += 1
        seq = self._seq
        hlc = Timestamp(connect_ms).pack() if connect_ms else self.clock.now(wall_ms).pack()
        return seq, [QueueEnvelope(peer, Envelope(
            self.node_id, self.incarnation, seq, hlc, "", b"", 1, first_seq=seq,
            cut_client=client)) for peer in peers]

    def renumber(self, action: SendEnvelope | QueueEnvelope) -> SendEnvelope | QueueEnvelope:
        """The same action under a new seq (an action held while a catch-up ran: the peer's
        queue takes increasing seqs); the local ack now waits for the new one."""
        peer, env = action.peer, action.envelope
        old = env.origin_seq
        self._seq += 1
        moved = replace(env, origin_seq=self._seq)
        pending = self._pending.get(old)
        if pending is not None and (peer, old) in pending.waiting:
            pending.waiting.discard((peer, old))
            pending.waiting.add((peer, self._seq))
            pending.seqs.append(self._seq)
            self._pending[self._seq] = pending
        entry = self._shared.pop((old, peer), None)
        if entry is not None:
            self._shared[(self._seq, peer)] = (moved, entry[1])
        return type(action)(peer, moved)

    def on_rejected(self, peer: str, seq: int) -> list[ForwardAction]:
        """`peer` will not deliver `seq` (for a shared delivery: it has no member left). A
        shared delivery moves to another peer holding the group (under a new seq, since each
        peer's queue takes increasing seqs), else to a local member; so a member leaving never
        loses a message, also when the copy was already acked locally (settled as durable while
        the peer was away). Anything else just settles."""
        entry = self._shared.pop((seq, peer), None)
        pending = self._pending.get(seq)
        if entry is None:
            return list(self.on_settled(peer, [seq]))
        env, tried = entry
        if pending is not None:
            pending.waiting.discard((peer, seq))
        group = env.shared_group or ""
        others = sorted(self.interest.shared_peers(group, env.shared_filter) - tried)
        if not others:
            if pending is not None:
                pending.waiting.add((LOCAL, seq))
            return [DeliverLocalShared(env)]
        target = others[0]
        self._seq += 1
        moved = replace(env, origin_seq=self._seq)
        if pending is not None:
            pending.seqs.append(self._seq)
            pending.waiting.add((target, self._seq))
            self._pending[self._seq] = pending
        self._shared[(self._seq, target)] = (moved, tried | {target})
        return [QueueEnvelope(target, moved)]

    def on_settled(self, peer: str, seqs: Iterable[int], acked: bool = True) -> list[AckLocal]:
        """`peer` acked these seqs, or (`acked=False`) they sit durably in its queue or were
        dropped; return the local acks now due. A shared delivery stays re-routable until the
        peer really acked it."""
        out: list[AckLocal] = []
        for seq in seqs:
            if acked:
                self._shared.pop((seq, peer), None)
            pending = self._pending.get(seq)
            if pending is None:
                continue
            pending.waiting.discard((peer, seq))
            if not pending.waiting:
                for done in pending.seqs:
                    self._pending.pop(done, None)
                if pending.mid >= 0:
                    out.append(AckLocal(pending.mid, pending.qos))
        return out

    def on_peer_removed(self, peer: str) -> list[AckLocal]:
        """`peer` left the cluster: nothing waits for it any more."""
        for key in [k for k in self._shared if k[1] == peer]:
            del self._shared[key]
        return self.on_settled(peer, self.waiting_for(peer))

    def forget_local_acks(self, mids: range | None = None) -> int:
        """The local session was lost (Mosquitto restarted): pending acks name packet ids of a
        connection that no longer exists and must never be sent on the new one (`mids`: the
        copies' ids of that connection, sidecar.local.shards; None: every one). Peers still
        settle the seqs; nothing is acked locally for them. Returns how many were dropped."""
        dropped = {id(p): p for p in self._pending.values()
                   if p.mid >= 0 and (mids is None or p.mid in mids)}
        for pending in dropped.values():
            pending.mid = -1
        return len(dropped)

    def waiting_for(self, peer: str) -> list[int]:
        """Seqs whose local ack still waits for `peer`, oldest first."""
        return [seq for seq, p in self._pending.items() if (peer, seq) in p.waiting]
