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
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from sidecar.hlc import ClockDriftError, HybridClock, Timestamp
from sidecar.local.protocol import SIDECAR_USERNAME as SHADOW_USERNAME
from sidecar.sessions.record import SessionRecord, newer

TOMBSTONE_KEEP_MS = 3_600_000
RETRY_MS = 1_000


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
    elsewhere now); off: it may again."""

    client: str
    on: bool


@dataclass(frozen=True, slots=True)
class Materialize:
    """Make `record`'s session here (a shadow connection with its subscriptions); report with
    `on_materialized`."""

    record: SessionRecord


@dataclass(frozen=True, slots=True)
class Drain:
    """Once every peer confirms that what it routed here so far is in (a barrier), hold the
    session of `client` here (it queues nothing more), take the messages it queued (ending its
    `subscriptions` here), hand them to `owner`, then delete the session here; report with
    `on_drained`."""

    client: str
    owner: str
    subscriptions: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Discard:
    """Delete the session of `client` here (without delivering what it queued); report with
    `on_discarded`."""

    client: str


@dataclass(frozen=True, slots=True)
class Forget:
    """These tombstones are old enough to drop from the store."""

    clients: tuple[str, ...]


Action = Publish | Kick | Deny | Admit | Hold | Materialize | Drain | Discard | Forget


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
    counters: dict[str, int] = field(default_factory=lambda: {
        "moves": 0, "takeovers": 0, "materialized": 0, "drained": 0, "discarded": 0,
        "failures": 0, "clock_drift": 0})

    # ---- local events (the plugin) -------------------------------------------------------
    def on_connect(self, client: str, username: str | None, protocol: str, clean_start: bool,
                   expiry: int | None, session_present: bool, now_ms: int) -> list[Action]:
        if username == SHADOW_USERNAME:
            self.presence[client] = "shadow"
            return []
        self.presence[client] = "online"
        old = self.records.get(client)
        hlc = self.clock.now(now_ms).pack()
        fresh = clean_start or not session_present
        subs = dict(old.subscriptions) if old and not fresh and not old.deleted else {}
        record = SessionRecord(client, self.node_id, hlc, hlc, protocol, expiry, fresh,
                               True, now_ms, False, subs)
        self.held[client] = (hlc, True)
        if old is not None and old.owner != self.node_id and session_present:
            self.counters["moves"] += 1
        return self._release(client) + self._store(record) + self._settle(client, now_ms)

    def on_subscribe(self, client: str, filter: str, qos: int, now_ms: int) -> list[Action]:
        return self._change_subs(client, filter, qos, now_ms)

    def on_unsubscribe(self, client: str, filter: str, now_ms: int) -> list[Action]:
        return self._change_subs(client, filter, None, now_ms)

    def on_disconnect(self, client: str, taken_over: bool, session_kept: bool,
                      expiry: int | None, now_ms: int) -> list[Action]:
        if taken_over:
            return []  # the newer connection's connect follows
        was = self._forget(client)
        if session_kept:
            self.presence[client] = "session"
            self.held[client] = was[1]
        record = self._owned(client)
        out: list[Action] = []
        if was[0] == "online" and record is not None and record.online:
            out = self._store(replace(record, online=False, since_ms=now_ms, expiry=expiry,
                                      deleted=not session_kept,
                                      change_hlc=self.clock.now(now_ms).pack()))
        return out + self._settle(client, now_ms)

    def on_session_expired(self, client: str, now_ms: int) -> list[Action]:
        self._forget(client)
        record = self._owned(client)
        out: list[Action] = []
        if record is not None and not record.deleted and not record.online:
            out = self._store(replace(record, deleted=True,
                                      change_hlc=self.clock.now(now_ms).pack()))
        return out + self._settle(client, now_ms)

    def on_connect_rejected(self, client: str | None, reason: str,
                            now_ms: int) -> list[Action]:
        """A connect closed by the deny list: make the session here, then admit the client."""
        if client is None or reason != "denied" or client in self.busy:
            return []
        record = self.records.get(client)
        if record is None or not self._resumable(record, now_ms) or client in self.presence \
                or record.owner == self.node_id:
            return []
        # Held (queueing nothing) until its client connects here: until then the node it
        # comes from queues for it, and that node stops only after a barrier with every peer
        # (the adapter's Drain), so nothing routed before the connect is missed.
        self.busy[client] = "materialize"
        self.holding.add(client)
        return [Hold(client, True), Materialize(record)]

    def on_local_snapshot(self, online: dict[str, tuple[str | None, str, bool, int | None]],
                          sessions: set[str], now_ms: int) -> list[Action]:
        """What the local Mosquitto holds after a (re)sync: `online` client -> (username,
        protocol, clean_start, expiry); `sessions`: offline persistent sessions."""
        self.presence = {c: "session" for c in sessions}
        self.held = {c: h for c, h in self.held.items() if c in sessions or c in online}
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

    def _finished(self, client: str, ok: bool, now_ms: int, what: str) -> list[Action]:
        op = self.busy.pop(client, None)
        out: list[Action] = []
        if ok:
            self.counters[what] += 1
            if op in ("drain", "discard") and self.presence.get(client) != "online":
                self._forget(client)
                out = self._release(client)
            elif op == "materialize" and self.presence.get(client) != "online":
                record = self.records.get(client)
                self.presence[client] = "session"
                # a session rebuilt for its owner is drained if the client moves on; one
                # made ahead of a client that then went elsewhere only repeats what the
                # client's owner queued: deleted
                mine = record is not None and record.owner == self.node_id
                self.held[client] = (record.connect_hlc if record else 0, mine)
        else:
            self.counters["failures"] += 1
            self.failed[client] = now_ms + RETRY_MS
        return out + self._settle(client, now_ms)

    # ---- peers ---------------------------------------------------------------------------
    def on_remote(self, records: list[SessionRecord], now_ms: int) -> list[Action]:
        out: list[Action] = []
        for record in records:
            try:
                self.clock.update(Timestamp.unpack(record.change_hlc), now_ms)
            except (ClockDriftError, ValueError):
                self.counters["clock_drift"] += 1
            mine = self.records.get(record.client)
            if not newer(record, mine):
                continue
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
            out += self._settle(record.client, now_ms)
        return out

    def snapshot(self) -> list[SessionRecord]:
        """Every record, to send a peer whose stream came up."""
        return list(self.records.values())

    def on_tick(self, now_ms: int) -> list[Action]:
        """Retry failed operations; drop old tombstones."""
        out: list[Action] = []
        for client, at in list(self.failed.items()):
            if at <= now_ms:
                del self.failed[client]
                out += self._settle(client, now_ms)
        old = [c for c, r in self.records.items()
               if r.deleted and now_ms - r.since_ms > TOMBSTONE_KEEP_MS
               and c not in self.presence and c not in self.busy]
        for client in old:
            del self.records[client]
        return out + ([Forget(tuple(old))] if old else [])

    # ---- views ---------------------------------------------------------------------------
    def status(self, now_ms: int) -> dict[str, int]:
        """Counts over every record (O(records); `counters` are kept as they happen)."""
        live = [r for r in self.records.values() if self._resumable(r, now_ms) or r.online]
        return {"records": len(self.records), "sessions": len(live),
                "owned": sum(1 for r in live if r.owner == self.node_id),
                "online": sum(1 for r in live if r.online),
                "denied": len(self.denied), "busy": len(self.busy)}

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
        if client not in self.holding:
            return []
        self.holding.discard(client)
        return [Hold(client, False)]

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

    def _settle(self, client: str, now_ms: int) -> list[Action]:
        """Bring what this node does for `client` in line with its record and presence."""
        record = self.records.get(client)
        local = self.presence.get(client)
        out: list[Action] = []
        if client not in self.busy and client not in self.failed and record is not None \
                and record.owner != self.node_id and local == "session":
            since, used = self.held.get(client, (0, False))
            gone = not self._resumable(record, now_ms)
            if record.connect_hlc > since or gone:  # it connected elsewhere since, or ended
                if used and not gone and not record.fresh:
                    self.busy[client] = "drain"  # the adapter holds it after the barrier
                    self.holding.add(client)
                    out.append(Drain(client, record.owner, tuple(record.subscriptions)))
                else:
                    self.busy[client] = "discard"
                    out.append(Discard(client))
        if record is not None and record.owner == self.node_id and local is None \
                and client not in self.busy and self._resumable(record, now_ms):
            # ours, but the local Mosquitto lost it (it restarted): make it again, queueing
            self.busy[client] = "materialize"
            out.append(Materialize(record))
        want_deny = (record is not None and local is None and self._resumable(record, now_ms)
                     and (record.owner != self.node_id or self.busy.get(client) == "materialize"))
        if want_deny and client not in self.denied:
            self.denied.add(client)
            out.append(Deny(client))
        elif not want_deny and client in self.denied and \
                self.busy.get(client) != "materialize":
            self.denied.discard(client)
            out.append(Admit(client))
        return out
