"""Which peer frames need which capability, and what a mixed cluster lacks (sans-IO).

A node never sends a peer a frame of a feature that peer does not have (issue 20): the
transport asks `needs(frame)` for every frame it queues and withholds (counts, drops) the ones
whose capability the handshake did not settle on. The services also leave such peers out of
their exchanges (they would wait for answers that never come); this is the backstop.

A serialized `Frame` starts with the tag of its one body field, so the check reads one varint.
"""

from __future__ import annotations

from sidecar.peering.handshake import (
    CAPABILITIES,
    CATCH_UP,
    DRAIN,
    INTEREST_CHUNKS,
    RECORDS,
    RETAINED,
    SESSION_CLAIMS,
    SESSION_CUTS,
    SESSION_CUTS_ANYWHERE,
    SESSION_ORDER,
    SESSION_REPLICAS,
    SESSIONS,
    WILLS,
)

__all__ = ["FRAME_FIELDS", "MISSING_MEANS", "features_off", "needs"]

FRAME_FIELDS: dict[int, str] = {
    10: RETAINED, 11: RETAINED, 12: RETAINED, 13: RETAINED,  # retained_*
    14: INTEREST_CHUNKS,  # interest_applied
    20: SESSIONS, 21: SESSIONS, 22: SESSIONS, 23: SESSIONS, 24: SESSIONS,  # session_*
    25: SESSION_CLAIMS, 26: SESSION_CLAIMS,  # session_claim, session_claimed
    30: WILLS, 31: WILLS,  # will_*
    40: DRAIN,  # node_state
}
"""`Frame.body` field number -> the capability a peer needs to read it (others: every peer)."""

MISSING_MEANS: dict[str, str] = {
    RETAINED: "retained messages are not replicated between them",
    SESSIONS: "sessions do not move between them (a client resuming on the other starts "
              "afresh; its queued messages stay behind)",
    WILLS: "neither publishes the other's wills when it dies or drains",
    SESSION_REPLICAS: "the older node holds no session replicas",
    DRAIN: "the older node does not learn of a drain (it may still count the draining node "
           "as a replica)",
    INTEREST_CHUNKS: "interest snapshots go in one frame; no interest lag is measured",
    SESSION_ORDER: "a client moving from the older node gets the messages routed to it on "
                   "the new one meanwhile before the queue it left behind",
    SESSION_CUTS: "a client moving between them under traffic may get some messages twice "
                  "(those routed to both of its copies while it moved)",
    SESSION_CUTS_ANYWHERE: "a client that reconnects through both faster than its last "
                           "connect's record travels may get some messages twice (the cut "
                           "goes only to the node that record names)",
    SESSION_CLAIMS: "a client that reconnects through both faster than a session record "
                    "travels may be admitted by both at once and get some messages twice",
    RECORDS: "messages between them travel as envelopes, decoded and encoded again on the "
             "receiving side (more CPU per message)",
    CATCH_UP: "a subscription counts on the other node only once it learnt of it (publishes "
              "there between the SUBACK and then are missed)",
}
"""What a pair of nodes lacks when one of them lacks a capability (`ctl status`)."""
assert set(MISSING_MEANS) == CAPABILITIES


def _tag(data: bytes) -> int | None:
    """The field number of the first field of a serialized message (None: empty, or a
    malformed varint)."""
    value = shift = 0
    for i, byte in enumerate(data[:5]):
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value >> 3
        shift += 7
        if i == 4:
            break
    return None


def needs(frame: bytes) -> str | None:
    """The capability a peer needs to read `frame` (a serialized `Frame`), or None."""
    field = _tag(frame)
    return None if field is None else FRAME_FIELDS.get(field)


def features_off(capabilities: frozenset[str]) -> list[str]:
    """The features of this version not in effect with a peer, sorted."""
    return sorted(CAPABILITIES - capabilities)
