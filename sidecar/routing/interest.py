"""Interest between nodes: what each peer wants, and what this sidecar subscribes to locally.

`LocalInterest` turns this node's `InterestAdded`/`InterestRemoved` changes (from the subscription
table) into a versioned snapshot and deltas for peers. `RemoteInterest` holds every peer's interest,
derives the sidecar's local forwarding subscriptions from it and decides, per copy of a message
Mosquitto hands the sidecar, whether and where to forward it. Sans-IO: plain values in, actions out.

Local forwarding subscriptions (architecture §3.2, §3.6): the union over peers of the filters as the
peers' clients subscribed them — ``f`` for plain interest, ``$share/g/f`` for shared interest (the
sidecar joins each group itself, so Mosquitto's local pick within the group includes "some other
node"). Each union filter is refcounted over peers and carries its own MQTT subscription identifier.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field

from sidecar.routing.shared import RoundRobin
from sidecar.routing.table import InterestAdded, InterestChange, InterestKey, InterestRemoved
from sidecar.topics import SHARE_PREFIX, TopicError, TopicTrie, matches, parse_filter

__all__ = [
    "MAX_SUBSCRIPTION_ID",
    "ForwardDecision",
    "InterestAction",
    "InterestDelta",
    "InterestSnapshot",
    "LocalInterest",
    "LocalSubscribe",
    "LocalUnsubscribe",
    "RemoteInterest",
    "RequestSnapshot",
    "SharedDelivery",
]

MAX_SUBSCRIPTION_ID = 268_435_455
"""Largest MQTT v5 subscription identifier (variable byte integer)."""


# ---- values exchanged with peers (the peering adapter converts to/from protobuf) -----------------


@dataclass(frozen=True)
class InterestSnapshot:
    """A node's whole interest at `version`."""

    version: int
    keys: frozenset[InterestKey]


@dataclass(frozen=True)
class InterestDelta:
    """A node's interest changes from `from_version` to `to_version`."""

    from_version: int
    to_version: int
    added: frozenset[InterestKey] = frozenset()
    removed: frozenset[InterestKey] = frozenset()


# ---- actions ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalSubscribe:
    """Subscribe the sidecar's client to `filter` on the local Mosquitto.

    Options: QoS 2, Retain As Published, subscription identifier `subscription_id`, and No Local
    unless the filter is shared (No Local on a shared subscription is a protocol error, MQTT 5
    §3.8.3.1), see `no_local`.
    """

    filter: str
    subscription_id: int

    @property
    def no_local(self) -> bool:
        return not self.filter.startswith(SHARE_PREFIX)


@dataclass(frozen=True)
class LocalUnsubscribe:
    """Unsubscribe the sidecar's client from `filter` (it held `subscription_id`)."""

    filter: str
    subscription_id: int


@dataclass(frozen=True)
class RequestSnapshot:
    """Ask `peer` for a fresh interest snapshot (send it an InterestRequest frame)."""

    peer: str
    have_version: int | None
    reason: str


InterestAction = LocalSubscribe | LocalUnsubscribe | RequestSnapshot


@dataclass(frozen=True)
class SharedDelivery:
    """Send this copy to `peer` as a shared delivery for ``$share/<group>/<filter>``."""

    peer: str
    group: str
    filter: str


@dataclass(frozen=True)
class ForwardDecision:
    """What to do with one copy of a message received on the sidecar's forwarding subscriptions.

    `peers`: send a plain envelope to each. `shared`: send a shared-delivery envelope (one peer per
    shared subscription this copy came through). `unroutable`: shared subscriptions this copy came
    through for which no peer has members any more (deliver to a local member or count as dropped).
    """

    peers: frozenset[str] = frozenset()
    shared: tuple[SharedDelivery, ...] = ()
    unroutable: tuple[InterestKey, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.peers or self.shared or self.unroutable)


_NOTHING = ForwardDecision()


# ---- this node's interest, versioned -------------------------------------------------------------


class LocalInterest:
    """This node's interest as sent to peers: a key set with a version bumped on every change.

    Send `snapshot()` on every stream (re)connect, then each delta `apply` returns, in order.
    """

    def __init__(self) -> None:
        self.version = 0
        self._keys: set[InterestKey] = set()

    def apply(self, changes: Iterable[InterestChange]) -> InterestDelta | None:
        """Apply table changes; return the delta to broadcast, or None if nothing changed."""
        added: set[InterestKey] = set()
        removed: set[InterestKey] = set()
        for change in changes:
            key = change.key
            if isinstance(change, InterestAdded) and key not in self._keys:
                self._keys.add(key)
                if key in removed:
                    removed.discard(key)
                else:
                    added.add(key)
            elif isinstance(change, InterestRemoved) and key in self._keys:
                self._keys.discard(key)
                if key in added:
                    added.discard(key)
                else:
                    removed.add(key)
        if not added and not removed:
            return None
        delta = InterestDelta(self.version, self.version + 1, frozenset(added), frozenset(removed))
        self.version += 1
        return delta

    def snapshot(self) -> InterestSnapshot:
        """The whole interest at the current version."""
        return InterestSnapshot(self.version, frozenset(self._keys))


# ---- every peer's interest -----------------------------------------------------------------------


@dataclass
class _Peer:
    version: int | None = None  # None: no snapshot yet
    keys: set[InterestKey] = field(default_factory=set)
    awaiting_snapshot: bool = False


@dataclass
class _Union:
    """One local forwarding subscription."""

    verbatim: str
    key: InterestKey
    sid: int
    peers: set[str] = field(default_factory=set)


class RemoteInterest:
    """Every peer's interest, the local forwarding subscriptions, and the forwarding decision.

    Interest per peer: `apply_snapshot` replaces it; `apply_delta` applies it only if its
    `from_version` is the peer's current version (and `to_version` is greater), otherwise it is
    ignored and a `RequestSnapshot` is returned (once, until the next snapshot). Keys that are not
    valid MQTT filters are skipped and counted in `invalid_keys`. `remove_peer` drops the peer's
    interest: call it when the peer leaves the membership, NOT when its stream drops — while a peer
    is unreachable its interest stays, so QoS ≥ 1 messages for it keep flowing into its queue.

    Subscription identifiers: a new union filter gets ``1 + the largest identifier in use`` (so
    identifiers are reused once the filters above them are released); only past
    `MAX_SUBSCRIPTION_ID` does allocation fall back to the smallest free one. A new filter never
    gets an identifier below one already in use: a copy routed by Mosquitto before the new
    subscription took effect still carries the smallest matching identifier (see
    `forward_targets`), so subscription changes cannot make a message skip forwarding.

    Shared picks are round robin per (group, filter) over the sorted peers holding it, starting at
    an offset derived from `seed` (give each node a different seed, e.g. a hash of its id).
    """

    def __init__(self, *, seed: int = 0) -> None:
        self._peers: dict[str, _Peer] = {}
        self._union: dict[str, _Union] = {}  # verbatim filter -> subscription
        self._by_sid: dict[int, _Union] = {}
        self._plain: TopicTrie[int] = TopicTrie()  # plain union filters -> subscription id
        self._shared: dict[InterestKey, tuple[str, ...]] = {}  # sorted peers per shared key
        self._rr: RoundRobin[str] = RoundRobin(seed)
        self._top_sid = 0
        self.invalid_keys = 0

    # ---- updates ---------------------------------------------------------------------------

    def apply_snapshot(self, peer: str, snapshot: InterestSnapshot) -> list[InterestAction]:
        """Replace the peer's interest with the snapshot's (whatever its version)."""
        state = self._peers.setdefault(peer, _Peer())
        keys = self._valid(snapshot.keys)
        removed = state.keys - keys
        added = keys - state.keys
        state.version = snapshot.version
        state.awaiting_snapshot = False
        return self._change(peer, state, added, removed)

    def apply_delta(self, peer: str, delta: InterestDelta) -> list[InterestAction]:
        """Apply the delta if it follows the peer's current version; else ask for a snapshot."""
        state = self._peers.get(peer)
        if state is None or state.version is None:
            reason = "delta before any snapshot"
        elif delta.from_version != state.version:
            reason = f"delta from version {delta.from_version}, have {state.version}"
        elif delta.to_version <= delta.from_version:
            reason = f"delta to version {delta.to_version} does not advance {delta.from_version}"
        else:
            state.version = delta.to_version
            added = self._valid(delta.added) - state.keys
            removed = (delta.removed - delta.added) & state.keys
            return self._change(peer, state, added, removed)
        if state is None:
            state = self._peers[peer] = _Peer()
        if state.awaiting_snapshot:
            return []
        state.awaiting_snapshot = True
        return [RequestSnapshot(peer, state.version, reason)]

    def remove_peer(self, peer: str) -> list[InterestAction]:
        """Forget the peer and its interest."""
        state = self._peers.pop(peer, None)
        if state is None:
            return []
        return self._change(peer, state, set(), set(state.keys))

    def export(self) -> dict[str, dict]:
        """What a restarted sidecar needs to keep routing the copies its MQTT session still
        holds: every peer's interest (verbatim filters) and the subscription identifiers."""
        return {
            "peers": {p: sorted(k.verbatim for k in st.keys) for p, st in self._peers.items()},
            "sids": {verbatim: u.sid for verbatim, u in self._union.items()},
        }

    def restore(self, state: dict[str, dict]) -> None:
        """Rebuild from `export()` output (on an empty instance). Peers start without a version,
        so their next delta asks for a snapshot; the snapshot then reconciles the difference."""
        assert not self._peers and not self._union, "restore() needs a fresh RemoteInterest"
        sids: dict[str, int] = state.get("sids", {})
        for peer, filters in state.get("peers", {}).items():
            peer_state = self._peers[peer] = _Peer()
            for verbatim in filters:
                key = InterestKey.parse(verbatim)
                sub = self._union.get(verbatim)
                if sub is None:
                    sid = sids.get(verbatim) or self._allocate()
                    sub = self._union[verbatim] = self._by_sid[sid] = _Union(verbatim, key, sid)
                    self._top_sid = max(self._top_sid, sid)
                    if key.group is None:
                        self._plain.add(verbatim, sid)
                sub.peers.add(peer)
                peer_state.keys.add(key)
                if key.group is not None:
                    self._set_shared(key, sub.peers)

    def subscriptions(self) -> list[LocalSubscribe]:
        """Every local forwarding subscription, by identifier: re-issue them all when the
        sidecar's own MQTT session had to be started afresh (CONNACK session present = 0)."""
        return [LocalSubscribe(u.verbatim, sid) for sid, u in sorted(self._by_sid.items())]

    # ---- queries ---------------------------------------------------------------------------

    def peers(self) -> set[str]:
        """Peers with interest state (a snapshot or a pending request)."""
        return set(self._peers)

    def version(self, peer: str) -> int | None:
        """The peer's interest version, None before its first snapshot."""
        state = self._peers.get(peer)
        return None if state is None else state.version

    def keys(self, peer: str) -> frozenset[InterestKey]:
        """The peer's interest keys."""
        state = self._peers.get(peer)
        return frozenset() if state is None else frozenset(state.keys)

    def peers_for(self, topic: str) -> set[str]:
        """Peers with plain (non-shared) interest matching the topic."""
        result: set[str] = set()
        for sid in self._plain.match(topic):
            result |= self._by_sid[sid].peers
        return result

    def shared_peers(self, group: str, filter: str) -> set[str]:
        """Peers with members of ``$share/<group>/<filter>``."""
        return set(self._shared.get(InterestKey(group, filter), ()))

    def local_subscriptions(self) -> dict[str, int]:
        """The local forwarding subscriptions: verbatim filter -> subscription identifier."""
        return {verbatim: u.sid for verbatim, u in self._union.items()}

    def forward_targets(
        self, topic: str, subscription_ids: Sequence[int], *, down: Collection[str] = ()
    ) -> ForwardDecision:
        """Decide what to do with ONE copy of a message received on the forwarding subscriptions.

        Call it for every copy Mosquitto delivers to the sidecar's client (Mosquitto sends one
        copy per matching subscription, each with its identifier; a copy with several identifiers
        works too), with the copy's topic and subscription identifiers. Skip retain=1 copies
        (retained messages travel by their own path) and never call it for messages received
        from peers. Rules:

        - identifiers not (or no longer) in use, or whose filter does not match the topic, are
          ignored (stale copies from before an unsubscribe);
        - plain: the copy is forwarded iff its smallest plain identifier is the smallest
          identifier among ALL plain union filters matching the topic, so a message matched by
          several filters is forwarded once; it goes to every peer with plain interest matching
          the topic (`peers_for`);
        - shared (``$share/g/f``): Mosquitto picked the sidecar as the group member, so exactly one
          peer holding (g, f) gets it, round robin; peers in `down` are passed over unless all
          holders are down. No holder left: the key is returned in `unroutable`.
        """
        plain_min = 0
        shared: list[SharedDelivery] = []
        unroutable: list[InterestKey] = []
        by_sid = self._by_sid
        for sid in subscription_ids:
            sub = by_sid.get(sid)
            if sub is None or not matches(sub.key.filter, topic):
                continue
            key = sub.key
            if key.group is None:
                if plain_min == 0 or sid < plain_min:
                    plain_min = sid
                continue
            peer = self._pick(key, down)
            if peer is None:
                unroutable.append(key)
            else:
                shared.append(SharedDelivery(peer, key.group, key.filter))
        peers: frozenset[str] = frozenset()
        if plain_min:
            matching = self._plain.match(topic)
            if plain_min == min(matching):
                targets: set[str] = set()
                for sid in matching:
                    targets |= by_sid[sid].peers
                peers = frozenset(targets)
        if not peers and not shared and not unroutable:
            return _NOTHING
        return ForwardDecision(peers, tuple(shared), tuple(unroutable))

    # ---- internals -------------------------------------------------------------------------

    def _valid(self, keys: Iterable[InterestKey]) -> set[InterestKey]:
        result = set()
        for key in keys:
            try:
                group, inner = parse_filter(key.verbatim)
            except TopicError:
                self.invalid_keys += 1
                continue
            if (group, inner) != (key.group, key.filter):  # e.g. group None, filter "$share/.."
                self.invalid_keys += 1
                continue
            result.add(key)
        return result

    def _change(
        self, peer: str, state: _Peer, added: set[InterestKey], removed: set[InterestKey]
    ) -> list[InterestAction]:
        actions: list[InterestAction] = []
        for key in sorted(removed, key=_order):
            state.keys.discard(key)
            verbatim = key.verbatim
            sub = self._union[verbatim]
            sub.peers.discard(peer)
            if key.group is not None:
                self._set_shared(key, sub.peers)
            if not sub.peers:
                del self._union[verbatim]
                del self._by_sid[sub.sid]
                if key.group is None:
                    self._plain.remove(verbatim, sub.sid)
                if sub.sid == self._top_sid:
                    self._top_sid = max(self._by_sid, default=0)
                actions.append(LocalUnsubscribe(verbatim, sub.sid))
        for key in sorted(added, key=_order):
            state.keys.add(key)
            verbatim = key.verbatim
            sub = self._union.get(verbatim)
            if sub is None:
                sid = self._allocate()
                sub = self._union[verbatim] = self._by_sid[sid] = _Union(verbatim, key, sid)
                if key.group is None:
                    self._plain.add(verbatim, sid)
                actions.append(LocalSubscribe(verbatim, sid))
            sub.peers.add(peer)
            if key.group is not None:
                self._set_shared(key, sub.peers)
        return actions

    def _allocate(self) -> int:
        if self._top_sid < MAX_SUBSCRIPTION_ID:
            self._top_sid += 1
            return self._top_sid
        sid = 1
        while sid in self._by_sid:
            sid += 1
        return sid

    def _set_shared(self, key: InterestKey, peers: set[str]) -> None:
        if peers:
            self._shared[key] = tuple(sorted(peers))
        else:
            self._shared.pop(key, None)
            self._rr.forget(key)

    def _pick(self, key: InterestKey, down: Collection[str]) -> str | None:
        holders = self._shared.get(key)
        if not holders:
            return None
        if down:
            up = tuple(p for p in holders if p not in down)
            holders = up or holders
        return self._rr.pick(key, holders)


def _order(key: InterestKey) -> tuple[str, str]:
    return (key.group or "", key.filter)
