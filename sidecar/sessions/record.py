"""`SessionRecord`: what the cluster knows of one client id's session (sans-IO value).

Every node holds every record. A record changes only on its owner (the node where the client
last connected); the newest wins everywhere, by `version`: the connect's HLC first (the latest
connect wins; stamped with the time Mosquitto accepted it, so two nodes may stamp the same
millisecond), then the HLC of the change, then the owner.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from sidecar.topics import SHARE_PREFIX

NEVER = 0xFFFFFFFF
"""Session Expiry Interval meaning "never" (MQTT v5; what Mosquitto reports for 3.1.x
clean session 0)."""


NO_LOCAL = 0x04
RETAIN_AS_PUBLISHED = 0x08


class Subscription(NamedTuple):
    """One subscription of a session: granted QoS, options, identifier (0: none)."""

    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    identifier: int = 0

    def pack(self) -> int:
        """As a `SessionRecord.subscriptions` value: the MQTT subscription options byte's QoS,
        No Local and Retain As Published bits, with the identifier above them."""
        return (self.qos | (NO_LOCAL if self.no_local else 0)
                | (RETAIN_AS_PUBLISHED if self.retain_as_published else 0)
                | self.identifier << 8)

    @classmethod
    def unpack(cls, value: int) -> Subscription:
        return cls(value & 0x03, bool(value & NO_LOCAL), bool(value & RETAIN_AS_PUBLISHED),
                   value >> 8)


class Version(NamedTuple):
    """Order of records of one client id."""

    connect_hlc: int
    change_hlc: int
    owner: str


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """One client id's session as the cluster knows it.

    `expiry`: Session Expiry Interval in seconds (None: unknown, treated as kept).
    `fresh`: the connect that made this record began a new session (clean start, or no
    session to resume where it connected): copies of an older session elsewhere are deleted.
    `deleted`: the session is gone (ended with expiry 0, expired, or discarded): a tombstone,
    kept for a while so an older record cannot bring it back.
    `subscriptions`: filter (verbatim, `$share/...` included) -> its QoS, options and
    identifier packed in an int (`Subscription.pack`; a plain QoS means default options).
    `client_connect_hlc`: after a drain handed the session to another node (a connect of the
    cluster's own, `connect_hlc`), the connect HLC of the client's last connection; 0 when
    `connect_hlc` is the client's.
    `settles_by_ms`: the owner is still taking the client's old queue from the node it came
    from (a move in progress) until this wall time at most (0: settled); other nodes admit
    the client only after that, so one move never outruns the previous one's hand-over.
    Not stored (a restarted owner has no move in progress).
    """

    client: str
    owner: str
    connect_hlc: int
    change_hlc: int
    protocol: str = "mqtt5"
    expiry: int | None = 0
    fresh: bool = True
    online: bool = True
    since_ms: int = 0
    deleted: bool = False
    subscriptions: dict[str, int] = field(default_factory=dict)
    client_connect_hlc: int = 0
    settles_by_ms: int = 0

    @property
    def client_connect(self) -> int:
        """The connect HLC of the client's own last connection."""
        return self.client_connect_hlc or self.connect_hlc

    @property
    def handed_off(self) -> bool:
        """Its owner got the session from a drain's hand-off, not from a connect of its
        client: the copy there may queue only once this record reached it."""
        return self.client_connect_hlc != 0

    @property
    def version(self) -> Version:
        return Version(self.connect_hlc, self.change_hlc, self.owner)

    @property
    def persistent(self) -> bool:
        """The session outlives its connection (a resumable session exists while not deleted)."""
        return not self.deleted and (self.expiry is None or self.expiry > 0)

    def expires_at_ms(self) -> int | None:
        """Wall time when an offline session expires (None: online, or never)."""
        if self.online or self.deleted or self.expiry is None or self.expiry >= NEVER:
            return None
        return self.since_ms + self.expiry * 1000


def replica_subscriptions(subscriptions: dict[str, int]) -> dict[str, int]:
    """What a replica of a session subscribes to: its subscriptions but the shared ones. A
    replica held while its client is online elsewhere would be a member of the client's
    shared groups on its node: its Mosquitto would pick it for a share of the group's
    messages (and refuse them, or queue them where the client is not), and peers would route
    a share there. Both lost half of a persistent shared subscriber's messages."""
    return {f: v for f, v in subscriptions.items() if not f.startswith(SHARE_PREFIX)}


def shared_subscriptions(subscriptions: dict[str, int]) -> dict[str, int]:
    """The shared ones (what a replica lacks until it becomes the session)."""
    return {f: v for f, v in subscriptions.items() if f.startswith(SHARE_PREFIX)}


def newer(a: SessionRecord, b: SessionRecord | None) -> bool:
    """Whether `a` supersedes `b`."""
    return b is None or a.version > b.version
