"""Capabilities (issue 20): what a peer of each version can read, and the frames a node
withholds from a peer without the feature."""

from __future__ import annotations

from dataclasses import replace

from sidecar._proto import peer_pb2
from sidecar.peering.capabilities import FRAME_FIELDS, MISSING_MEANS, features_off, needs
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
    Accept,
    Handshake,
    Hello,
    implied,
)

ME = Hello("prod", "n1", incarnation=1)


def accept(minor: int, capabilities: frozenset[str]) -> Accept:
    result = Handshake(ME).check(Hello("prod", "n2", incarnation=1, protocol_minor=minor,
                                       capabilities=capabilities))
    assert isinstance(result, Accept)
    return result


def test_every_frame_body_of_a_feature_names_its_capability():
    bodies = {f.number: f.name for f in peer_pb2.Frame.DESCRIPTOR.oneofs_by_name["body"].fields}
    prefixes = {"retained_": RETAINED, "session_": SESSIONS, "will_": WILLS}
    for number, name in bodies.items():
        wanted = next((cap for p, cap in prefixes.items() if name.startswith(p)), None)
        wanted = {"interest_applied": INTEREST_CHUNKS, "node_state": DRAIN,
                  "session_claim": SESSION_CLAIMS,
                  "session_claimed": SESSION_CLAIMS}.get(name, wanted)
        assert FRAME_FIELDS.get(number) == wanted, name
    # session-replicas, session-order, session-cuts(-anywhere) and catch-up have no frame of
    # their own (catch-up is a field of interest entries, session-order one of session
    # backlogs, session-cuts fields of envelopes and backlogs: an older node ignores them;
    # session-cuts-anywhere says who may get a cut envelope; records is a field of message
    # batches, sent only to a peer that lists it: an older node would drop it unread)
    assert set(FRAME_FIELDS.values()) | {SESSION_REPLICAS, CATCH_UP, SESSION_ORDER,
                                         SESSION_CUTS, SESSION_CUTS_ANYWHERE, RECORDS} \
        == CAPABILITIES \
        == set(MISSING_MEANS)


def test_needs_reads_the_body_field_of_a_serialized_frame():
    frame = peer_pb2.Frame(session_records=peer_pb2.SessionRecords()).SerializeToString()
    assert needs(frame) == SESSIONS
    assert needs(peer_pb2.Frame(node_state=peer_pb2.NodeState(draining=True))
                 .SerializeToString()) == DRAIN
    assert needs(peer_pb2.Frame(heartbeat=peer_pb2.Heartbeat(sent_at_ms=5))
                 .SerializeToString()) is None
    batch = peer_pb2.Frame(message_batch=peer_pb2.MessageBatch()).SerializeToString()
    assert needs(batch) is None
    assert needs(b"") is None and needs(b"\xff\xff\xff\xff\xff\xff") is None


def test_older_minors_imply_the_features_they_had_before_their_flags():
    assert implied(0) == frozenset()
    assert implied(1) == {INTEREST_CHUNKS, RETAINED, SESSIONS}
    assert implied(2) == {INTEREST_CHUNKS, RETAINED, SESSIONS, WILLS, SESSION_REPLICAS}
    assert implied(3) == implied(9) == frozenset()  # from 1.3 on every flag is listed


def test_a_1_1_peer_gets_retained_and_session_frames_but_no_wills():
    old = accept(1, frozenset({INTEREST_CHUNKS}))
    assert old.capabilities == {INTEREST_CHUNKS, RETAINED, SESSIONS}
    assert features_off(old.capabilities) == sorted({WILLS, SESSION_REPLICAS, DRAIN, CATCH_UP,
                                                     SESSION_ORDER, SESSION_CUTS,
                                                     SESSION_CUTS_ANYWHERE, SESSION_CLAIMS,
                                                     RECORDS})
    assert accept(2, frozenset({INTEREST_CHUNKS, WILLS})).capabilities == \
        CAPABILITIES - {DRAIN, CATCH_UP, SESSION_ORDER, SESSION_CUTS, SESSION_CUTS_ANYWHERE,
                        SESSION_CLAIMS, RECORDS}
    assert accept(0, frozenset()).capabilities == frozenset()


def test_a_current_peer_without_a_flag_does_not_get_the_feature():
    caps = accept(3, CAPABILITIES - {RETAINED}).capabilities
    assert RETAINED not in caps and features_off(caps) == [RETAINED]
    assert accept(3, CAPABILITIES).capabilities == CAPABILITIES
    assert Handshake(replace(ME, capabilities=frozenset({SESSIONS}))).check(
        Hello("prod", "n2", incarnation=1, protocol_minor=1)).capabilities == {SESSIONS}
