"""`ReinjectWindow`: which re-injections go to Mosquitto now, and which are confirmed (pure).

Every message the forwarding client publishes on its Mosquitto (forwarded copies, replicated
retained messages, barriers) passes through here. Mosquitto must *accept* a QoS > 0 message
before its origin may forget it, and it can refuse one: a PUBACK or PUBREC whose reason code is
0x80 or more (0x97 quota exceeded, 0x87 not authorized, 0x83 too large, ...). A refused message
is not confirmed; it is sent again after a backoff, and later messages on its topic wait behind
it, so per-topic order holds (MQTT's ordered topics). Other topics keep flowing.

QoS 1 and 2 publishes in flight (sent, not yet PUBACK/PUBCOMP) never exceed the Receive Maximum
Mosquitto announced in its CONNACK: an MQTT 5 Mosquitto refuses a QoS 2 PUBLISH beyond it
(0x97), and 2.0.11 may even queue one silently and lose it (its PUBREL then finds nothing).

Events in, actions out; no I/O, the clock is passed in. The adapter
(`sidecar.local.forward_client`) publishes each `Send` and calls `on_ack` with the ticket of
each PUBACK, PUBCOMP or failed PUBREC (it maps paho's mids to tickets).
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

from sidecar.message import MessageProperties

UNLIMITED = 65535
"""Receive Maximum when the CONNACK names none (MQTT 5: 65,535)."""
RETRY_FIRST = 0.05
RETRY_MAX = 5.0
PERSISTENT_AFTER = 5
"""Refusals of one message after which it is reported as persistent (logged as an error)."""

REASON_NAMES = {0x80: "unspecified", 0x83: "implementation_specific", 0x87: "not_authorized",
                0x90: "topic_name_invalid", 0x91: "packet_id_in_use", 0x97: "quota_exceeded",
                0x99: "payload_format_invalid"}


def reason_name(code: int) -> str:
    """A metric label for an MQTT 5 reason code."""
    return REASON_NAMES.get(code, f"0x{code:02x}")


@dataclass(slots=True)
class Reinjection:
    """One message to publish on the local Mosquitto; `ticket` names it to the caller."""

    ticket: int
    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: MessageProperties
    refusals: int = 0
    reason: int = 0


@dataclass(frozen=True, slots=True)
class Send:
    """Publish `item` now."""

    item: Reinjection


@dataclass(frozen=True, slots=True)
class Confirm:
    """Mosquitto accepted these tickets (QoS > 0): their origins may forget them."""

    tickets: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Refused:
    """Mosquitto refused `item` (its `reason`); it will be sent again. `persistent`: it has
    been refused PERSISTENT_AFTER times in a row (reported once)."""

    item: Reinjection
    persistent: bool


Action = Send | Confirm | Refused


@dataclass(slots=True)
class _Held:
    """Messages of one topic waiting behind a refused one, oldest first; `due`: when the
    first is sent again; `retrying`: the first, while it is sent again."""

    items: list[Reinjection]
    due: float
    retrying: Reinjection | None = None


def backoff(refusals: int, first: float = RETRY_FIRST, cap: float = RETRY_MAX) -> float:
    """Seconds before the next attempt after `refusals` refusals in a row: `first`, doubling,
    at most `cap`."""
    return min(cap, first * 2 ** max(0, refusals - 1))


@dataclass
class ReinjectWindow:
    """The in-flight window and the refusal holds of the forwarding client's publishes."""

    receive_maximum: int = UNLIMITED
    in_flight: dict[int, Reinjection] = field(default_factory=dict)  # ticket -> message
    waiting: deque[Reinjection] = field(default_factory=deque)  # for room in the window
    held: dict[str, _Held] = field(default_factory=dict)  # topic -> refused and behind it
    counters: dict[str, int] = field(default_factory=lambda: {"confirmed": 0, "refused": 0,
                                                              "retried": 0})
    refused_by_reason: dict[int, int] = field(default_factory=dict)

    # ---- events --------------------------------------------------------------------------
    def offer(self, item: Reinjection) -> list[Action]:
        """A new message to publish."""
        if item.qos == 0:
            return [Send(item)]  # never acknowledged, so never refused visibly
        hold = self.held.get(item.topic)
        if hold is not None:
            hold.items.append(item)
            return []
        if self.waiting or not self._room():
            self.waiting.append(item)
            return []
        return [self._send(item)]

    def on_connack(self, receive_maximum: int | None) -> list[Action]:
        """A (re)connection: Mosquitto's Receive Maximum (None: not announced, unlimited)."""
        self.receive_maximum = max(1, receive_maximum or UNLIMITED)
        return self._release()

    def on_ack(self, ticket: int, reason: int, now: float) -> list[Action]:
        """Mosquitto answered `ticket`'s publish: PUBACK, PUBCOMP, or a failed PUBREC."""
        item = self.in_flight.pop(ticket, None)
        if item is None:
            return []
        out: list[Action] = []
        hold = self.held.get(item.topic)
        if reason < 0x80:
            self.counters["confirmed"] += 1
            out.append(Confirm((item.ticket,)))
            if hold is not None and hold.retrying is item:
                self._retried(item.topic, hold, now)
        else:
            item.refusals += 1
            item.reason = reason
            self.counters["refused"] += 1
            self.refused_by_reason[reason] = self.refused_by_reason.get(reason, 0) + 1
            out.append(Refused(item, persistent=item.refusals == PERSISTENT_AFTER))
            if hold is None:
                hold = self.held[item.topic] = _Held([], 0.0)
                self._hold_waiting(item.topic, hold)
            if hold.retrying is item:
                hold.retrying = None
            else:  # in order among what waits for this topic (tickets grow with time)
                bisect.insort(hold.items, item, key=lambda i: i.ticket)
            if hold.items[0] is item:
                hold.due = now + backoff(item.refusals)
        return out + self._release()

    def on_timer(self, now: float) -> list[Action]:
        """Send again the first message of each topic whose backoff has passed."""
        out: list[Action] = []
        for hold in self.held.values():
            if hold.retrying is None and hold.due <= now and self._room():
                hold.retrying = hold.items[0]
                self.counters["retried"] += 1
                out.append(self._send(hold.items[0]))
        return out

    # ---- views ---------------------------------------------------------------------------
    def next_due(self) -> float | None:
        """When `on_timer` has something to send (None: nothing is held, or the window is
        full: an ack makes room, and the caller asks again then)."""
        if not self._room():
            return None
        dues = [h.due for h in self.held.values() if h.retrying is None]
        return min(dues) if dues else None

    @property
    def held_count(self) -> int:
        """Messages waiting behind a refusal."""
        return sum(len(h.items) for h in self.held.values())

    def status(self) -> dict[str, int]:
        return {"in_flight": len(self.in_flight), "waiting": len(self.waiting),
                "held": self.held_count, "held_topics": len(self.held),
                "receive_maximum": self.receive_maximum, **self.counters}

    # ---- internals -----------------------------------------------------------------------
    def _room(self) -> bool:
        return len(self.in_flight) < self.receive_maximum

    def _send(self, item: Reinjection) -> Send:
        self.in_flight[item.ticket] = item
        return Send(item)

    def _retried(self, topic: str, hold: _Held, now: float) -> None:
        """The message sent again was accepted: the topic flows again, unless an older
        message of it was refused meanwhile (then that one is next)."""
        item, hold.retrying = hold.retrying, None
        hold.items = [i for i in hold.items if i is not item]
        if any(i.refusals for i in hold.items):
            hold.due = now
            return
        del self.held[topic]
        self.waiting.extendleft(reversed(hold.items))

    def _hold_waiting(self, topic: str, hold: _Held) -> None:
        """Messages of `topic` not sent yet join its hold (they must follow the refused one)."""
        if any(i.topic == topic for i in self.waiting):
            hold.items.extend(i for i in self.waiting if i.topic == topic)
            self.waiting = deque(i for i in self.waiting if i.topic != topic)

    def _release(self) -> list[Action]:
        """Send what waits, while the window has room."""
        out: list[Action] = []
        while self.waiting and self._room():
            item = self.waiting.popleft()
            hold = self.held.get(item.topic)
            if hold is not None:
                bisect.insort(hold.items, item, key=lambda i: i.ticket)
            else:
                out.append(self._send(item))
        return out
