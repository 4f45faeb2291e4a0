"""The peer stream handshake: check a peer's Hello (or Welcome) against this node's identity.

The dialling side sends its `Hello`; the accepting side runs `Handshake.check` on it and answers
with a Welcome carrying its own `Hello` fields (`Accept.welcome`) or a `Refuse`. The dialling side
runs `check` on the Welcome too (the same rules apply in both directions). Rules, in order:

1. same cluster id, else WRONG_CLUSTER;
2. a protocol major this node supports, else UNSUPPORTED_VERSION (minor versions always mix:
   unknown fields are ignored, new behaviour hides behind capabilities);
3. not this node's own node id, else DUPLICATE_NODE (a second node configured with our id, or a
   node that dialled itself);
4. an incarnation not lower than the highest one accepted before for that node id, else
   STALE_INCARNATION (an older process of a node that has restarted since).

Accepted: the capabilities in effect are those both sides have, the protocol minor in effect
is the lower of both, and the peer's incarnation is remembered. A peer of a minor version from
before a feature had its flag (retained messages and sessions before 1.3, ...) has that feature
without listing it (`implied`): what it can read, not what it announces, decides.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

__all__ = [
    "CAPABILITIES",
    "CATCH_UP",
    "DRAIN",
    "INTEREST_CHUNKS",
    "LINKS",
    "PROTOCOL_MAJOR",
    "PROTOCOL_MINOR",
    "SUPPORTED_MAJORS",
    "Accept",
    "Handshake",
    "Hello",
    "Refuse",
    "RefuseCode",
    "RETAINED",
    "SESSIONS",
    "SESSION_CUTS",
    "SESSION_CLAIMS",
    "SESSION_CUTS_ANYWHERE",
    "SESSION_ORDER",
    "SESSION_REPLICAS",
    "RECORDS",
    "WILLS",
    "implied",
]

PROTOCOL_MAJOR = 1
PROTOCOL_MINOR = 3
"""1.3: every feature whose frames an older node cannot read has a capability flag, and a
node sends a peer only frames of features both have (`sidecar.peering.capabilities`);
NodeState frames (capability `drain`). 1.2: with a peer token, challenge-response
authentication before the Hello (the token itself never travels; sidecar/challenge.py; a 1.1
node presenting the token is refused), and the replicated will table (capability `wills`)."""
SUPPORTED_MAJORS: frozenset[int] = frozenset({1})
INTEREST_CHUNKS = "interest-chunks"
"""1.1: interest snapshots in chunks, and InterestApplied replies (interest lag)."""
WILLS = "wills"
"""1.2: WillRecords / WillRecordsAck frames (the replicated will table, issue 19)."""
RETAINED = "retained"
"""Retained* frames (the replicated retained index); every 1.1 and 1.2 node has them."""
SESSIONS = "sessions"
"""Session* frames (the session registry, moves and backlogs); every 1.1 and 1.2 node."""
SESSION_REPLICAS = "session-replicas"
"""The node makes replicas of persistent sessions (no frame of its own: a node without it is
never counted as a replica); every 1.2 node."""
DRAIN = "drain"
"""1.3: NodeState frames (a node tells its peers it drains: they stop counting it as a
replica or as a target for sessions)."""
CATCH_UP = "catch-up"
"""1.3: interest entries carry their subscribe time (`since_ms`); the receiver replays what its
new forwarding subscriptions missed (sidecar.routing.catchup). An older node ignores the
field."""
SESSION_ORDER = "session-order"
"""The old owner marks its last SessionBacklog frame of a hand-over (`last`), even an empty
one: the new owner keeps what reaches the moved client until then (order as on one broker)."""
SESSION_CUTS = "session-cuts"
"""The node re-injects peers' messages as batches naming each one's identity, and takes a
moving session's cut (envelopes with `first_seq`, `cut_client`; SessionBacklog's `cut_seq`
and granted identities): a client moving between two such nodes under traffic gets each
message once (docs/architecture.md §5). Listed only with `routing.inject_batches` on."""
SESSION_CUTS_ANYWHERE = "session-cuts-anywhere"
"""The node takes a new copy's cut from any peer and applies it only to a copy its client used
before that connect (the envelope's HLC is the connect's time): the new node of a move sends
its cut to every such peer, since the record of its client's last connect may not have reached
it yet (a quick reconnect). Listed only with `routing.inject_batches` on."""
SESSION_CLAIMS = "session-claims"
"""SessionClaim / SessionClaimed frames: a node admits a client whose session another node
owns only once every peer granted its claim, and keeps the client out while another node's
claim is in force (sidecar.sessions.claims)."""
RECORDS = "records"
"""The node takes plain messages as MQFB records (`MessageBatch.records`) and hands them to
its plugin as they are (sidecar.routing.records). Listed only with `routing.inject_batches`
on."""
LINKS = "links"
"""The node's Mosquitto takes its peers' plugin links (`routing.links`, experimental: issue
25) at the Hello's `mqtt_address`, with the password derived from the peer token. Not one of
`CAPABILITIES`: an option that is off by default, not a feature an older node lacks."""
CAPABILITIES: frozenset[str] = frozenset({INTEREST_CHUNKS, WILLS, RETAINED, SESSIONS,
                                          SESSION_REPLICAS, DRAIN, CATCH_UP, SESSION_ORDER,
                                          SESSION_CUTS, SESSION_CUTS_ANYWHERE, SESSION_CLAIMS,
                                          RECORDS})
"""Optional features this version implements."""
FLAGGED_SINCE = 3
"""From this minor on, a node lists every capability it has: nothing is implied."""
_IMPLIED: dict[int, frozenset[str]] = {
    0: frozenset(),  # 1.0 nodes differ (retained and sessions came within 1.0): none assumed
    1: frozenset({INTEREST_CHUNKS, RETAINED, SESSIONS}),
    2: frozenset({INTEREST_CHUNKS, RETAINED, SESSIONS, WILLS, SESSION_REPLICAS}),
}


def implied(minor: int) -> frozenset[str]:
    """What a peer of protocol 1.`minor` can do without listing it (releases from before the
    flag; from `FLAGGED_SINCE` on, nothing)."""
    return _IMPLIED.get(minor, frozenset()) if minor < FLAGGED_SINCE else frozenset()


class RefuseCode(enum.IntEnum):
    """Same numbers as ``Refuse.Code`` in peer.proto."""

    WRONG_CLUSTER = 1
    UNSUPPORTED_VERSION = 2
    STALE_INCARNATION = 3
    DUPLICATE_NODE = 4
    UNAUTHENTICATED = 5


@dataclass(frozen=True)
class Hello:
    """A node's identity as sent in Hello and Welcome frames."""

    cluster_id: str
    node_id: str
    incarnation: int
    grpc_address: str = ""
    mqtt_address: str = ""
    admin_address: str = ""
    protocol_major: int = PROTOCOL_MAJOR
    protocol_minor: int = PROTOCOL_MINOR
    capabilities: frozenset[str] = field(default=CAPABILITIES)


@dataclass(frozen=True)
class Accept:
    """The peer is admitted. Send `welcome` back when answering a Hello."""

    peer: Hello
    welcome: Hello
    capabilities: frozenset[str]
    protocol_minor: int


@dataclass(frozen=True)
class Refuse:
    """The peer is refused: send a Refuse frame with these fields, then end the stream."""

    code: RefuseCode
    message: str
    supported_majors: tuple[int, ...]


class Handshake:
    """Handshake checks for one node; remembers the highest incarnation accepted per node id."""

    def __init__(self, me: Hello, supported_majors: frozenset[int] = SUPPORTED_MAJORS) -> None:
        self.me = me
        self.supported_majors = supported_majors
        self._incarnations: dict[str, int] = {}

    def check(self, peer: Hello) -> Accept | Refuse:
        """Check a peer's Hello (accepting side) or Welcome (dialling side)."""
        me = self.me
        who = f"peer {peer.node_id!r}"
        if peer.cluster_id != me.cluster_id:
            return self._refuse(
                RefuseCode.WRONG_CLUSTER,
                f"{who} belongs to cluster {peer.cluster_id!r}, this node {me.node_id!r}"
                f" to {me.cluster_id!r}",
            )
        if peer.protocol_major not in self.supported_majors:
            majors = ", ".join(f"{m}.x" for m in sorted(self.supported_majors))
            return self._refuse(
                RefuseCode.UNSUPPORTED_VERSION,
                f"{who} speaks peer protocol {peer.protocol_major}.{peer.protocol_minor},"
                f" this node {me.node_id!r} supports {majors}",
            )
        if peer.node_id == me.node_id:
            detail = (
                "this node connected to itself (check the peer addresses)"
                if peer.incarnation == me.incarnation
                else f"another process (incarnation {peer.incarnation}, ours {me.incarnation})"
                " is configured with the same node id"
            )
            return self._refuse(
                RefuseCode.DUPLICATE_NODE, f"{who} has this node's own node id: {detail}"
            )
        seen = self._incarnations.get(peer.node_id)
        if seen is not None and peer.incarnation < seen:
            return self._refuse(
                RefuseCode.STALE_INCARNATION,
                f"{who} has incarnation {peer.incarnation}, but incarnation {seen} of that node"
                " was already seen: this is an older process of a node that has restarted since",
            )
        self._incarnations[peer.node_id] = peer.incarnation
        return Accept(
            peer=peer,
            welcome=me,
            capabilities=me.capabilities & (peer.capabilities | implied(peer.protocol_minor)),
            protocol_minor=min(me.protocol_minor, peer.protocol_minor),
        )

    def incarnation(self, node_id: str) -> int | None:
        """The highest incarnation accepted for node_id, if any."""
        return self._incarnations.get(node_id)

    def forget(self, node_id: str) -> None:
        """Drop what is remembered about node_id (it left the cluster for good)."""
        self._incarnations.pop(node_id, None)

    def _refuse(self, code: RefuseCode, message: str) -> Refuse:
        return Refuse(code, message, tuple(sorted(self.supported_majors)))
