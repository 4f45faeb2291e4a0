"""`SessionRegistry`: the cluster's sessions as one node sees them, and what that node must do
about them (sans-IO core).

Fed the local plugin's client events and the records peers replicate; returns actions for the
adapter (`sidecar.sessions.service`): publish a record, kick a connection, keep a client id off
the local Mosquitto until its session is made here, make that session (a shadow), hand a
session's queued messages to its new owner (drain), or delete a session here (discard).

What the local Mosquitto holds for each client id (its *presence*) decides the actions:
- `online`: the client is connected here. A newer connect elsewhere kicks it (cluster-wide
  takeover; the will is sent exactly when one broker would send it).
- `session`: an offline session here (the client's own, or a shadow made for it). When the
  client connects elsewhere, its queued messages go there (drain) and the session is deleted;
  when it starts clean elsewhere, or its session ends, the session here is deleted (discard).
- `shadow`: the sidecar is connected as the client (making or draining its session).
- absent: while the cluster holds a resumable session owned elsewhere, a connect here that
  would resume it is closed without a CONNACK (`Deny`); the sidecar then makes the session
  here (`Materialize`) and admits the client, whose reconnect resumes it (session present).

Replicas (`replicas` nodes hold a persistent session's queue: its owner and the first others
by rendezvous hash over the nodes up): a replica is a copy of the session here, made by a
shadow, held with a ring (`Hold(ring=True)`: it queues nothing, but the plugin keeps what it
refused for a while). It queues while its client is offline, or once its owner has been down
for `grace_ms`: released with a replay of what it refused since the client went offline (or
the owner went down) minus `margin_ms`. A replica whose client comes back to its owner is
deleted and made again (held): what it queued was delivered there. When the owner is dead,
a connect on a replica resumes that copy (promotion), and a connect elsewhere gets the first
replica's queue (a drain, as from an old owner).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from sidecar.hlc import HybridClock, Timestamp
from sidecar.local.protocol import SIDECAR_USERNAME as SHADOW_USERNAME
from sidecar.rendezvous import ranked
from sidecar.sessions.claims import Claims, OwnClaim
from sidecar.sessions.record import (
    NO_LOCAL,
    RETAIN_AS_PUBLISHED,
    SessionRecord,
    Subscription,
    newer,
    replica_subscriptions,
    shared_subscriptions,
)

TOMBSTONE_KEEP_MS = 3_600_000
RETRY_MS = 1_000
DOWN_GRACE_MS = 1_000
REPLAY_MARGIN_MS = 1_000
NEVER_UP = ""  # in `dead` once start + grace has passed (owners never seen up count as dead
# from then on): the change settles every record
RESTART_LOOKBACK_MS = 5_000  # a session lost online: its replica replays this far back
DEATH_LOOKBACK_MS = 5_000  # a client online on a dead owner: its replica replays this far back
SWEEP_MS = 5_000  # how often copies here past their session's expiry are looked for
LIVE_HOLD_MS = 5_000  # a moved client's live hold waits this long for the old queue
ARRIVALS_KEEP_MS = 5_000  # how long a peer's record's arrival here is kept (a local connect
# event lags its accept by far less)
MOVE_SETTLE_WAIT_MS = 1_500  # a connect elsewhere waits at most this long after a move's
# connect for its hand-over to settle (the client retries meanwhile: denied)


@dataclass(frozen=True, slots=True)
class Publish:
    """Store `record` and send it to every peer."""

    record: SessionRecord


@dataclass(frozen=True, slots=True)
class Kick:
    """Close the client's connection here (a newer connect elsewhere took it over)."""

    client: str
    with_will: bool


@dataclass(frozen=True, slots=True)
class Deny:
    """Close connects of `client` that would resume a session, without a CONNACK."""

    client: str


@dataclass(frozen=True, slots=True)
class Admit:
    """Let `client` connect here again."""

    client: str


@dataclass(frozen=True, slots=True)
class Hold:
    """`on`: the offline session of `client` here queues nothing more (its client is served
    elsewhere now; `ring`: a replica, which keeps what it refuses for a while; `live`: a
    session its client moves to, whose old node will hand its queue over: once the client
    connected here, what reaches it is kept until the hold goes off, after that queue);
    off: it may again (`since_ms`: first replaying what a ring refused since then)."""

    client: str
    on: bool
    ring: bool = False
    since_ms: int | None = None
    live: bool = False
    source: str = ""
    """A live hold: the node the client comes from (which hands its queue over)."""


@dataclass(frozen=True, slots=True)
class Materialize:
    """Make `record`'s session here (a shadow connection with its subscriptions); report with
    `on_materialized`. `replica`: a copy for the owner's sake, not for a client coming here."""

    record: SessionRecord
    replica: bool = False


@dataclass(frozen=True, slots=True)
class Resubscribe:
    """Bring the copy of `client` here in line: a replica with its client's subscriptions, a
    replica that became the session with its shared ones; make `add`
    (`SessionRecord.subscriptions` values), end `remove`; report with `on_materialized`."""

    client: str
    add: dict[str, int]
    remove: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Drain:
    """Once every peer confirms that what it routed here so far is in (a barrier), hold the
    session of `client` here (it queues nothing more), take the messages it queued (ending its
    `subscriptions` here), hand them to `owner`, then delete the session here; report with
    `on_drained`. `handed_off`: `owner` has the session from this node's hand-off, so its
    copy queues only from that record on: the barrier asks `owner` first, the others after
    (what they route after their barrier then finds that copy queueing)."""

    client: str
    owner: str
    subscriptions: tuple[str, ...] = ()
    handed_off: bool = False


@dataclass(frozen=True, slots=True)
class Discard:
    """Delete the session of `client` here (without delivering what it queued); report with
    `on_discarded`. `urgent`: its client is waiting (it connects here next)."""

    client: str
    urgent: bool = False


@dataclass(frozen=True, slots=True)
class Forget:
    """These tombstones are old enough to drop from the store."""

    clients: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Claim:
    """Send this node's claim of `client` (`hlc`) to `peers`, or, `withdrawn`, tell them it
    is given up (`sidecar.sessions.claims`)."""

    client: str
    hlc: int
    peers: tuple[str, ...]
    withdrawn: bool = False
    renews: str = ""
    """Not this node's claim: the claim `hlc` of node `renews`, which kept the client out
    here when it tried (it goes on from now)."""


@dataclass(frozen=True, slots=True)
class Claimed:
    """Answer `peer`'s claim of `client` (`hlc`), after the records this node has for it."""

    client: str
    peer: str
    hlc: int
    granted: bool


Action = (Publish | Kick | Deny | Admit | Hold | Materialize | Resubscribe | Drain | Discard
          | Forget | Claim | Claimed)


@dataclass
class SessionRegistry:
    """Every client id's record, and this node's presence for each."""

    node_id: str
    clock: HybridClock = field(default_factory=HybridClock)
    records: dict[str, SessionRecord] = field(default_factory=dict)
    presence: dict[str, str] = field(default_factory=dict)  # client -> online|session|shadow
    # client -> (connect HLC of the record the local session belongs to, whether the client
    # itself used it here: a drain hands over only such a session; an unused shadow is deleted)
    held: dict[str, tuple[int, bool]] = field(default_factory=dict)
    denied: set[str] = field(default_factory=set)
    holding: set[str] = field(default_factory=set)
    busy: dict[str, str] = field(default_factory=dict)  # client -> operation in progress
    failed: dict[str, int] = field(default_factory=dict)  # client -> when to try again (ms)
    replicas: int = 1  # nodes holding a persistent session's queue, its owner included; 0: all
    grace_ms: int = DOWN_GRACE_MS
    margin_ms: int = REPLAY_MARGIN_MS
    started_ms: int = 0  # a peer never seen up counts as down since then
    up: set[str] = field(default_factory=set)  # peers whose streams are up
    down_since: dict[str, int] = field(default_factory=dict)
    dead: set[str] = field(default_factory=set)  # peers down for grace_ms, as last settled
    # replicas here: client -> (the owner whose session it copies, the subscriptions made)
    replica: dict[str, tuple[str, frozenset[tuple[str, int]]]] = field(default_factory=dict)
    queueing: set[str] = field(default_factory=set)  # replicas released (they queue)
    # replicas being made or changed: client -> (owner, connect HLC, subscriptions) applied
    applying: dict[str, tuple[str, int, frozenset[tuple[str, int]]]] = field(
        default_factory=dict)
    arriving: set[str] = field(default_factory=set)  # clients that tried to connect here
    # replicas that became the session here (promoted, adopted), still without the shared
    # subscriptions a replica does not make (`record.replica_subscriptions`)
    unshared: set[str] = field(default_factory=set)
    # lost here and given to a replica: client -> the connect HLC of the record handed off
    handed_off: dict[str, int] = field(default_factory=dict)
    next_sweep_ms: int = 0  # when on_tick next looks for expired copies here
    # peers that mark the last frame of a hand-over (capability `session-order`; the adapter)
    ordered: set[str] = field(default_factory=set)
    # clients held live here (their old node's queue is on its way), and for those whose
    # client connected: until when the hold waits for it (ms)
    live_held: set[str] = field(default_factory=set)
    awaiting: dict[str, int] = field(default_factory=dict)
    # clients kept out here while their owner settles a move: client -> until when (ms)
    settle_waits: dict[str, int] = field(default_factory=dict)
    # nodes that hold no replicas and take no session handed off: draining ones, and peers
    # of a version without replicas (set by the adapter; `set_unavailable`)
    unavailable: frozenset[str] = frozenset()
    # who admits a client whose session is owned elsewhere (claims.py); peers that take
    # claims (capability `session-claims`; the adapter)
    claims: Claims = field(init=False)
    claimers: set[str] = field(default_factory=set)
    # client -> (ms, the connect HLC held before) of each peer's record of it stored here
    # lately: a local connect is ordered after what this node knew when Mosquitto accepted
    # it, not when this loop got to its event (a peer's later connect may come in between)
    arrivals: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=lambda: {
        "moves": 0, "takeovers": 0, "materialized": 0, "drained": 0, "discarded": 0,
        "failures": 0, "clock_drift": 0, "replicated": 0, "promoted": 0,
        "handed_off": 0, "lost_handed_to_replica": 0, "adopted": 0, "ordered_moves": 0,
        "order_timeouts": 0, "order_moved_on": 0, "order_chained": 0,
        "settle_waited": 0, "settle_waits_expired": 0, "claims": 0, "claims_won": 0,
        "claims_lost": 0, "claims_lapsed": 0, "claims_granted": 0, "claims_refused": 0})

    def __post_init__(self) -> None:
        self.claims = Claims(self.node_id)

    # ---- local events (the plugin) -------------------------------------------------------
    def on_connect(self, client: str, username: str | None, protocol: str, clean_start: bool,
                   expiry: int | None, session_present: bool, now_ms: int,
                   at_ms: int | None = None) -> list[Action]:
        """`at_ms`: when Mosquitto accepted it (the plugin's time; `now_ms` is when this loop
        got to it): its place among the client's connects elsewhere. Stamped when it was
        processed, a connect on a busy node came after a newer connect on another node, and
        that node kicked its own, newer connection (CI once)."""
        if username == SHADOW_USERNAME:
            self.presence[client] = "shadow"
            return []
        self.presence[client] = "online"
        self._unreplicate(client)
        self.arriving.discard(client)
        claim = self.claims.own.get(client)
        self.claims.used(client)
        old = self.records.get(client)
        at = min(at_ms or now_ms, now_ms)
        hlc = max(Timestamp(at, 0).pack(), self._known_at(client, old, at) + 1,
                  claim.hlc + 1 if claim is not None else 0)
        self.clock.observe(hlc, now_ms)  # (this node's later times follow it)
        if old is not None and old.owner != self.node_id and old.client_connect > hlc:
            # a connect elsewhere accepted after this one, whose record came here first:
            # this connection is taken over already (as in `on_remote`; its Disconnect
            # follows), and its session, if kept, goes to the newer connect's node
            self.counters["takeovers"] += 1
            self.held[client] = (hlc, True)
            kept = expiry is None or expiry > 0
            return [Kick(client, with_will=not kept or old.fresh)]
        fresh = clean_start or not session_present
        subs = dict(old.subscriptions) if old and not fresh and not old.deleted else {}
        self.settle_waits.pop(client, None)
        moving = client in self.live_held and not fresh
        record = SessionRecord(client, self.node_id, hlc, hlc, protocol, expiry, fresh,
                               True, now_ms, False, subs,
                               settles_by_ms=now_ms + MOVE_SETTLE_WAIT_MS if moving else 0)
        self.held[client] = (hlc, True)
        if old is not None and old.owner != self.node_id and session_present:
            self.counters["moves"] += 1
        if moving:
            # its old node hands the queue over next: what reaches it here waits until then
            self.awaiting[client] = now_ms + LIVE_HOLD_MS
            release: list[Action] = []
        else:
            release = self._release(client)
        return release + self._store(record) + self._settle(client, now_ms)

    def on_subscribe(self, client: str, filter: str, qos: int, now_ms: int,
                     options: int | None = None,
                     subscription_id: int | None = None) -> list[Action]:
        """A subscription (again); `options` (the MQTT options byte) and `subscription_id` as
        the plugin read them from Mosquitto (None: not known, taken as the defaults)."""
        value = Subscription(qos, bool((options or 0) & NO_LOCAL),
                             bool((options or 0) & RETAIN_AS_PUBLISHED),
                             subscription_id or 0).pack()
        return self._change_subs(client, filter, value, now_ms)

    def on_unsubscribe(self, client: str, filter: str, now_ms: int) -> list[Action]:
        return self._change_subs(client, filter, None, now_ms)

    def on_disconnect(self, client: str, taken_over: bool, session_kept: bool,
                      expiry: int | None, now_ms: int, at_ms: int | None = None
                      ) -> list[Action]:
        """`at_ms`: when Mosquitto saw it (the plugin's time; `now_ms` is when this loop got
        to it): the record's offline time, from which replicas replay."""
        if taken_over:
            return []  # the newer connection's connect follows
        was = self._forget(client)
        if session_kept:
            self.presence[client] = "session"
            self.held[client] = was[1]
        record = self._owned(client)
        out: list[Action] = []
        if was[0] == "online" and record is not None and record.online:
            out = self._store(replace(record, online=False, since_ms=min(at_ms or now_ms,
                                                                         now_ms), expiry=expiry,
                                      deleted=not session_kept,
                                      change_hlc=self.clock.now(now_ms).pack()))
        return out + self._settle(client, now_ms)

    def on_session_expired(self, client: str, now_ms: int) -> list[Action]:
        self._forget(client)
        self._unreplicate(client)
        record = self._owned(client)
        out: list[Action] = []
        if record is not None and not record.deleted and not record.online:
            out = self._store(replace(record, deleted=True,
                                      change_hlc=self.clock.now(now_ms).pack()))
        return out + self._settle(client, now_ms)

    def on_connect_rejected(self, client: str | None, reason: str,
                            now_ms: int) -> list[Action]:
        """A connect closed by the deny list: make the session here and claim the client
        from the peers, then admit it."""
        if client is None or reason != "denied":
            return []
        record = self.records.get(client)
        if record is None or not self._resumable(record, now_ms) or record.owner == self.node_id:
            return []  # (its owner renews no claim: a client trying only there gets in once
            # the claim lapsed)
        out = self._renew(client, now_ms) + self._claim(client, now_ms)
        if client in self.busy:
            return out
        if client in self.replica and self.presence.get(client) == "session":
            return out + self._arrive_at_replica(client, record, now_ms)
        if client in self.presence:
            return out
        # Held (queueing nothing) until its client connects here: until then the node it
        # comes from queues for it, and that node stops only after a barrier with every peer
        # (the adapter's Drain), so nothing routed before the connect is missed.
        self.busy[client] = "materialize"
        return out + [self._hold_arriving(client, record), Materialize(record)]

    def _claim(self, client: str, now_ms: int) -> list[Action]:
        """Claim `client` from the peers up that take claims, unless a claim of it is in
        force here already (then the client retries)."""
        if self.node_id in self.unavailable:
            return []  # draining: it takes no session
        peers = tuple(sorted(self.claimers & self.up))
        claim = self.claims.start(client, self.clock.now(now_ms).pack(), peers, now_ms)
        if claim is None:
            return []
        self.counters["claims"] += 1
        if not peers:
            self.counters["claims_won"] += 1
            return self._settle(client, now_ms)
        return [Claim(client, claim.hlc, peers)]

    def _renew(self, client: str, now_ms: int) -> list[Action]:
        """`client` tried here and was kept out: the claims that did it go on, everywhere."""
        out: list[Action] = []
        for claimant, hlc in self.claims.in_force(client, now_ms):
            self.claims.renew(client, claimant, hlc, now_ms)
            mine = self.claims.own.get(client) if claimant == self.node_id else None
            peers = mine.asked if mine is not None else self.claimers & self.up
            if peers:
                out.append(Claim(client, hlc, tuple(sorted(peers)), renews=claimant))
        return out

    def on_claim(self, client: str, claimant: str, hlc: int, lasts_ms: int, withdrawn: bool,
                 now_ms: int, renews: str = "") -> list[Action]:
        """`claimant` claims `client` (or gives its claim up, or renews node `renews`'s
        claim): granted, the client is kept out here while the claim is in force (the deny
        goes ahead of the answer)."""
        self.clock.observe(hlc, now_ms)
        if renews:
            self.claims.renew(client, renews, hlc, now_ms)
            return []
        if withdrawn:
            self.claims.withdrawn(client, claimant, hlc)
            return self._settle(client, now_ms)
        granted, beaten = self.claims.answer(client, claimant, hlc, lasts_ms, now_ms)
        self.counters["claims_granted" if granted else "claims_refused"] += 1
        out: list[Action] = []
        if beaten is not None:  # this node's later claim gives way
            self.counters["claims_lost"] += 1
            out = self._withdraw(client, beaten, claimant)
        return out + self._settle(client, now_ms) + [Claimed(client, claimant, hlc, granted)]

    def on_claimed(self, client: str, peer: str, hlc: int, granted: bool,
                   now_ms: int) -> list[Action]:
        """`peer`'s answer to this node's claim of `client`."""
        mine = self.claims.own.get(client)
        result = self.claims.answered(client, peer, hlc, granted)
        if result == "granted":
            self.counters["claims_won"] += 1
            return self._settle(client, now_ms)
        if result == "refused" and mine is not None:
            self.counters["claims_lost"] += 1
            return self._withdraw(client, mine, peer)
        return []

    @staticmethod
    def _withdraw(client: str, claim: OwnClaim, told: str = "") -> list[Action]:
        """Tell the peers `claim` asked (but `told`, which knows) that it is given up."""
        peers = tuple(sorted(claim.asked - {told}))
        return [Claim(client, claim.hlc, peers, withdrawn=True)] if peers else []

    def _arrive_at_replica(self, client: str, record: SessionRecord,
                           now_ms: int) -> list[Action]:
        """The client tried to resume here, where a replica of its session is. Its owner dead
        and the replica queueing: the replica becomes the session (promotion), the client's
        retry resumes it. Its owner alive: what the replica holds the owner hands over too,
        so it is deleted and the session made here anew. Its owner down but not yet dead:
        the client retries until it is one or the other."""
        owner = self.replica[client][0]
        if client in self.queueing and self._dead(owner, now_ms):
            return self._promote(client, record, now_ms)
        if owner not in self.up:
            return []
        self._unreplicate(client)
        self.arriving.add(client)
        self.busy[client] = "discard"
        self.holding.add(client)
        return [Hold(client, True), Discard(client, urgent=True)]

    def _promote(self, client: str, record: SessionRecord, now_ms: int) -> list[Action]:
        """The replica here becomes the session of `client`, whose owner is dead."""
        self._unreplicate(client, became_session=True)
        self.held[client] = (record.connect_hlc, True)
        self.counters["promoted"] += 1
        return self._settle(client, now_ms)

    def _promotable(self, client: str, local: str | None, now_ms: int) -> bool:
        """Its client tried this replica while the owner was down but not yet dead, and this
        node's claim of it still holds: promoted once the owner is dead, so the client's next
        try here gets in (it may not come back for long: a round-robin front sends it to the
        other nodes in between, which keep it out under this claim)."""
        copied = self.replica.get(client)
        return (copied is not None and local == "session"
                and client not in self.busy and client not in self.failed
                and self.claims.admits(client, now_ms) and self._dead(copied[0], now_ms))

    def on_peers(self, up: set[str], now_ms: int, ordered: set[str] | None = None,
                 claimers: set[str] | None = None) -> list[Action]:
        """The peers whose streams are up now, and (when given) those of them that mark the
        last frame of a hand-over (`session-order`) and that take claims (`session-claims`):
        replicas follow (O(records) per change)."""
        if ordered is not None:
            self.ordered = set(ordered) - {self.node_id}
        if claimers is not None:
            self.claimers = set(claimers) - {self.node_id}
        up = set(up) - {self.node_id}
        if up == self.up:
            return []
        out: list[Action] = []
        for client in self.claims.passed_over(up):  # a peer gone down answers no claim
            self.counters["claims_won"] += 1
            out += self._settle(client, now_ms)
        for client in self.claims.drop_from(up):  # nor keeps a client out
            out += self._settle(client, now_ms)
        for peer in self.up - up:
            self.down_since[peer] = now_ms
        for peer in up:
            self.down_since.pop(peer, None)
        self.up = up
        self.dead = self._dead_now(now_ms)
        return out + self._settle_all(now_ms)

    def on_local_snapshot(self, online: dict[str, tuple[str | None, str, bool, int | None]],
                          sessions: set[str], now_ms: int) -> list[Action]:
        """What the local Mosquitto holds after a (re)sync: `online` client -> (username,
        protocol, clean_start, expiry); `sessions`: offline persistent sessions."""
        self.presence = {c: "session" for c in sessions}
        self.held = {c: h for c, h in self.held.items() if c in sessions or c in online}
        for client in [c for c in self.replica if c not in sessions]:
            self._unreplicate(client)
        out: list[Action] = []
        for client, (username, protocol, clean, expiry) in online.items():
            if username == SHADOW_USERNAME:
                self.presence[client] = "session"
                continue
            self.presence[client] = "online"
            record = self.records.get(client)
            if record is None or record.deleted:
                out += self.on_connect(client, username, protocol, clean, expiry, False, now_ms)
        for client in set(self.records) | self.denied:
            out += self._settle(client, now_ms)
        return out

    # ---- results of the adapter's operations ---------------------------------------------
    def on_materialized(self, client: str, ok: bool, now_ms: int) -> list[Action]:
        return self._finished(client, ok, now_ms, "materialized")

    def on_drained(self, client: str, ok: bool, now_ms: int) -> list[Action]:
        return self._finished(client, ok, now_ms, "drained")

    def on_discarded(self, client: str, ok: bool, now_ms: int) -> list[Action]:
        return self._finished(client, ok, now_ms, "discarded")

    def on_abandoned(self, client: str, now_ms: int) -> list[Action]:
        """A drain or a deletion of the copy here stopped before it began: its client
        connected here meanwhile (the record is this node's again), so the copy stays the
        session."""
        if self.busy.get(client) in ("drain", "discard"):
            del self.busy[client]
        return self._settle(client, now_ms)

    def _finished(self, client: str, ok: bool, now_ms: int, what: str) -> list[Action]:
        op = self.busy.pop(client, None)
        out: list[Action] = []
        if op == "replicate" and not ok:
            self.applying.pop(client, None)
            self._unreplicate(client)  # made again (whole) when retried
        if ok:
            self.counters["replicated" if op == "replicate" else what] += 1
            if op in ("drain", "discard") and self.presence.get(client) != "online":
                self._forget(client)
                out = self._release(client)
            elif op == "share":
                self.unshared.discard(client)
            elif op == "replicate" and self.presence.get(client) != "online":
                owner, connect_hlc, subs = self.applying.pop(client, ("", 0, frozenset()))
                self.presence[client] = "session"
                self.held[client] = (connect_hlc, False)
                self.replica[client] = (owner, subs)
            elif op == "materialize" and self.presence.get(client) != "online":
                record = self.records.get(client)
                self.presence[client] = "session"
                # a session rebuilt for its owner is drained if the client moves on; one
                # made ahead of a client that then went elsewhere only repeats what the
                # client's owner queued: deleted; one made for an arriving client (held)
                # that a drain handed here meanwhile is made ahead too (`_settle` lets it
                # queue: it refused everything until its client connected)
                mine = record is not None and record.owner == self.node_id \
                    and client not in self.holding
                self.held[client] = (record.connect_hlc if record else 0, mine)
        else:
            self.counters["failures"] += 1
            self.failed[client] = now_ms + RETRY_MS
        return out + self._settle(client, now_ms)

    # ---- peers ---------------------------------------------------------------------------
    def on_remote(self, records: list[SessionRecord], now_ms: int) -> list[Action]:
        out: list[Action] = []
        for record in records:
            if not self.clock.observe(record.change_hlc, now_ms):
                self.counters["clock_drift"] += 1
            mine = self.records.get(record.client)
            if not newer(record, mine):
                continue
            kept = [a for a in self.arrivals.get(record.client, ())
                    if now_ms - a[0] < ARRIVALS_KEEP_MS]
            self.arrivals[record.client] = kept + [(now_ms, mine.connect_hlc if mine else 0)]
            # its claimant's record of a connect after the claim: the claim did its work
            self.claims.withdrawn(record.client, record.owner, record.connect_hlc)
            local = self.presence.get(record.client)
            if local == "online" and record.owner != self.node_id:
                # as one broker: the will goes out unless the session moves on with the client
                self.counters["takeovers"] += 1
                kept = mine is not None and mine.owner == self.node_id and mine.persistent
                out.append(Kick(record.client, with_will=not kept or record.fresh))
                held = self._forget(record.client)[1]
                if kept:
                    self.presence[record.client] = "session"
                    self.held[record.client] = held
            self.records[record.client] = record
            if mine is not None and record.owner not in (mine.owner, self.node_id) \
                    and record.client in self.live_held and record.client not in self.awaiting \
                    and self.presence.get(record.client) != "online":
                # its client went on to another node before connecting here: the hand-over,
                # and this node's cut, are that node's now
                out.append(self._hold_arriving(record.client, record))
            out += self._settle(record.client, now_ms)
        return out

    def snapshot(self) -> list[SessionRecord]:
        """Every record, to send a peer whose stream came up."""
        return list(self.records.values())

    def on_tick(self, now_ms: int) -> list[Action]:
        """Retry failed operations; settle what a peer's death changes; drop old tombstones."""
        out: list[Action] = []
        dead = self._dead_now(now_ms)
        if dead != self.dead:
            self.dead = dead
            out += self._settle_all(now_ms)
        for client, at in list(self.failed.items()):
            if at <= now_ms:
                del self.failed[client]
                out += self._settle(client, now_ms)
        for client, until in list(self.awaiting.items()):
            if until <= now_ms:  # no end of the old queue in time: order may break, not loss
                self.counters["order_timeouts"] += 1
                out += self._old_queue_settled(client, now_ms)
        lapsed, freed = self.claims.lapse(now_ms)
        for client, claim in lapsed:  # its client did not come (or not every answer)
            self.counters["claims_lapsed"] += 1
            out += self._withdraw(client, claim) + self._settle(client, now_ms)
        for client in freed:
            out += self._settle(client, now_ms)
        for client, until in list(self.settle_waits.items()):
            if until <= now_ms:  # its owner's move did not settle in time: admitted anyway
                del self.settle_waits[client]
                self.counters["settle_waits_expired"] += 1
                out += self._settle(client, now_ms)
        if now_ms >= self.next_sweep_ms:
            self.next_sweep_ms = now_ms + SWEEP_MS
            out += self._expire_copies(now_ms)
        old = [c for c, r in self.records.items()
               if r.deleted and now_ms - r.since_ms > TOMBSTONE_KEEP_MS
               and c not in self.presence and c not in self.busy]
        for client in old:
            del self.records[client]
        for client in [c for c, a in self.arrivals.items()
                       if now_ms - a[-1][0] >= ARRIVALS_KEEP_MS]:
            del self.arrivals[client]
        return out + ([Forget(tuple(old))] if old else [])

    def _expire_copies(self, now_ms: int) -> list[Action]:
        """Delete the offline copies here of sessions past their cluster-wide expiry: replicas
        (made never to expire: the record decides) and copies Mosquitto keeps longer than the
        record says (a replica that became the session)."""
        out: list[Action] = []
        for client in [c for c, p in self.presence.items() if p == "session"]:
            record = self.records.get(client)
            if record is None or client in self.busy or self._resumable(record, now_ms):
                continue
            if record.owner != self.node_id:
                out += self._settle(client, now_ms)
                continue
            if not record.deleted:
                out += self._store(replace(record, deleted=True,
                                           change_hlc=self.clock.now(now_ms).pack()))
            self.busy[client] = "discard"
            out.append(Discard(client))
        return out

    # ---- views ---------------------------------------------------------------------------
    def status(self, now_ms: int) -> dict[str, int]:
        """Counts over every record (O(records); `counters` are kept as they happen)."""
        live = [r for r in self.records.values() if self._resumable(r, now_ms) or r.online]
        return {"records": len(self.records), "sessions": len(live),
                "owned": sum(1 for r in live if r.owner == self.node_id),
                "online": sum(1 for r in live if r.online),
                "denied": len(self.denied), "busy": len(self.busy),
                "replicas": len(self.replica), "replicas_queueing": len(self.queueing)}

    def cut_applies(self, client: str) -> bool:
        """Whether a peer's cut for `client` (cut mode, docs/architecture.md §5) goes to the
        copy here: one its client used (an old copy of that move, still here or being
        drained), not a replica nor a copy made ahead of a client that went elsewhere, which
        would refuse what they must keep. The plugin then applies it only if the client's
        last connect here came before the cut's (its own connect time is exact; this node's
        record of it comes later, after the plugin's event)."""
        used = self.held.get(client)
        return used is not None and used[1] and self.presence.get(client) in ("online", "session")

    def takes_backlog(self, client: str) -> bool:
        """Whether a moving session's queue for `client` may go into its session here: while
        this node owns it, or while its copy here still waits for that queue (its client
        moved on meanwhile: the copy goes on with the queue in it, in order). Otherwise it
        is refused, and its sender retries towards the owner it learns of."""
        record = self.records.get(client)
        if record is None or record.deleted:
            return False
        return record.owner == self.node_id or (
            client in self.awaiting and self.presence.get(client) == "session")

    def latest_connect(self, client: str) -> int | None:
        """The connect HLC of `client`'s latest connection known anywhere (None: none); a
        drain's hand-off of its session is not one."""
        record = self.records.get(client)
        return None if record is None else record.client_connect

    def replica_nodes(self, client: str, owner: str) -> list[str]:
        """The nodes besides `owner` that hold a replica of `client`'s session, as this node
        sees the nodes up: the first `replicas` - 1 by rendezvous hash (all: every one)."""
        if self.replicas == 1:
            return []
        nodes = ranked(client, (self.up | {self.node_id}) - {owner} - self.unavailable)
        return nodes if self.replicas == 0 else nodes[:self.replicas - 1]

    # ---- drain (issue 20) -----------------------------------------------------------------
    def set_unavailable(self, nodes: frozenset[str], now_ms: int) -> list[Action]:
        """Nodes no longer counted as replicas nor as targets of a hand-off (draining, or of
        an older version); this node among them while it drains: its replicas go."""
        nodes = frozenset(nodes)
        if nodes == self.unavailable:
            return []
        self.unavailable = nodes
        return self._settle_all(now_ms)

    def hand_off_all(self, now_ms: int) -> list[Action]:
        """This node drains: give every persistent session it owns whose client is offline
        to another node up, a replica first. The record names the new owner with a connect
        of its own, just above the record's (a real connect of the client made meanwhile
        elsewhere wins over it), so the copy here is drained to it after a barrier,
        as when a client moves; a replica there becomes the session (adopted) and gets that
        backlog too (what both hold comes twice, nothing is lost). A client that another
        node's claim (granted here) is admitting goes to that node (`_hand_off_target`).
        Sessions busy or without a node to go to are left for a later call."""
        out: list[Action] = []
        for client, record in list(self.records.items()):
            if record.owner != self.node_id or record.online or client in self.busy \
                    or not self._resumable(record, now_ms):
                continue
            target = self._hand_off_target(client, now_ms)
            if target is None:
                continue
            self.counters["handed_off"] += 1
            # the least connect above the record's: it supersedes the record, but any real
            # connect of the client made meanwhile elsewhere (which saw that record) wins
            out += self._store(replace(record, owner=target, connect_hlc=record.connect_hlc + 1,
                                       change_hlc=self.clock.now(now_ms).pack(), fresh=False,
                                       client_connect_hlc=record.client_connect))
            out += self._settle(client, now_ms)
        return out

    def _hand_off_target(self, client: str, now_ms: int) -> str | None:
        """The node whose claim of `client` (granted here) is in force, else a live replica
        of its session, else the first other available node up. The claimant's copy, made
        for the client, queues from the hand-off's record on, which comes before the
        barrier. (Given to the replica, the copy here was held at its barrier while the
        claimant's held nothing until its client connected; what came between was only in
        the replica, which that connect deleted when its record came there before the
        hand-off's: a rolling restart lost 1 or 2 messages in about one run of ten.)"""
        claimants = sorted((hlc, node) for node, hlc in self.claims.in_force(client, now_ms)
                           if node != self.node_id and node in self.up
                           and node not in self.unavailable)
        if claimants:
            return claimants[0][1]
        live = [n for n in self.replica_nodes(client, self.node_id) if n in self.up]
        if live:
            return live[0]
        others = ranked(client, self.up - self.unavailable - {self.node_id})
        return others[0] if others else None

    def drain_progress(self, now_ms: int) -> dict[str, int]:
        """What still ties sessions to this node: sessions it owns (online or not), copies
        its Mosquitto holds (offline sessions, replicas, shadows), operations in progress."""
        owned = sum(1 for r in self.records.values() if r.owner == self.node_id
                    and (r.online or self._resumable(r, now_ms)))
        return {"sessions_owned": owned, "session_copies": sum(
            1 for p in self.presence.values() if p != "online"), "session_ops": len(self.busy)}

    # ---- internals -----------------------------------------------------------------------
    def _owned(self, client: str) -> SessionRecord | None:
        record = self.records.get(client)
        return record if record is not None and record.owner == self.node_id else None

    def _change_subs(self, client: str, filter: str, qos: int | None,
                     now_ms: int) -> list[Action]:
        """Subscribe (`qos`) or unsubscribe (None) `filter` in the owned record: O(1), the
        record's subscriptions change in place (records are values only between nodes)."""
        record = self._owned(client)
        if record is None or self.presence.get(client) != "online" or not record.persistent:
            # shadows and sessions owned elsewhere change nothing; the subscriptions of a
            # session that ends with its connection are never resumed: not replicated
            return []
        subs = record.subscriptions
        if subs.get(filter) == qos:
            return []
        if qos is None:
            del subs[filter]
        else:
            subs[filter] = qos
        return self._store(replace(record, change_hlc=self.clock.now(now_ms).pack()))

    def _release(self, client: str) -> list[Action]:
        self._unlive(client)
        if client not in self.holding:
            return []
        self.holding.discard(client)
        return [Hold(client, False)]

    def _hold_arriving(self, client: str, record: SessionRecord) -> Hold:
        """Hold the copy made here for a client on its way from `record`'s owner: live when
        that node is up and marks the end of its hand-over (then the client gets the queue
        it left there before what reaches it here meanwhile)."""
        self.holding.add(client)
        live = record.owner in self.up and record.owner in self.ordered  # (up: peers only)
        if live:
            self.live_held.add(client)
        else:
            self.live_held.discard(client)
        return Hold(client, True, live=live, source=record.owner if live else "")

    def _unlive(self, client: str, moved_on: bool = False) -> None:
        """`client` is no longer held live here (`moved_on`: its client went elsewhere
        before the old queue was in: that queue follows it later, after this one)."""
        self.live_held.discard(client)
        if self.awaiting.pop(client, None) is not None and moved_on:
            self.counters["order_moved_on"] += 1

    def on_backlog_in(self, client: str, now_ms: int) -> list[Action]:
        """The old owner's whole queue for `client` was delivered here: what reached the
        client here meanwhile follows (its live hold goes off)."""
        if client not in self.awaiting:
            return []
        record = self.records.get(client)
        moved_on = record is not None and record.owner != self.node_id
        self.counters["order_chained" if moved_on else "ordered_moves"] += 1
        return self._old_queue_settled(client, now_ms)

    def _old_queue_settled(self, client: str, now_ms: int) -> list[Action]:
        """`client`'s wait for its old node's queue is over (it came, or it took too long).
        Its client still here: the live hold goes off. Gone on to another node meanwhile:
        this copy, the old queue now in it before what the live hold kept, is drained to
        the new owner (a chain of quick moves keeps its order)."""
        self.awaiting.pop(client, None)
        record = self.records.get(client)
        if record is None or record.owner == self.node_id:
            settled: list[Action] = []
            if record is not None and record.settles_by_ms:  # peers may admit it now
                settled = self._store(replace(record, settles_by_ms=0,
                                              change_hlc=self.clock.now(now_ms).pack()))
            return self._release(client) + settled
        return self._settle(client, now_ms)

    def _move_settling(self, client: str, record: SessionRecord, now_ms: int) -> bool:
        """Whether `client`, owned elsewhere, is kept out here because its owner is still
        taking its old queue (a move in progress): it may connect once that settles, or
        `record.settles_by_ms` passed (then its move here chains, as without this wait)."""
        left = record.settles_by_ms - now_ms  # (further ahead than a move waits: the
        # owner's clock is off, not waited for)
        waiting = (record.owner != self.node_id and record.owner in self.up
                   and 0 < left <= MOVE_SETTLE_WAIT_MS)
        if waiting and client not in self.settle_waits:
            self.settle_waits[client] = record.settles_by_ms
            self.counters["settle_waited"] += 1
        return waiting

    def _known_at(self, client: str, record: SessionRecord | None, at_ms: int) -> int:
        """The connect HLC of `client` this node held at `at_ms` (0: none): `record`'s, or
        the one before the first peer's record stored here after then."""
        later = [before for t, before in self.arrivals.get(client, ()) if t > at_ms]
        if later:
            return later[0]
        return record.connect_hlc if record is not None else 0

    def _forget(self, client: str) -> tuple[str | None, tuple[int, bool]]:
        """Drop what the local Mosquitto held for `client`; returns it."""
        return self.presence.pop(client, None), self.held.pop(client, (0, False))

    def _store(self, record: SessionRecord) -> list[Action]:
        self.records[record.client] = record
        return [Publish(record)]

    @staticmethod
    def _resumable(record: SessionRecord, now_ms: int) -> bool:
        """A session a connect elsewhere may resume: persistent and not expired."""
        if not record.persistent:
            return False
        ends = record.expires_at_ms()
        return ends is None or ends > now_ms

    def _unreplicate(self, client: str, became_session: bool = False) -> None:
        """`client`'s copy here is no replica any more; `became_session`: it is the session
        now, to which its shared subscriptions are added (a replica does not make them)."""
        if self.replica.pop(client, None) is not None and became_session:
            record = self.records.get(client)
            if record is not None and shared_subscriptions(record.subscriptions):
                self.unshared.add(client)
        else:
            self.unshared.discard(client)
        self.queueing.discard(client)

    def _dead(self, node: str, now_ms: int) -> bool:
        """Whether `node`'s stream has been down for `grace_ms` (never up: since start)."""
        if node == self.node_id or node in self.up:
            return False
        return now_ms - self.down_since.get(node, self.started_ms) >= self.grace_ms

    def _dead_now(self, now_ms: int) -> set[str]:
        dead = {p for p, at in self.down_since.items() if now_ms - at >= self.grace_ms}
        if now_ms - self.started_ms >= self.grace_ms:
            dead.add(NEVER_UP)
        return dead

    def _settle_all(self, now_ms: int) -> list[Action]:
        out: list[Action] = []
        for client in list(self.records):
            out += self._settle(client, now_ms)
        return out

    def _settle_copy(self, client: str, record: SessionRecord, now_ms: int) -> list[Action]:
        """An offline session here of a client owned elsewhere: hand it over, delete it, or
        (a replica) hold or release it."""
        since, used = self.held.get(client, (0, False))
        gone = not self._resumable(record, now_ms)
        copied = self.replica.get(client)
        out: list[Action] = []
        if record.connect_hlc > since or gone:  # it connected elsewhere since, or ended
            if client in self.awaiting and not gone and not record.fresh:
                return out  # drained once the old queue is in (`_old_queue_settled`)
            if copied is not None and not gone and not record.fresh and not used \
                    and copied[0] not in self.up:
                if not self._dead(copied[0], now_ms):
                    return []  # whether its owner is dead (this copy goes on) is not known yet
                if client not in self.queueing:  # its client was online there
                    out = self._release_replica(client, self._death_base(copied[0]))
            if not gone and not record.fresh and (used or (
                    copied is not None and self._replica_hands_over(client, copied[0],
                                                                    record, now_ms))):
                self.busy[client] = "drain"  # the adapter holds it after the barrier
                self.holding.add(client)
                self._unreplicate(client)
                self._unlive(client, moved_on=True)  # (the plugin hands what it kept in first)
                return out + [Drain(client, record.owner, tuple(record.subscriptions),
                                    handed_off=record.handed_off)]
            self.busy[client] = "discard"
            self._unreplicate(client)
            self._unlive(client, moved_on=True)
            return out + [Discard(client)]
        if copied is None:
            return []
        subs = frozenset(replica_subscriptions(record.subscriptions).items())
        if self.node_id not in self.replica_nodes(client, record.owner) \
                or (copied[1] != subs and client in self.queueing):
            self.busy[client] = "discard"  # no longer a replica here, or out of date
            self._unreplicate(client)
            return [Discard(client)]
        if copied[1] != subs:  # its client (online) changed subscriptions: the difference
            self.busy[client] = "replicate"
            self.applying[client] = (record.owner, record.connect_hlc, subs)
            return [Resubscribe(client, dict(subs - copied[1]), tuple(
                f for f, _ in copied[1] if (f, record.subscriptions.get(f)) not in subs))]
        dead = self._dead(record.owner, now_ms)
        if (not record.online or dead) and client not in self.queueing:
            return self._release_replica(client, self._replica_base(record))
        if record.online and not dead and client in self.queueing:
            # its client is back on its owner, which delivered what this copy queued
            self.busy[client] = "discard"
            self._unreplicate(client)
            return [Discard(client)]
        return []

    def _lost_here(self, client: str, record: SessionRecord, now_ms: int) -> list[Action]:
        """Ours, but the local Mosquitto lost it (it restarted, or this node came back from a
        crash). A replica that is up holds what was queued meanwhile: it becomes the owner
        (the record says so; once per client here, so two nodes without a copy cannot hand
        it back and forth). Without one the session is made here again: its subscriptions,
        queueing from now (what it had queued is lost). Just after this node started, peers
        get the grace to come up first."""
        if self.replicas != 1 and self.handed_off.get(client) != record.connect_hlc:
            live = [n for n in self.replica_nodes(client, self.node_id) if n in self.up]
            if live:
                self.handed_off[client] = record.connect_hlc
                self.counters["lost_handed_to_replica"] += 1
                since = record.since_ms if not record.online else now_ms - RESTART_LOOKBACK_MS
                return self._store(replace(record, owner=live[0], online=False,
                                           since_ms=since,
                                           change_hlc=self.clock.now(now_ms).pack()))
            if now_ms - self.started_ms < self.grace_ms:
                return []  # settled again when a peer comes up or the grace ends
        self.busy[client] = "materialize"
        return [Materialize(record)]

    def _adopt(self, client: str, record: SessionRecord) -> list[Action]:
        """Its owner lost its copy and handed the session to this replica: it is the session
        now (released, replaying what it refused since the record's offline time, if held)."""
        queueing = client in self.queueing
        self._unreplicate(client, became_session=True)
        self.held[client] = (record.connect_hlc, True)
        self.counters["adopted"] += 1
        if queueing:
            return []
        self.holding.discard(client)
        return [Hold(client, False, since_ms=record.since_ms - self.margin_ms)]

    def _release_replica(self, client: str, since_ms: int) -> list[Action]:
        """Let the replica queue, first replaying what it refused since `since_ms`."""
        self.queueing.add(client)
        self.holding.discard(client)
        return [Hold(client, False, since_ms=since_ms)]

    def _replica_base(self, record: SessionRecord) -> int:
        """Where a released replica replays from: its client's disconnect (less the margin),
        or for a client online on a dead owner, that owner's death."""
        if not record.online:
            return record.since_ms - self.margin_ms
        return self._death_base(record.owner)

    def _death_base(self, owner: str) -> int:
        """Replay from here when a client was online on `owner`, now dead: what was in flight
        to it there, and what reached this replica before this node saw the stream go down
        (it sees that late when its loop is busy; the plugin's ring times are Mosquitto's)."""
        return self.down_since.get(owner, self.started_ms) - DEATH_LOOKBACK_MS

    def _replica_hands_over(self, client: str, owner: str, record: SessionRecord,
                            now_ms: int) -> bool:
        """Whether this replica's queue goes to the client's new node: the owner it copied
        is dead, the new node held no replica itself, and this is the first one left."""
        if client not in self.queueing or not self._dead(owner, now_ms):
            return False
        left = [n for n in self.replica_nodes(client, owner) if n != owner]
        return record.owner not in left and bool(left) and left[0] == self.node_id

    def _settle(self, client: str, now_ms: int) -> list[Action]:
        """Bring what this node does for `client` in line with its record and presence."""
        record = self.records.get(client)
        local = self.presence.get(client)
        out: list[Action] = []
        if record is not None and record.owner != self.node_id \
                and self._promotable(client, local, now_ms):
            if client not in self.queueing:  # (the owner's death releases it: here first)
                out = self._release_replica(client, self._replica_base(record))
            return out + self._promote(client, record, now_ms)
        if record is not None and record.owner == self.node_id and local == "session" \
                and client in self.replica:
            out += self._adopt(client, record)
        elif record is not None and record.owner == self.node_id and local == "session" \
                and not self.held.get(client, (0, False))[1]:
            # a copy made ahead of its client that a drain then handed here: it is the
            # session now (it gets the old owner's queue), drained when its client moves on;
            # it queues from now on (held, nobody did while its client was away: the old
            # owner holds its copy to drain it, and a chaos rolling restart lost 2 s so)
            self.held[client] = (record.connect_hlc, True)
            out += self._release(client)
        if client in self.unshared and client not in self.busy and client not in self.failed \
                and record is not None and local == "session":
            self.busy[client] = "share"  # its client is kept out until they are made
            out.append(Resubscribe(client, shared_subscriptions(record.subscriptions), ()))
        if client not in self.busy and client not in self.failed and record is not None \
                and record.owner != self.node_id and local == "session":
            out += self._settle_copy(client, record, now_ms)
            local = self.presence.get(client)
        if record is not None and local is None and client not in self.busy \
                and client not in self.failed and self._resumable(record, now_ms):
            if record.owner == self.node_id:
                out += self._lost_here(client, record, now_ms)
                record = self.records[client]
            elif client in self.arriving:  # its client came here: as on_connect_rejected
                self.arriving.discard(client)
                self.busy[client] = "materialize"
                out += [self._hold_arriving(client, record), Materialize(record)]
            elif self.node_id in self.replica_nodes(client, record.owner):
                self.busy[client] = "replicate"
                self.applying[client] = (record.owner, record.connect_hlc, frozenset(
                    replica_subscriptions(record.subscriptions).items()))
                self.holding.add(client)
                out += [Hold(client, True, ring=True), Materialize(record, replica=True)]
        copy = local == "session" and client in self.replica
        # (a copy being drained or deleted here is not to be resumed meanwhile: its client
        # would take over the drain's shadow, and a failed drain gives the copy back)
        # (a copy here, made for its client, that it could resume now: it waits)
        settling = (record is not None and local is not None
                    and self._move_settling(client, record, now_ms))
        if not settling:
            self.settle_waits.pop(client, None)
        # a copy here of a session owned elsewhere admits its client only under this node's
        # claim; any copy, the owner's too, keeps it out under another node's (claims.py)
        unclaimed = (local == "session" and record is not None and record.owner != self.node_id
                     and not self.claims.admits(client, now_ms))
        want_deny = (record is not None and self._resumable(record, now_ms)
                     and (local is None or copy or client in self.unshared or settling
                          or unclaimed or self.claims.keeps_out(client, now_ms)
                          or self.busy.get(client) in ("replicate", "drain", "discard")))
        if want_deny and client not in self.denied:
            self.denied.add(client)
            out.insert(0, Deny(client))  # ahead of an operation issued here (done in order)
        elif not want_deny and client in self.denied and client not in self.busy:
            # not while an operation changes the copy here (being made, deleted, drained):
            # a connect then would find no session, or one about to go (session present 0)
            self.denied.discard(client)
            out.append(Admit(client))
        return out

