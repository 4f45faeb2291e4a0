"""QoS 2 messages awaiting their release travel from the plugin's `unreleased` reply, through
the first backlog frame, to the `release` command, with their packet ids and properties."""

from __future__ import annotations

import pytest

from sidecar._proto import peer_pb2
from sidecar.message import MessageProperties
from sidecar.routing.forwarder import Envelope
from sidecar.sessions import wire
from sidecar.sessions.unreleased import (
    Unreleased,
    from_plugin,
    problem,
    to_plugin,
    without_resent,
)

PROPS = MessageProperties(user=(("k", "v"),), content_type="text/plain")


def test_the_plugin_reply_becomes_messages_and_back() -> None:
    reply = {"messages": [
        {"mid": 449, "topic": "a/b", "payload": "aGk=", "qos": 2,
         "properties": {"user": [["k", "v"]], "content_type": "text/plain"},
         "subscription_ids": [3, 9]},
        {"mid": 450, "topic": "a/c", "payload": "", "qos": 2, "pubrel": True}]}
    got = from_plugin(reply)
    assert got == [Unreleased(449, "a/b", b"hi", 2, PROPS, (3, 9)),
                   Unreleased(450, "a/c", b"", 2, pubrel=True)]
    assert to_plugin(got) == [
        {"mid": 449, "topic": "a/b", "payload": "aGk=", "qos": 2,
         "properties": {"user": [["k", "v"]], "content_type": "text/plain"},
         "subscription_ids": [3, 9]},
        {"mid": 450, "topic": "a/c", "payload": "", "qos": 2, "properties": {},
         "pubrel": True}]
    assert from_plugin({}) == [] and from_plugin({"messages": None}) == []


@pytest.mark.parametrize("item", [
    "nope", {"mid": 1, "topic": "a", "qos": 2}, {"mid": 1, "topic": "a", "payload": "%%", "qos": 2},
    {"mid": "x", "topic": "a", "payload": "", "qos": 2},
    {"mid": 1, "topic": "a", "payload": "", "qos": 2, "properties": {"user": "k"}},
    {"mid": 1, "topic": "a", "payload": "", "qos": 2, "subscription_ids": ["x"]}])
def test_a_malformed_reply_is_refused(item) -> None:
    with pytest.raises(ValueError):
        from_plugin({"messages": [item]})


def test_the_first_backlog_frame_carries_them_with_their_ids() -> None:
    u = Unreleased(7, "a/b", b"x", 2, PROPS, (4,))
    released = Unreleased(8, "a/b", b"z", 2, pubrel=True)
    env = Envelope("n1", 1, 5, 9, u.topic, u.payload, u.qos, False, u.properties,
                   subscription_ids=u.subscription_ids)
    env2 = Envelope("n1", 1, 7, 9, released.topic, released.payload, 2)
    queued = Envelope("n1", 1, 6, 9, "a/q", b"y", 1, subscription_ids=(2, 268_435_455))
    frame = peer_pb2.Frame.FromString(
        wire.backlog_frame("dev", 3, [queued], [(u, env), (released, env2)]))
    msg = frame.session_backlog
    assert [(e.topic, e.subscription_ids) for e in wire.backlog_from(msg)] == [
        ("a/q", (2, 268_435_455))]
    assert wire.unreleased_from(msg) == [u, released]
    plain = peer_pb2.Frame.FromString(wire.backlog_frame("dev", 4, [queued])).session_backlog
    assert wire.unreleased_from(plain) == []


@pytest.mark.parametrize(("u", "expected"), [
    (Unreleased(0, "a", b"", 2), "packet id 0 outside 1..65535"),
    (Unreleased(65536, "a", b"", 2), "packet id 65536 outside 1..65535"),
    (Unreleased(1, "a", b"", 0), "QoS 0"),
    (Unreleased(1, "", b"", 2), "empty topic"),
    (Unreleased(1, "a", b"", 2, subscription_ids=(0,)),
     "subscription identifiers [0] out of range"),
    (Unreleased(1, "a", b"", 2, subscription_ids=(1,) * 65),
     "subscription identifiers [1, 1, 1, 1] out of range"),
    (Unreleased(65535, "a", b"", 2), None)])
def test_a_peers_message_is_checked_before_release(u, expected) -> None:
    assert problem(u) == expected


def test_the_drained_queue_leaves_out_what_travels_as_unreleased() -> None:
    class Msg:
        def __init__(self, mid: int, qos: int) -> None:
            self.mid, self.qos = mid, qos

    collected = [(Msg(5, 2), "a"), (Msg(6, 2), "b"), (Msg(6, 1), "c"), (Msg(7, 2), "d")]
    assert [q for _, q in without_resent(collected, {6, 9})] == ["a", "c", "d"]
    assert without_resent(collected, ()) == collected
