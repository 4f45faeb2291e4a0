"""`Drain`: one node's drain, from `mqfed ctl drain` to "nothing left here" (sans-IO core).

Fed the node's facts on every tick (`Facts`: clients still connected, sessions it still owns or
holds, messages not yet with the peers) and the operator's start/stop; returns what the
adapter (`sidecar.drain.service`) must do:

1. `CloseAdmission` and `Announce(True)`: no client connects here any more (the plugin closes
   every connect without a CONNACK, clients retry through their load balancer elsewhere;
   `/readyz` fails so the balancer takes the node out), and the peers stop counting this node
   as a replica or as a place to hand sessions to;
2. `KickAll`: the clients connected here are disconnected (again every `KICK_EVERY` while some
   are left: one may have connected just before admission closed). A persistent session's
   client reconnects elsewhere and its session moves there with what it queued here (the
   session registry's move);
3. `HandOff`: after `HAND_OFF_AFTER` (clients that come back have done so), the sessions still
   owned here (clients that did not come back) are handed to other nodes, again every
   `HAND_OFF_EVERY` while some are left;
4. drained once no client is connected, no session is owned or held here, no session
   operation runs, and every message is settled with the peers that are up (the forwarding
   connection quiet). Messages queued for peers that are down stay in the spill (kept across a
   restart) and are reported, not waited for.

`stop()` (undrain) admits clients again at any point; what moved stays where it went.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["HAND_OFF_AFTER", "HAND_OFF_EVERY", "KICK_EVERY", "Announce", "CloseAdmission",
           "Drain", "Facts", "HandOff", "KickAll", "OpenAdmission", "Progress"]

KICK_EVERY = 1.0
HAND_OFF_AFTER = 3.0
HAND_OFF_EVERY = 1.0


@dataclass(frozen=True, slots=True)
class CloseAdmission:
    """Refuse every client connect here (without a CONNACK)."""


@dataclass(frozen=True, slots=True)
class OpenAdmission:
    """Admit client connects here again."""


@dataclass(frozen=True, slots=True)
class Announce:
    """Tell the peers whether this node drains."""

    draining: bool


@dataclass(frozen=True, slots=True)
class KickAll:
    """Disconnect every client connected here (with its will, as MQTT wants when the server
    closes a connection)."""


@dataclass(frozen=True, slots=True)
class HandOff:
    """Give every session owned here whose client is offline to another node."""


Action = CloseAdmission | OpenAdmission | Announce | KickAll | HandOff


@dataclass(frozen=True, slots=True)
class Facts:
    """What still ties clients, sessions and messages to this node, read on each tick."""

    clients: int = 0  # client connections (not the sidecar's own, not shadows)
    sessions_owned: int = 0  # sessions whose owner is this node (online or resumable)
    session_copies: int = 0  # offline sessions, replicas, shadows held by this Mosquitto
    session_ops: int = 0  # session operations in progress (makes, drains, deletes)
    records_unsent: int = 0  # session records not yet sent to the peers
    session_messages: int = 0  # messages queued in offline sessions here (plugin estimate)
    unsettled: int = 0  # messages from Mosquitto not yet settled with the peers
    queued: int = 0  # messages in the outbound queues of peers that are up
    queued_down: int = 0  # messages queued for peers that are down (kept in the spill)
    quiet: bool = True  # the forwarding connection has had nothing new for a moment
    peers_up: int = 0  # peers with a stream up (somewhere for sessions to go)


@dataclass(frozen=True, slots=True)
class Progress:
    """A drain as `mqfed ctl drain` reports it."""

    state: str  # serving | draining | drained
    phase: str  # "" | disconnecting | moving sessions | settling | drained
    started_at: float  # wall seconds (0: never drained)
    seconds: float  # since the start (until drained, then fixed)
    clients: int
    sessions_owned: int
    session_copies: int
    messages_queued: int  # unsettled + queued for peers that are up
    messages_queued_down: int
    kicks: int
    hand_offs: int
    note: str
    session_messages: int = 0  # messages in the offline sessions still here

    def as_dict(self) -> dict:
        return asdict(self)


class Drain:
    """The drain state of one node; times are monotonic seconds, `wall` only for display."""

    def __init__(self) -> None:
        self.state = "serving"
        self.started = 0.0
        self.started_wall = 0.0
        self.finished = 0.0
        self._kicked_at: float | None = None
        self._handed_at: float | None = None
        self.kicks = 0
        self.hand_offs = 0
        self.facts = Facts()

    @property
    def draining(self) -> bool:
        """Admission is closed (draining or drained)."""
        return self.state != "serving"

    def start(self, now: float, wall: float) -> list[Action]:
        """Begin (idempotent: a drain in progress or done goes on as it is)."""
        if self.draining:
            return []
        self.state, self.started, self.started_wall, self.finished = "draining", now, wall, 0.0
        self._kicked_at = self._handed_at = None
        self.kicks = self.hand_offs = 0
        return [CloseAdmission(), Announce(True)]

    def stop(self) -> list[Action]:
        """Undrain: admit clients again (idempotent)."""
        if not self.draining:
            return []
        self.state = "serving"
        return [OpenAdmission(), Announce(False)]

    def on_resync(self) -> list[Action]:
        """Mosquitto restarted (a new plugin run admits everyone): close admission again."""
        return [CloseAdmission()] if self.draining else []

    def on_tick(self, facts: Facts, now: float) -> list[Action]:
        self.facts = facts
        if not self.draining:
            return []
        out: list[Action] = []
        if facts.clients and (self._kicked_at is None or now - self._kicked_at >= KICK_EVERY):
            self._kicked_at = now
            self.kicks += 1
            out.append(KickAll())
        if self._kicked_at is None:  # nobody was connected: nothing to wait for
            self._kicked_at = now - HAND_OFF_AFTER
        if facts.sessions_owned and not facts.clients and facts.peers_up \
                and now - self._kicked_at >= HAND_OFF_AFTER \
                and (self._handed_at is None or now - self._handed_at >= HAND_OFF_EVERY):
            self._handed_at = now
            self.hand_offs += 1
            out.append(HandOff())
        done = self._done(facts)
        if done and self.state == "draining":
            self.state, self.finished = "drained", now
        elif not done and self.state == "drained":  # something came back (a resync)
            self.state, self.finished = "draining", 0.0
        return out

    @staticmethod
    def _done(f: Facts) -> bool:
        return not (f.clients or f.sessions_owned or f.session_copies or f.session_ops
                    or f.records_unsent or f.unsettled or f.queued) and f.quiet

    def progress(self, now: float) -> Progress:
        f = self.facts
        if not self.draining:
            phase = ""
        elif self.state == "drained":
            phase = "drained"
        elif f.clients:
            phase = "disconnecting"
        elif f.sessions_owned or f.session_copies or f.session_ops or f.records_unsent:
            phase = "moving sessions"
        else:
            phase = "settling"
        note = ""
        if self.draining and f.sessions_owned and not f.peers_up:
            note = "no other node is up to take the sessions owned here"
        elif self.draining and f.queued_down:
            note = (f"{f.queued_down} messages wait for peers that are down (kept in this "
                    "node's spill across a restart; lost if the node is removed)")
        end = self.finished or now
        return Progress(self.state, phase, self.started_wall,
                        round(end - self.started, 3) if self.started_wall else 0.0,
                        f.clients, f.sessions_owned, f.session_copies,
                        f.unsettled + f.queued, f.queued_down, self.kicks, self.hand_offs,
                        note, f.session_messages)
