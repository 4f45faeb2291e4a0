"""Peer session records are checked before they reach the registry (`wire.record_problem`)."""

from __future__ import annotations

import pytest

from sidecar._proto import peer_pb2
from sidecar.sessions import wire
from sidecar.sessions.record import SessionRecord


def _record(**fields) -> peer_pb2.SessionRecord:
    base = {"client": "dev-1", "owner": "n2", "connect_hlc": 1, "change_hlc": 1}
    return peer_pb2.SessionRecord(**{**base, **fields})


def _sub(filter: str, qos: int = 1, identifier: int = 0) -> peer_pb2.SessionSubscription:
    return peer_pb2.SessionSubscription(filter=filter, qos=qos, identifier=identifier)


def test_a_record_a_node_made_passes():
    record = SessionRecord("dev-1", "n2", 5, 6, "mqtt311", 600, subscriptions={"a/+": 1,
                           "$share/g/b/#": 2})
    assert wire.record_problem(wire.record_to_proto(record)) is None
    assert wire.record_problem(_record(protocol="")) is None  # an older peer's record


@pytest.mark.parametrize(("fields", "expected"), [
    ({"client": ""}, "empty client id"),
    ({"client": "a\x00b"}, "client id: contains U+0000"),
    ({"client": "x" * 70_000}, "client id: 70000 UTF-8 bytes"),
    ({"owner": ""}, "is not a node id"),
    ({"owner": "n 2"}, "is not a node id"),
    ({"protocol": "mqtt9"}, "unknown protocol"),
    ({"subscriptions": [_sub("a/#/b")]}, "'#' must be the last level"),
    ({"subscriptions": [_sub("")]}, "must not be empty"),
    ({"subscriptions": [_sub("a", qos=3)]}, "QoS 3"),
    ({"subscriptions": [_sub("a", identifier=268_435_456)]}, "identifier 268435456"),
])
def test_a_record_no_mosquitto_could_hold_is_named(fields, expected):
    problem = wire.record_problem(_record(**fields))
    assert problem is not None and expected in problem, problem
