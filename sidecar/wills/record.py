"""`WillRecord`: what the cluster knows of one client id's will (sans-IO value).

Every node holds every record. A record is written by its owner (the node where the client's
latest connection is or was: armed, delayed, done) or by the node that published the will on
the owner's behalf (done). Order per client id: the connection first (a newer connect
supersedes every older will), then the state (done beats delayed beats armed, so a published
or cleared will stays done for that connection whatever arrives later), then whether the will
was handed over (orphaned), then the HLC of the change and the writer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from sidecar.message import MessageProperties

ARMED = "armed"
"""The client is connected to the owner; its will goes out when the connection ends."""
DELAYED = "delayed"
"""The connection ended at `since_ms`; the owner's Mosquitto publishes the will after its
delay unless the client comes back."""
DONE = "done"
"""Published, cleared, skipped or superseded: nothing more to do."""
STATES = (ARMED, DELAYED, DONE)

LEAVING = "leaving"
"""Orphaned: the owner drained and hands the will over (its Mosquitto stops)."""
LOST = "lost"
"""Orphaned: the Mosquitto that held the will is gone (it restarted)."""
ORPHANS = ("", LEAVING, LOST)

_RANK = {ARMED: 0, DELAYED: 1, DONE: 2}


@dataclass(frozen=True, slots=True)
class WillMessage:
    """A will as the client set it: `delay` is its Will Delay Interval in seconds; the
    properties include its Message Expiry Interval."""

    topic: str
    payload: bytes
    qos: int
    retain: bool
    delay: int = 0
    properties: MessageProperties = MessageProperties()


class Version(NamedTuple):
    connect_hlc: int
    rank: int
    orphaned: bool
    change_hlc: int
    writer: str


@dataclass(frozen=True, slots=True)
class WillRecord:
    """One client id's will as the cluster knows it.

    `epoch`: the owner's plugin epoch (the Mosquitto run holding the will).
    `connect_hlc`: the connection's connect HLC, as the session registry has it.
    `orphaned`: "" (the owner's Mosquitto holds it), `LEAVING` or `LOST`.
    `since_ms`: delayed: when the connection ended; orphaned: when it was handed over or lost.
    `expiry`: the session expiry (None: unknown), which caps the delay (MQTT 5).
    `will`: None once done. `outcome`: why it is done.
    """

    client: str
    owner: str
    epoch: str
    connect_hlc: int
    change_hlc: int
    writer: str
    state: str = ARMED
    orphaned: str = ""
    since_ms: int = 0
    expiry: int | None = None
    will: WillMessage | None = None
    outcome: str = ""

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise ValueError(f"will state must be one of {STATES}, not {self.state!r}")
        if self.orphaned not in ORPHANS:
            raise ValueError(f"will orphan mark must be one of {ORPHANS}, not {self.orphaned!r}")
        if self.state != DONE and self.will is None:
            raise ValueError(f"an {self.state} will record needs its will")

    @property
    def version(self) -> Version:
        return Version(self.connect_hlc, _RANK[self.state], bool(self.orphaned),
                       self.change_hlc, self.writer)

    @property
    def pending(self) -> bool:
        """The will may still have to be published."""
        return self.state != DONE


def newer(a: WillRecord, b: WillRecord | None) -> bool:
    """Whether `a` supersedes `b`."""
    return b is None or a.version > b.version


def delay_s(record: WillRecord, spec: bool = True) -> int:
    """Seconds from the end of the connection to the will: its Will Delay Interval, or the
    session's end if that comes first (MQTT 5, 3.1.2.5). `spec=False`: as Mosquitto 2.0.11
    does it, which does not shorten the delay for a session expiry of 0."""
    assert record.will is not None
    delay = record.will.delay
    if record.expiry is not None and (spec or record.expiry > 0):
        delay = min(delay, record.expiry)
    return max(delay, 0)
