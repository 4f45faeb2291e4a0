"""`WillTable`: every client id's will as one node sees it, and what this node must do about
them (sans-IO core; wall clock in milliseconds passed in).

Fed the local plugin's connect/disconnect events (the will a connection set, and what became
of it), the records peers replicate, the local plugin's snapshots and `Liveness`; returns
actions for the adapter (`sidecar.wills.service`): store and replicate a record, publish a will
on the local Mosquitto (`Fire`), forget old records.

Who publishes a will:
- while its owner's Mosquitto holds it (the client online there, or disconnected with a delay
  running there), that Mosquitto, the MQTT way; the owner writes the record done;
- when the owner is confirmed dead (`Liveness`), or its Mosquitto is gone (`LOST`: it
  restarted), or it drained and handed the will over (`LEAVING`), exactly one live node: the
  rendezvous choice of the client id over the live members (the owner excluded when it is
  leaving). It publishes once the will is due (the delay counted from when the connection
  ended: the disconnect, or the owner's death as this node saw it, capped by the session
  expiry), unless the client connected again since (the session registry knows, anywhere in
  the cluster), and writes the record done; done wins over every other state of that
  connection, so a second node that decides later finds it done.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Protocol

from sidecar.hlc import HybridClock, Timestamp
from sidecar.rendezvous import choose
from sidecar.wills.liveness import Liveness
from sidecar.wills.record import (
    ARMED,
    DELAYED,
    DONE,
    LEAVING,
    LOST,
    WillMessage,
    WillRecord,
    delay_s,
    newer,
)


class Connections(Protocol):
    """What the will table reads of the session registry: the connect HLC of a client's
    latest connection known anywhere (None: none). A will whose connection is older than
    that is not published: the client reconnected meanwhile."""

    def latest_connect(self, client: str) -> int | None: ...


OWNER_MARGIN_MS = 1_500
"""A delayed will on its live owner counts as sent this long after it was due (Mosquitto
checks its delayed wills once a second)."""
FIRING_AHEAD_MS = 1_500
"""A drain waits for a delayed will due this soon to be sent here (OWNER_MARGIN_MS after it
is due) rather than hand it over: the session's hand-off would cancel it in Mosquitto."""
MOSQUITTO_LAG_MS = OWNER_MARGIN_MS
DONE_KEEP_MS = 3_600_000
"""Done records are forgotten after this long (a newer connection supersedes them anyway)."""
PURGE_EVERY_MS = 60_000
RETRY_MS = 1_000


@dataclass(frozen=True, slots=True)
class Store:
    """Store `record` and send it to every peer."""

    record: WillRecord


@dataclass(frozen=True, slots=True)
class Persist:
    """Store these records received from a peer (not sent on)."""

    records: tuple[WillRecord, ...]


@dataclass(frozen=True, slots=True)
class Fire:
    """Publish `record`'s will on the local Mosquitto now; report with `on_fired`."""

    record: WillRecord


@dataclass(frozen=True, slots=True)
class Cancel:
    """The local Mosquitto still holds `client`'s delayed will, of a connection that ended with
    a session expiry of 0, and the client connected again elsewhere: end that connection's
    state here without the will, as one broker does when the client comes back within the
    delay (a shadow connect with clean start: Mosquitto then drops the pending will)."""

    client: str


@dataclass(frozen=True, slots=True)
class Forget:
    """These records are old enough to drop from the store."""

    clients: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Notice:
    """Something worth a log line: `kind` and details."""

    kind: str
    client: str
    detail: tuple[tuple[str, object], ...] = ()


Action = Store | Persist | Fire | Cancel | Forget | Notice


def _mosquitto_due(record: WillRecord) -> int:
    """When the owner's Mosquitto sends this delayed will (wall ms), by its own reckoning."""
    return record.since_ms + delay_s(record, spec=False) * 1000


def _counters() -> dict[str, int]:
    return {"armed": 0, "unknown": 0, "cleared": 0, "sent_by_owner": 0, "delayed": 0,
            "published_dead_node": 0, "published_leaving": 0, "published_lost": 0,
            "skipped_reconnected": 0, "publish_failures": 0, "lost": 0, "handed_over": 0,
            "published_while_online": 0, "clock_drift": 0, "cancelled_reconnected": 0}


@dataclass
class WillTable:
    node_id: str
    liveness: Liveness
    connections: Connections
    clock: HybridClock = field(default_factory=HybridClock)
    ready_ms: int = 0  # no will is published for others before this (peers' records first)
    epoch: str = ""  # the local plugin's epoch (the Mosquitto run this node's wills are in)
    records: dict[str, WillRecord] = field(default_factory=dict)
    firing: set[str] = field(default_factory=set)
    failed: dict[str, int] = field(default_factory=dict)  # client -> retry at (ms)
    counters: dict[str, int] = field(default_factory=_counters)
    # indexes of the pending records, so a tick looks only at those it may act on
    by_owner: dict[str, set[str]] = field(default_factory=dict)  # held by owner's Mosquitto
    orphans: set[str] = field(default_factory=set)
    _purged_ms: int = 0

    def load(self, records: Iterable[WillRecord]) -> None:
        """Records from the store (at start)."""
        for record in records:
            self._put(record)

    @property
    def owners(self) -> set[str]:
        """Nodes whose Mosquitto holds pending wills."""
        return set(self.by_owner)

    # ---- local events (the plugin) -------------------------------------------------------
    def on_connect(self, client: str, connect_hlc: int | None, will: WillMessage | None,
                   known: bool, expiry: int | None, epoch: str, now_ms: int) -> list[Action]:
        """A client connected here with `will` (None: none, or unknown when not `known`);
        `connect_hlc`: its connection's HLC in the session registry."""
        self.epoch = epoch or self.epoch
        hlc = self._hlc(now_ms)
        connect = connect_hlc if connect_hlc is not None else hlc
        old = self.records.get(client)
        if will is not None:
            self.counters["armed"] += 1
            return self._store(WillRecord(client, self.node_id, self.epoch, connect, hlc,
                                          self.node_id, ARMED, "", now_ms, expiry, will))
        if not known:
            self.counters["unknown"] += 1
        if old is not None and old.pending and old.connect_hlc < connect:
            # the older connection's will is not published any more, wherever it was
            return self._store(WillRecord(client, self.node_id, self.epoch, connect, hlc,
                                          self.node_id, DONE, outcome="superseded"))
        return []

    def on_disconnect(self, client: str, fate: str | None, expiry: int | None,
                      now_ms: int) -> list[Action]:
        """A connection here ended (not taken over by a newer one here): `fate` of its will
        is "sent", "delayed", "none" or None (unknown)."""
        record = self.records.get(client)
        if record is None or record.owner != self.node_id or record.state != ARMED \
                or record.orphaned or record.epoch != self.epoch:
            return []
        if fate == "delayed":
            self.counters["delayed"] += 1
            return self._store(replace(record, state=DELAYED, since_ms=now_ms, expiry=expiry,
                                       change_hlc=self._hlc(now_ms), writer=self.node_id))
        outcome = {"sent": "sent_by_owner", "none": "cleared"}.get(fate or "", "unknown")
        self.counters[outcome] += 1
        return self._done(record, now_ms, outcome)

    def on_local_snapshot(self, epoch: str, online: dict[str, tuple[WillMessage | None, bool]],
                          now_ms: int) -> list[Action]:
        """The local plugin's snapshot: `online` client -> (will, known). Wills of an older
        Mosquitto run of this node are lost with it: any node may now publish them."""
        self.epoch = epoch
        out: list[Action] = []
        for client, record in list(self.records.items()):
            if record.owner != self.node_id or not record.pending or record.orphaned:
                continue
            if record.epoch != epoch:
                self.counters["lost"] += 1
                since = record.since_ms if record.state == DELAYED else now_ms
                out += self._store(replace(record, orphaned=LOST, since_ms=since,
                                           change_hlc=self._hlc(now_ms), writer=self.node_id))
            elif record.state == ARMED and client not in online:
                # its disconnect came while this sidecar was away: Mosquitto did what it did
                out += self._done(record, now_ms, "unknown")
        for client, (will, known) in online.items():
            record = self.records.get(client)
            mine = record is not None and record.owner == self.node_id \
                and record.epoch == epoch and record.state == ARMED
            if will is not None and not mine:
                connect = self.connections.latest_connect(client)
                out += self.on_connect(client, connect, will, known, None, epoch, now_ms)
        return out

    def firing_here(self, now_ms: int) -> bool:
        """Whether a delayed will of this node is about to be sent by its own Mosquitto, or
        may just have been (which checks its delays once a second): a drain waits for that
        before it hands the wills over."""
        return any(due - FIRING_AHEAD_MS <= now_ms < due + MOSQUITTO_LAG_MS
                   for due in self._local_dues())

    def _local_dues(self) -> Iterator[int]:
        for client in self.by_owner.get(self.node_id, ()):
            record = self.records[client]
            if record.state == DELAYED and not record.orphaned and record.will is not None:
                yield _mosquitto_due(record)

    def handover(self, now_ms: int) -> list[WillRecord]:
        """This node drains (its Mosquitto stops): every will it holds goes to the others
        (orphaned `LEAVING`); returns them, to send with an acknowledgement. A delayed will
        whose time has passed was sent by this node's Mosquitto: it goes as done (a peer
        that got it as pending sent it a second time)."""
        out: list[WillRecord] = []
        for record in list(self.records.values()):
            if record.owner == self.node_id and record.pending and not record.orphaned \
                    and record.state == DELAYED and record.will is not None \
                    and now_ms >= _mosquitto_due(record) \
                    + MOSQUITTO_LAG_MS:
                self.counters["sent_by_owner"] += 1
                self._done(record, now_ms, "published")
                out.append(self.records[record.client])
                continue
            if record.owner == self.node_id and record.pending and not record.orphaned:
                since = record.since_ms if record.state == DELAYED else now_ms
                handed = replace(record, orphaned=LEAVING, since_ms=since,
                                 change_hlc=self._hlc(now_ms), writer=self.node_id)
                self._put(handed)
                out.append(handed)
        self.counters["handed_over"] += len(out)
        return out

    # ---- results of the adapter's operations ---------------------------------------------
    def on_fired(self, client: str, connect_hlc: int, ok: bool, now_ms: int) -> list[Action]:
        self.firing.discard(client)
        record = self.records.get(client)
        if not ok:
            self.counters["publish_failures"] += 1
            self.failed[client] = now_ms + RETRY_MS
            return []
        if record is None or record.connect_hlc != connect_hlc or not record.pending:
            return []
        self.counters[f"published_{self._reason(record)}"] += 1
        return self._done(record, now_ms, "published")

    # ---- peers ---------------------------------------------------------------------------
    def on_remote(self, records: Iterable[WillRecord], now_ms: int) -> list[Action]:
        """Records from a peer: the newer wins (stored, not sent on)."""
        out: list[Action] = []
        changed: list[WillRecord] = []
        for record in records:
            if not self.clock.observe(record.change_hlc, now_ms):
                self.counters["clock_drift"] += 1
            mine = self.records.get(record.client)
            if not newer(record, mine):
                continue
            if mine is not None and mine.owner == self.node_id and mine.state == ARMED \
                    and not mine.orphaned and mine.epoch == self.epoch \
                    and record.connect_hlc == mine.connect_hlc \
                    and record.outcome == "published":
                # published for us while the client is still connected here: we were taken
                # for dead (a partition); its Mosquitto will publish it again when it leaves
                self.counters["published_while_online"] += 1
                out.append(Notice("published_while_online", record.client,
                                  (("by", record.writer),)))
            if self._held_here_without_session(mine) and record.connect_hlc > mine.connect_hlc:
                self.counters["cancelled_reconnected"] += 1
                out.append(Cancel(record.client))
            self._put(record)
            changed.append(record)
        if changed:
            out.append(Persist(tuple(changed)))
        return out

    def snapshot(self) -> list[WillRecord]:
        """Every record, to send a peer whose stream came up."""
        return list(self.records.values())

    # ---- time ----------------------------------------------------------------------------
    def on_tick(self, now_ms: int) -> list[Action]:
        out: list[Action] = []
        for client in list(self.by_owner.get(self.node_id, ())):
            record = self.records[client]
            if record.state == DELAYED and record.epoch == self.epoch and \
                    now_ms >= _mosquitto_due(record) \
                    + OWNER_MARGIN_MS:
                self.counters["sent_by_owner"] += 1  # its Mosquitto published it
                out += self._done(record, now_ms, "sent_by_owner")
        dead = [o for o in self.by_owner if self.liveness.is_dead(o)]
        for client in [*self.orphans, *(c for o in dead for c in self.by_owner[o])]:
            out += self._decide(self.records[client], now_ms)
        if now_ms - self._purged_ms >= PURGE_EVERY_MS:
            self._purged_ms = now_ms
            old = tuple(c for c, r in self.records.items() if not r.pending
                        and now_ms - Timestamp.unpack(r.change_hlc).wall_ms > DONE_KEEP_MS)
            for client in old:
                del self.records[client]
            if old:
                out.append(Forget(old))
        return out

    def due_ms(self, record: WillRecord) -> int | None:
        """When this node would publish `record` for its owner (None: not up to this node's
        side: the owner's Mosquitto holds it)."""
        if not record.pending:
            return None
        if record.orphaned:
            base = record.since_ms
        elif self.liveness.is_dead(record.owner):
            death = self.liveness.dead[record.owner]
            base = record.since_ms if record.state == DELAYED else death.since_ms
        else:
            return None
        return base + delay_s(record) * 1000

    # ---- internals -----------------------------------------------------------------------
    def _decide(self, record: WillRecord, now_ms: int) -> list[Action]:
        client = record.client
        due = self.due_ms(record)
        if due is None or now_ms < due or now_ms < self.ready_ms or client in self.firing \
                or self.failed.get(client, 0) > now_ms:
            return []
        live = self.liveness.live()
        if record.orphaned == LEAVING:
            live = [n for n in live if n != record.owner]
        if choose(client, live) != self.node_id:
            return []
        self.failed.pop(client, None)
        latest = self.connections.latest_connect(client)
        if latest is not None and latest > record.connect_hlc:
            self.counters["skipped_reconnected"] += 1
            return self._done(record, now_ms, "skipped")
        self.firing.add(client)
        return [Fire(record)]

    def _held_here_without_session(self, record: WillRecord | None) -> bool:
        """A delayed will this node's Mosquitto holds for a connection whose session ended
        with it (expiry 0: no session to move, whose resume would cancel it)."""
        return record is not None and record.owner == self.node_id \
            and record.state == DELAYED and not record.orphaned \
            and record.epoch == self.epoch and record.expiry == 0

    @staticmethod
    def _reason(record: WillRecord) -> str:
        return {LEAVING: "leaving", LOST: "lost"}.get(record.orphaned, "dead_node")

    def _hlc(self, now_ms: int) -> int:
        return self.clock.now(now_ms).pack()

    def _done(self, record: WillRecord, now_ms: int, outcome: str) -> list[Action]:
        return self._store(replace(record, state=DONE, will=None, outcome=outcome,
                                   writer=self.node_id, change_hlc=self._hlc(now_ms)))

    def _store(self, record: WillRecord) -> list[Action]:
        self._put(record)
        return [Store(record)]

    def _put(self, record: WillRecord) -> None:
        client = record.client
        old = self.records.get(client)
        if old is not None and old.pending:
            if old.orphaned:
                self.orphans.discard(client)
            else:
                held = self.by_owner.get(old.owner)
                if held is not None:
                    held.discard(client)
                    if not held:
                        del self.by_owner[old.owner]
        self.records[client] = record
        if record.pending:
            if record.orphaned:
                self.orphans.add(client)
            else:
                self.by_owner.setdefault(record.owner, set()).add(client)

