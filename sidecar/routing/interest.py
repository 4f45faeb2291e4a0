"""Interest between nodes: what each peer wants, and what this sidecar subscribes to locally.

`LocalInterest` (sidecar.routing.local_interest, re-exported here) turns this node's
`InterestAdded`/`InterestRemoved` changes into a versioned snapshot and deltas for peers.
`RemoteInterest` holds every peer's interest,
derives the sidecar's local forwarding subscriptions from it and decides, per copy of a message
Mosquitto hands the sidecar, whether and where to forward it. Sans-IO: plain values in, actions out.

Local forwarding subscriptions (architecture §3.2, §3.6): the union over peers of the filters as the
peers' clients subscribed them — ``f`` for plain interest, ``$share/g/f`` for shared interest (the
sidecar joins each group itself, so Mosquitto's local pick within the group includes "some other
node"). Each union filter is refcounted over peers and carries an MQTT subscription identifier:
its own for a wildcard or shared filter; literal plain filters added together share one (up to
`LITERAL_GROUP` of them), so the forwarding client subscribes them with one SUBSCRIBE packet. No
topic matches two literal filters, so a copy's identifier still names exactly one filter.

Every change costs O(changed keys): the union, the trie and the persistence journal
(`take_journal`, written by an adapter as rows) are updated per key, never rebuilt. Only
wildcard filters are in the trie: a literal one matches one topic, itself, found in the union
map by the topic (a joining node's 100,000 literal filters cost no trie nodes).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

from sidecar.routing.local_interest import InterestDelta, InterestSnapshot, LocalInterest
from sidecar.routing.shared import RoundRobin
from sidecar.routing.table import InterestKey
from sidecar.topics import (
    MAX_SUBSCRIPTION_ID,
    SHARE_PREFIX,
    TopicError,
    TopicTrie,
    all_literal,
    matches,
    parse_filter,
)

__all__ = [
    "JOURNAL_ADD",
    "JOURNAL_FREE",
    "JOURNAL_REMOVE",
    "LEAVE_STEP",
    "LITERAL_GROUP",
    "MAX_SUBSCRIPTION_ID",
    "ForwardDecision",
    "InterestAction",
    "InterestDelta",
    "InterestSnapshot",
    "JournalOp",
    "LocalInterest",
    "LocalSubscribe",
    "LocalUnsubscribe",
    "RemoteInterest",
    "RequestSnapshot",
    "SharedDelivery",
]

RETIRED_SHARED = 4096
"""Given-up shared subscription ids remembered for copies still on their way (`_retired`)."""

LITERAL_GROUP = 256
"""Most literal (wildcard-free, plain) filters sharing one subscription identifier."""

JOURNAL_ADD = "+"
"""Journal op ``(JOURNAL_ADD, peer, verbatim, sid)``: the peer holds the filter, its id is sid."""
JOURNAL_REMOVE = "-"
"""Journal op ``(JOURNAL_REMOVE, peer, verbatim, 0)``: the peer no longer holds the filter."""
JOURNAL_FREE = "x"
"""Journal op ``(JOURNAL_FREE, "", verbatim, sid)``: no peer holds it, its id is released."""

JournalOp = tuple[str, str, str, int]


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


# ---- every peer's interest -----------------------------------------------------------------------


@dataclass(slots=True)
class _Peer:
    version: int | None = None  # None: no snapshot yet
    keys: set[InterestKey] = field(default_factory=set)
    awaiting_snapshot: bool = False
    chunks: set[InterestKey] | None = None  # a chunked snapshot being collected
    chunks_version: int = 0
    next_chunk: int = 0


_NO_PEERS: frozenset[str] = frozenset()

LEAVE_STEP = 5000
"""Keys of a peer that left the membership dropped per step (`remove_peer`,
`continue_removals`)."""

PEER_SETS = 4096
"""Peer-set transitions remembered (`_PeerSets`); beyond, the memo starts afresh."""


@dataclass(eq=False, slots=True)
class _Union:
    """One local forwarding subscription (hashed by identity: the trie holds these). Its
    `peers` is a frozenset shared with every other filter held by the same peers."""

    verbatim: str
    key: InterestKey
    sid: int
    peers: frozenset[str] = _NO_PEERS


class _PeerSets:
    """Interned peer sets: a filter's holders are one of few sets (with 3 peers at most 7), so
    100,000 filters share them instead of holding a set each (216 bytes per filter). Adding or
    removing a peer is a memo lookup, O(1)."""

    def __init__(self) -> None:
        self._sets: dict[frozenset[str], frozenset[str]] = {}
        self._moves: dict[tuple[frozenset[str], str, bool], frozenset[str]] = {}

    def with_(self, peers: frozenset[str], peer: str) -> frozenset[str]:
        """`peers` and `peer`."""
        return self._move(peers, peer, True)

    def without(self, peers: frozenset[str], peer: str) -> frozenset[str]:
        """`peers` less `peer`."""
        return self._move(peers, peer, False)

    def _move(self, peers: frozenset[str], peer: str, add: bool) -> frozenset[str]:
        move = (peers, peer, add)
        found = self._moves.get(move)
        if found is not None:
            return found
        made = peers | {peer} if add else peers - {peer}
        if len(self._moves) >= PEER_SETS:
            self._moves.clear()
            self._sets.clear()
        made = self._sets.setdefault(made, made)
        self._moves[move] = made
        return made


def _literal(key: InterestKey) -> bool:
    """A plain filter without wildcards: it matches exactly one topic, itself."""
    return key.group is None and "+" not in key.filter and "#" not in key.filter


class RemoteInterest:
    """Every peer's interest, the local forwarding subscriptions, and the forwarding decision.

    Interest per peer: `apply_snapshot` replaces it (a chunked one with its last chunk);
    `apply_delta` applies it only if its `from_version` is the peer's current version (and
    `to_version` is greater), otherwise it is ignored and a `RequestSnapshot` is returned (once,
    until the next snapshot). Keys that are not valid MQTT filters are skipped and counted in
    `invalid_keys`. `remove_peer` drops the peer's interest (in steps: `continue_removals`):
    call it when the peer leaves the membership, NOT when its stream drops — while a peer is
    unreachable its interest stays, so QoS ≥ 1 messages for it keep flowing into its queue.

    Subscription identifiers: a new identifier is ``1 + the largest in use`` (so identifiers are
    reused once those above them are released); only past `MAX_SUBSCRIPTION_ID` does allocation
    fall back to the smallest free one. The literal filters one change adds share identifiers,
    `literal_group` at most per identifier; they are allocated before the change's wildcard
    and shared filters, so the (un)subscribe actions come in ascending identifier order. A new
    filter never gets an identifier below one already in use: a copy routed by Mosquitto before
    the new subscription took effect still carries the smallest matching identifier (see
    `forward_targets`), so subscription changes cannot make a message skip forwarding.

    With `journal` set, every change is also recorded as `JournalOp`s for `take_journal` (an
    adapter persists them as rows; `restore` rebuilds from what it loads).

    Shared picks are round robin per (group, filter) over the sorted peers holding it, starting at
    an offset derived from `seed` (give each node a different seed, e.g. a hash of its id).
    """

    def __init__(self, *, seed: int = 0, journal: bool = False,
                 literal_group: int = LITERAL_GROUP) -> None:
        self._peers: dict[str, _Peer] = {}
        self._union: dict[str, _Union] = {}  # verbatim filter -> subscription
        self._singles: dict[int, _Union] = {}  # id -> wildcard or shared subscription
        self._groups: dict[int, int] = {}  # id -> how many literal filters share it
        self._wild: TopicTrie[_Union] = TopicTrie()  # plain union filters with wildcards
        self._shared: dict[InterestKey, tuple[str, ...]] = {}  # sorted peers per shared key
        # ids of shared subscriptions given up (oldest first), until reused or pushed out: a
        # copy Mosquitto picked the forwarding client for just before its UNSUBSCRIBE
        self._retired: dict[int, InterestKey] = {}
        self._peer_sets = _PeerSets()
        self._rr: RoundRobin[str] = RoundRobin(seed)
        self._top_sid = 0
        self._literal_group = max(1, literal_group)
        self._journal: list[JournalOp] | None = [] if journal else None
        self._leaving: dict[str, tuple[_Peer, list[InterestKey]]] = {}  # keys still to drop
        self._gone: frozenset[str] = frozenset()  # the peers in `_leaving`
        self.invalid_keys = 0

    # ---- updates ---------------------------------------------------------------------------

    def apply_snapshot(self, peer: str, snapshot: InterestSnapshot) -> list[InterestAction]:
        """Replace the peer's interest with the snapshot's (whatever its version). A chunked
        snapshot takes effect with its last chunk (its version, the removals, and the keys
        with a subscribe time, which a catch-up follows); a chunk out of order asks for a new
        one. The other keys a chunk adds are subscribed at once: a joining node's 100,000
        filters are then 20 steps of O(chunk), not one step that blocks its loop for seconds
        (the peer holds them in any case: the snapshot is its interest now)."""
        if peer in self._leaving:  # back before its keys were all dropped: drop them first
            return self._drop_leaving(peer, None) + self.apply_snapshot(peer, snapshot)
        state = self._peers.setdefault(peer, _Peer())
        if snapshot.chunk == 0:
            state.chunks, state.chunks_version, state.next_chunk = None, snapshot.version, 0
        if snapshot.chunk != state.next_chunk or snapshot.version != state.chunks_version:
            state.chunks = None
            state.next_chunk = -1  # until a chunk 0
            if state.awaiting_snapshot:
                return []
            state.awaiting_snapshot = True
            return [RequestSnapshot(peer, state.version, f"snapshot chunk {snapshot.chunk} "
                                                         "out of order")]
        if snapshot.last:
            keys = self._valid(snapshot.keys, into=state.chunks)  # (in place: O(chunk))
        else:
            valid = self._valid(snapshot.keys)
            if state.chunks is None:
                state.chunks = valid
            else:
                state.chunks |= valid
            state.next_chunk += 1
            early = valid - state.keys
            early.difference_update(snapshot.since)
            return self._change(peer, state, early, set()) if early else []
        state.chunks, state.next_chunk = None, 0
        removed = state.keys - keys
        added = keys - state.keys
        state.version = snapshot.version
        state.awaiting_snapshot = False
        return self._change(peer, state, added, removed)

    def apply_delta(self, peer: str, delta: InterestDelta) -> list[InterestAction]:
        """Apply the delta if it follows the peer's current version; else ask for a snapshot.
        Costs O(keys in the delta), whatever the interest held."""
        if peer in self._leaving:
            return self._drop_leaving(peer, None) + self.apply_delta(peer, delta)
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

    def remove_peer(self, peer: str, max_keys: int | None = None) -> list[InterestAction]:
        """Forget the peer and its interest. It stops counting at once (forward decisions and
        shared picks pass it over, `peers()` and `holds` leave it out); its keys are dropped
        (unsubscribed, journaled) `max_keys` at a time, None: all now. Call `continue_removals`
        until `removing` is False for the rest: a peer holding 100,000 keys is then 20 steps,
        not one that blocks the loop for seconds."""
        actions = self._drop_leaving(peer, None)  # (removed again before its keys were gone)
        state = self._peers.pop(peer, None)
        if state is None:
            return actions
        self._leaving[peer] = (state, list(state.keys))
        self._gone = frozenset(self._leaving)
        return actions + self._drop_leaving(peer, max_keys)

    @property
    def removing(self) -> bool:
        """Keys of peers that left are still to be dropped (`continue_removals`)."""
        return bool(self._leaving)

    def continue_removals(self, max_keys: int = LEAVE_STEP) -> list[InterestAction]:
        """Drop up to `max_keys` more keys of the peers that left (O(max_keys))."""
        for peer in self._leaving:
            return self._drop_leaving(peer, max_keys)
        return []

    def take_journal(self) -> list[JournalOp]:
        """The changes recorded since the last call (empty without `journal`)."""
        if not self._journal:
            return []
        ops, self._journal = self._journal, []
        return ops

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
                    if not _literal(key) and sid in self._groups or sid in self._singles:
                        sid = self._allocate()  # never two non-literal filters on one id
                    sub = self._add_union(verbatim, key, sid)
                    self._top_sid = max(self._top_sid, sid)
                sub.peers = self._peer_sets.with_(sub.peers, peer)
                peer_state.keys.add(key)
                if key.group is not None:
                    self._set_shared(key, sub.peers)

    def subscriptions(self) -> list[LocalSubscribe]:
        """Every local forwarding subscription, by identifier: re-issue them all when the
        sidecar's own MQTT session had to be started afresh (CONNACK session present = 0)."""
        subs = sorted(self._union.values(), key=lambda u: (u.sid, u.verbatim))
        return [LocalSubscribe(u.verbatim, u.sid) for u in subs]

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

    def holds(self, peer: str, key: InterestKey) -> bool:
        """Whether the peer holds `key` (O(1))."""
        state = self._peers.get(peer)
        return state is not None and key in state.keys

    def key_count(self, peer: str) -> int:
        """How many keys the peer holds."""
        state = self._peers.get(peer)
        return 0 if state is None else len(state.keys)

    def peers_for(self, topic: str) -> set[str]:
        """Peers with plain (non-shared) interest matching the topic."""
        result: set[str] = set()
        for sub in self._plain_matching(topic):
            result |= sub.peers
        return result - self._gone if self._gone else result

    def shared_peers(self, group: str, filter: str) -> set[str]:
        """Peers with members of ``$share/<group>/<filter>``."""
        return set(self._shared.get(InterestKey(group, filter), ())) - self._gone

    def local_subscriptions(self) -> dict[str, int]:
        """The local forwarding subscriptions: verbatim filter -> subscription identifier."""
        return {verbatim: u.sid for verbatim, u in self._union.items()}

    def subscription_count(self) -> int:
        """How many local forwarding subscriptions there are (O(1))."""
        return len(self._union)

    def captured_targets(self, topic: str) -> ForwardDecision:
        """What to do with a message the plugin captured (issue 25, slice 2: one record per
        message, for the plain forwarding subscriptions; shared picks keep the copies'
        path): every peer with plain interest matching the topic."""
        peers = self._plain_peers(self._plain_matching(topic))
        return ForwardDecision(peers) if peers else _NOTHING

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
          ignored (stale copies from before an unsubscribe), but for a shared subscription
          given up lately: Mosquitto picked the sidecar instead of another member, so the key
          is returned in `unroutable` (a local member takes it); an identifier shared by
          literal filters names the one equal to the topic;
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
        singles = self._singles
        for sid in subscription_ids:
            sub = singles.get(sid)
            if sub is None and sid in self._retired:  # a shared pick as the group went away
                gone = self._retired[sid]
                if matches(gone.filter, topic):
                    unroutable.append(gone)
                continue
            if sub is None:  # an id literal filters share: the one equal to the topic, if any
                if sid in self._groups and (plain_min == 0 or sid < plain_min):
                    literal = self._union.get(topic)
                    if literal is not None and literal.sid == sid and literal.key.group is None:
                        plain_min = sid
                continue
            if not matches(sub.key.filter, topic):
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
            matching = self._plain_matching(topic)
            if plain_min == min(u.sid for u in matching):
                peers = self._plain_peers(matching)
        if not peers and not shared and not unroutable:
            return _NOTHING
        return ForwardDecision(peers, tuple(shared), tuple(unroutable))

    # ---- internals -------------------------------------------------------------------------

    def _plain_peers(self, matching: set[_Union]) -> frozenset[str]:
        """The peers of these plain union filters, but those that left (their keys not all
        dropped yet)."""
        if not matching:
            return frozenset()
        if len(matching) == 1:
            peers = next(iter(matching)).peers  # (shared, immutable)
        else:
            targets: set[str] = set()
            for sub in matching:
                targets |= sub.peers
            peers = frozenset(targets)
        return peers - self._gone if self._gone and peers else peers

    def _plain_matching(self, topic: str) -> set[_Union]:
        """The plain union filters matching `topic`: the wildcard ones from the trie, and the
        literal one equal to the topic (a dict lookup: literal filters are not in the trie)."""
        matching = self._wild.match(topic)
        literal = self._union.get(topic)
        if literal is not None and literal.key.group is None:
            matching.add(literal)
        return matching

    def _drop_leaving(self, peer: str, max_keys: int | None) -> list[InterestAction]:
        """Drop up to `max_keys` (None: all) of the keys left of a peer that left."""
        leaving = self._leaving.get(peer)
        if leaving is None:
            return []
        state, pending = leaving
        count = len(pending) if max_keys is None else max(1, max_keys)
        part = set(pending[-count:])
        del pending[-count:]
        if not pending:
            del self._leaving[peer]
            self._gone = frozenset(self._leaving)
        return self._change(peer, state, set(), part)

    def _valid(self, keys: Iterable[InterestKey],
               into: set[InterestKey] | None = None) -> set[InterestKey]:
        """The keys that are valid filters (added to `into` if given, and it returned). Keys
        that are all plain literal filters (a bulk of device topics) are checked in one pass."""
        result = set() if into is None else into
        if not isinstance(keys, (set, frozenset)):
            keys = list(keys)
        filters = [key.filter for key in keys if key.group is None]
        if len(filters) == len(keys) and all_literal(filters):
            result.update(keys)
            return result
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
        journal = self._journal
        for key in sorted(removed, key=_order):
            state.keys.discard(key)
            verbatim = key.verbatim
            sub = self._union[verbatim]
            sub.peers = self._peer_sets.without(sub.peers, peer)
            if journal is not None:
                journal.append((JOURNAL_REMOVE, peer, verbatim, 0))
            if key.group is not None:
                self._set_shared(key, sub.peers)
            if not sub.peers:
                self._drop_union(sub)
                if journal is not None:
                    journal.append((JOURNAL_FREE, "", verbatim, sub.sid))
                actions.append(LocalUnsubscribe(verbatim, sub.sid))
        new_literal: list[InterestKey] = []
        new_other: list[InterestKey] = []
        state.keys |= added
        union = self._union
        for key in added:
            sub = union.get(key.verbatim)
            if sub is None:
                (new_literal if _literal(key) else new_other).append(key)
                continue
            sub.peers = self._peer_sets.with_(sub.peers, peer)
            if journal is not None:
                journal.append((JOURNAL_ADD, peer, key.verbatim, sub.sid))
            if key.group is not None:
                self._set_shared(key, sub.peers)
        if not new_literal and not new_other:
            return actions
        new_literal.sort(key=_filter_of)  # (all plain: ordered by filter, as `_order`)
        new_other.sort(key=_order)
        alone = self._peer_sets.with_(_NO_PEERS, peer)
        size = self._literal_group
        for start in range(0, len(new_literal), size):  # per identifier, O(1) for the group
            group = new_literal[start:start + size]
            sid = self._allocate()
            self._groups[sid] = len(group)
            for key in group:
                verbatim = key.filter  # (plain: the verbatim filter)
                union[verbatim] = _Union(verbatim, key, sid, alone)
                actions.append(LocalSubscribe(verbatim, sid))
            if journal is not None:
                journal.extend([(JOURNAL_ADD, peer, key.filter, sid) for key in group])
        for key in new_other:
            sid = self._allocate()
            verbatim = key.verbatim
            self._add_union(verbatim, key, sid, alone, False)
            if journal is not None:
                journal.append((JOURNAL_ADD, peer, verbatim, sid))
            if key.group is not None:
                self._set_shared(key, alone)
            actions.append(LocalSubscribe(verbatim, sid))
        return actions

    def _add_union(self, verbatim: str, key: InterestKey, sid: int,
                   peers: frozenset[str] = _NO_PEERS, literal: bool | None = None) -> _Union:
        sub = self._union[verbatim] = _Union(verbatim, key, sid, peers)
        if _literal(key) if literal is None else literal:
            self._groups[sid] = self._groups.get(sid, 0) + 1
            return sub  # (found by the topic in `_union`: no trie node of its own)
        self._singles[sid] = sub
        if key.group is None:
            self._wild.add(verbatim, sub, checked=True)  # (keys are checked on the way in)
        return sub

    def _drop_union(self, sub: _Union) -> None:
        del self._union[sub.verbatim]
        sid = sub.sid
        if _literal(sub.key):
            left = self._groups[sid] - 1
            if left:
                self._groups[sid] = left
            else:
                del self._groups[sid]
        else:
            del self._singles[sid]
            if sub.key.group is None:
                self._wild.remove(sub.verbatim, sub)
            else:
                self._retired[sid] = sub.key
                if len(self._retired) > RETIRED_SHARED:
                    del self._retired[next(iter(self._retired))]
        if sid == self._top_sid:  # amortized O(1): each step passes an id released once
            # (a retired shared id is not handed out again while it is remembered)
            while self._top_sid and not self._in_use(self._top_sid) \
                    and self._top_sid not in self._retired:
                self._top_sid -= 1

    def _in_use(self, sid: int) -> bool:
        return sid in self._singles or sid in self._groups

    def _allocate(self) -> int:
        if self._top_sid < MAX_SUBSCRIPTION_ID:  # (never a retired id: `_drop_union`)
            self._top_sid += 1
            return self._top_sid
        sid = 1
        while self._in_use(sid):
            sid += 1
        self._retired.pop(sid, None)
        return sid

    def _set_shared(self, key: InterestKey, peers: frozenset[str]) -> None:
        if peers:
            self._shared[key] = tuple(sorted(peers))
        else:
            self._shared.pop(key, None)
            self._rr.forget(key)

    def _pick(self, key: InterestKey, down: Collection[str]) -> str | None:
        holders = self._shared.get(key)
        if holders and self._gone:
            holders = tuple(p for p in holders if p not in self._gone)
        if not holders:
            return None
        if down:
            up = tuple(p for p in holders if p not in down)
            holders = up or holders
        return self._rr.pick(key, holders)


def _order(key: InterestKey) -> tuple[str, str]:
    return (key.group or "", key.filter)


_filter_of = attrgetter("filter")
