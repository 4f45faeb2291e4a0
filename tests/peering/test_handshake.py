"""Peer handshake: cluster, version, identity and incarnation checks; capabilities negotiation."""

from __future__ import annotations

from dataclasses import replace

from sidecar.peering.handshake import (
    PROTOCOL_MAJOR,
    Accept,
    Handshake,
    Hello,
    Refuse,
    RefuseCode,
)

ME = Hello("prod", "n1", incarnation=10, grpc_address="10.0.0.1:7000",
           mqtt_address="10.0.0.1:1883", capabilities=frozenset({"a", "b"}))
PEER = Hello("prod", "n4", incarnation=5, capabilities=frozenset({"b", "c"}))


def test_accept_negotiates_capabilities_and_minor():
    hs = Handshake(ME)
    result = hs.check(replace(PEER, protocol_minor=3))
    assert isinstance(result, Accept)
    assert result.welcome == ME and result.peer.node_id == "n4"
    assert result.capabilities == {"b"}
    assert result.protocol_minor == ME.protocol_minor
    assert hs.incarnation("n4") == 5


def test_other_cluster_is_refused_with_both_names():
    result = Handshake(ME).check(replace(PEER, cluster_id="x"))
    assert isinstance(result, Refuse) and result.code is RefuseCode.WRONG_CLUSTER
    assert result.message == "peer 'n4' belongs to cluster 'x', this node 'n1' to 'prod'"


def test_unsupported_major_is_refused_whatever_the_minor():
    result = Handshake(ME).check(replace(PEER, protocol_major=PROTOCOL_MAJOR + 1, protocol_minor=7))
    assert isinstance(result, Refuse) and result.code is RefuseCode.UNSUPPORTED_VERSION
    assert "speaks peer protocol 2.7" in result.message and "supports 1.x" in result.message
    assert result.supported_majors == (1,)
    assert isinstance(Handshake(ME).check(replace(PEER, protocol_minor=99)), Accept)


def test_own_node_id_is_refused():
    hs = Handshake(ME)
    itself = hs.check(replace(ME))
    assert isinstance(itself, Refuse) and itself.code is RefuseCode.DUPLICATE_NODE
    assert "connected to itself" in itself.message
    twin = hs.check(replace(ME, incarnation=11))
    assert isinstance(twin, Refuse) and twin.code is RefuseCode.DUPLICATE_NODE
    assert "same node id" in twin.message


def test_stale_incarnation_is_refused():
    hs = Handshake(ME)
    assert isinstance(hs.check(replace(PEER, incarnation=7)), Accept)
    assert isinstance(hs.check(replace(PEER, incarnation=7)), Accept)  # reconnect, same process
    stale = hs.check(replace(PEER, incarnation=6))
    assert isinstance(stale, Refuse) and stale.code is RefuseCode.STALE_INCARNATION
    assert "incarnation 6" in stale.message and "incarnation 7" in stale.message
    assert isinstance(hs.check(replace(PEER, incarnation=8)), Accept)  # restarted
    hs.forget("n4")
    assert isinstance(hs.check(replace(PEER, incarnation=1)), Accept)


def test_refused_peer_is_not_remembered():
    hs = Handshake(ME)
    hs.check(replace(PEER, cluster_id="x", incarnation=99))
    assert hs.incarnation("n4") is None


def test_codes_match_the_proto_enum():
    proto = open("proto/peer.proto").read()
    for code in RefuseCode:
        assert f"{code.name} = {code.value};" in proto
