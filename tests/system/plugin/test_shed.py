"""Overload shedding: while the cluster cannot take more copies, the plugin disconnects the
publishers of QoS > 0 messages the forwarding connection would get, before Mosquitto stores or
acknowledges them (so nothing acknowledged is ever discarded), without publishing their will."""

from __future__ import annotations

import time

import paho.mqtt.client as mqtt
import pytest

from tests.system.plugin.helpers import (
    SECRET,
    SIDECAR_ID,
    SIDECAR_USER,
    Client,
    FakeSidecar,
    RawClient,
    _str,
    _varint,
)

FWD_ID = SIDECAR_ID + ".fwd"


class Node:
    """A broker with the plugin, the fake sidecar, the forwarding connection subscribed to
    t/# and $share/g/s/#, and a watcher that sees everything ordinary subscribers would."""

    def __init__(self, make_broker, clients, **opts) -> None:
        self.clients = clients
        self.b = make_broker(opts=opts)
        self.sc = clients(FakeSidecar(self.b.sock)).start()
        self.fwd = self.connect_fwd()
        assert self.fwd.subscribe("t/#", 2, no_local=True, sub_id=1) == [2]
        assert self.fwd.subscribe("$share/g/s/#", 2, sub_id=2) == [2]
        self.watch = clients(Client("watch", port=self.b.port))
        self.watch.connect()
        assert self.watch.subscribe([("t/#", 2), ("local/#", 2), ("will/#", 2)]) == [2, 2, 2]

    def connect_fwd(self) -> RawClient:
        fwd = self.clients(RawClient(FWD_ID, sock=self.b.sock, username=SIDECAR_USER,
                                     password=SECRET, clean_start=False, session_expiry=3600))
        fwd.connect()
        return fwd

    def publisher(self, cid: str, **kw) -> RawClient:
        c = self.clients(RawClient(cid, port=self.b.port, will=("will/" + cid, b"gone", 1),
                                   **kw))
        c.connect()
        return c

    def stats(self) -> dict:
        return self.sc.call("stats")

    def watched(self, payload: bytes) -> bool:
        return any(m.payload == payload for m in self.watch.messages)


def shed(pub: RawClient, topic: str, payload: bytes, qos: int = 1) -> bool:
    """Publish without waiting; True if the broker closed the connection without an ack."""
    mid = pub.publish(topic, payload, qos=qos, wait=False)
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        if pub.closed:
            return not any(m == mid for _, m in pub.acks)
        if any(m == mid for _, m in pub.acks):
            return False
        time.sleep(0.01)
    raise AssertionError(f"neither an ack nor a disconnect for {payload!r}")


@pytest.fixture
def node(make_broker, clients) -> Node:
    return Node(make_broker, clients)


def test_while_the_sidecar_sheds_wanted_qos1_publishes_are_refused_without_will(node):
    assert node.stats()["fwd_filters"] == 2
    reply = node.sc.call("pressure", unacked=9000, taken=0, shed_ms=5000)
    assert reply["ok"] and reply["shedding"] and reply["shed_total"] == 0

    pub = node.publisher("pub")
    assert not shed(pub, "local/x", b"not-wanted")       # no peer wants it: accepted
    pub.publish("t/x", b"qos0", qos=0)                   # QoS 0: accepted
    assert node.watch.wait_messages(lambda m: m.payload == b"qos0") and not pub.closed
    assert not shed(pub, "other/x", b"other")            # under no forwarding filter
    assert shed(pub, "t/x", b"refused")                  # wanted, QoS 1: refused
    v3 = node.clients(Client("pub311", port=node.b.port, protocol=4,
                             will=("will/pub311", b"gone")))
    v3.connect()
    info = v3.c.publish("s/x", b"refused-v3", qos=2)     # wanted through the shared filter
    assert v3.wait_disconnected(3)
    # never acknowledged; paho marks it failed instead (not connected, is_published raises)
    # when the broker's close reaches its network thread before its own write returned
    assert info.rc != mqtt.MQTT_ERR_SUCCESS or not info.is_published()
    time.sleep(0.5)
    assert node.watched(b"not-wanted")
    assert not node.watched(b"refused") and not node.watched(b"refused-v3")
    assert [m.payload for m in node.watch.messages if m.topic.startswith("will/")] == []
    assert [m.payload for m in node.fwd.received()] == [b"qos0"]
    st = node.stats()
    assert st["shed_total"] == 2 and st["shedding"]
    assert "disconnected publisher 'pub'" in node.b.log()

    # the sidecar ends it: the same publisher reconnects and its resend is taken
    assert node.sc.call("pressure", unacked=100, taken=0, shed_ms=0)["shedding"] is False
    again = node.publisher("pub")
    assert not shed(again, "t/x", b"resent")
    assert node.fwd.wait_messages(lambda m: m.payload == b"resent")
    assert node.watch.wait_messages(lambda m: m.payload == b"resent")

    # a lease that is not renewed runs out by itself (a sidecar that died while shedding)
    node.sc.call("pressure", unacked=9000, taken=0, shed_ms=300)
    assert shed(node.publisher("pub2"), "t/y", b"in-lease")
    time.sleep(0.5)
    assert not shed(node.publisher("pub3"), "t/y", b"after-lease")
    assert node.stats()["shed_total"] == 3

    # filters the forwarding connection drops no longer count
    node.fwd._send(0xA2, (99).to_bytes(2, "big") + b"\x00" + b"\x00\x03t/#")
    node.fwd.wait_ack(11, 99)
    deadline = time.monotonic() + 3
    while node.stats()["fwd_filters"] != 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert node.stats()["fwd_filters"] == 1


def test_bad_pressure_reports_are_refused(node):
    for fields in ({}, {"unacked": 1, "shed_ms": 0}, {"unacked": 1, "taken": 0},
                   {"unacked": -1, "taken": 0, "shed_ms": 0},
                   {"unacked": 1, "taken": 0, "shed_ms": 600001}):
        reply = node.sc.call("pressure", **fields)
        assert reply["ok"] is False and reply["error"] == "bad_request"
    assert node.stats()["shedding"] is False


def test_copies_waiting_for_a_sidecar_that_is_down_shed_at_fwd_backlog_max(make_broker,
                                                                          clients):
    node = Node(make_broker, clients, fwd_backlog_max=20)
    node.sc.call("pressure", unacked=0, taken=0, shed_ms=0)
    node.fwd.drop()                       # the sidecar is gone; Mosquitto queues for its session
    pub = node.publisher("pub", clean_start=False, session_expiry=600)
    for i in range(20):
        assert not shed(pub, "t/n", f"m{i}".encode())
    assert not shed(pub, "local/n", b"local")            # not for the cluster: accepted
    assert shed(pub, "t/n", b"m20")
    st = node.stats()
    assert st["fwd_backlog"] == 20 and st["shedding"]
    assert [m.payload for m in node.watch.messages if m.topic.startswith("will/")] == []
    # a report that took nothing changes nothing: the 20 copies still wait
    node.sc.call("pressure", unacked=0, taken=0, shed_ms=0)
    assert shed(node.publisher("pub", clean_start=False, session_expiry=600), "t/n", b"m20")

    # the forwarding connection is back and takes every acknowledged message, in order
    fwd = node.connect_fwd()
    got = fwd.wait_messages(lambda m: m.topic == "t/n", count=20)
    assert [m.payload for m in got] == [f"m{i}".encode() for i in range(20)]
    assert node.stats()["fwd_backlog"] == 0
    pub = node.publisher("pub", clean_start=False, session_expiry=600)
    assert not shed(pub, "t/n", b"m20")
    assert fwd.wait_messages(lambda m: m.payload == b"m20")


def test_copies_the_sidecar_has_not_taken_count_until_it_reports_them(make_broker, clients):
    """The sidecar connected but behind: what it has not taken yet (its running count in each
    report against the copies routed to it) counts towards fwd_backlog_max."""
    node = Node(make_broker, clients, fwd_backlog_max=10)
    node.sc.call("pressure", unacked=0, taken=0, shed_ms=0)
    pub = node.publisher("pub")
    for i in range(6):
        assert not shed(pub, "t/n", f"m{i}".encode())
    node.sc.call("pressure", unacked=0, taken=2, shed_ms=0)   # took 2 of 6: 4 unread
    assert node.stats()["fwd_unread"] == 4
    node.sc.call("pressure", unacked=3, taken=2, shed_ms=0)   # + 3 it holds unacked
    for i in range(6, 9):
        assert not shed(pub, "t/n", f"m{i}".encode())
    assert node.stats()["fwd_backlog"] == 10                  # 3 + 4 + 3 routed since
    assert shed(pub, "t/n", b"m9")
    # it catches up: took all 9 (running count 11), acked them
    node.sc.call("pressure", unacked=0, taken=11, shed_ms=0)
    assert node.stats()["fwd_backlog"] == 0
    assert not shed(node.publisher("pub"), "t/n", b"m9")
    # a restarted sidecar counts from 0 again: its count is taken as new
    node.sc.call("pressure", unacked=0, taken=1, shed_ms=0)
    assert node.stats()["fwd_backlog"] == 0


def _subscribe_many(fwd: RawClient, filters: list[str], sub_id: int) -> list[int]:
    """One SUBSCRIBE packet for all `filters` (QoS 2, No Local), as the sidecar sends them."""
    mid = fwd._mid()
    props = b"\x0b" + _varint(sub_id)
    body = mid.to_bytes(2, "big") + _varint(len(props)) + props
    body += b"".join(_str(f) + bytes([2 | 0x04]) for f in filters)
    fwd._send(0x82, body)
    return fwd.wait_ack(9, mid)


def test_shed_matching_is_exact_beyond_4096_filters(node):
    """The forwarding filters are matched through a trie: with 6,001 of them a publish no filter
    matches is still accepted while shedding (it used to be refused past 4,096), and one the
    last filter added matches is refused."""
    literal = [f"many/{i}/x" for i in range(6000)]
    for i in range(0, len(literal), 500):
        assert _subscribe_many(node.fwd, literal[i:i + 500], 3) == [2] * 500
    assert _subscribe_many(node.fwd, ["wild/+/y/#"], 4) == [2]
    assert node.stats()["fwd_filters"] == 2 + 6001
    assert node.sc.call("pressure", unacked=9000, taken=0, shed_ms=10000)["shedding"]
    pub = node.publisher("pub-many")
    for topic in ("many/6000/x", "many/5999", "many/5999/x/z", "wild/a/z", "wild/y"):
        assert not shed(pub, topic, topic.encode()), f"{topic}: no filter matches it"
    for topic in ("many/5999/x", "many/0/x", "wild/a/y", "wild/a/y/b/c", "t/deep/er"):
        assert shed(node.publisher("pub-" + topic.replace("/", "-")), topic, b"wanted"), topic
    # removing filters takes them out of the trie too
    unsub = node.fwd._mid()
    node.fwd._send(0xA2, unsub.to_bytes(2, "big") + b"\x00" + _str("many/5999/x"))
    node.fwd.wait_ack(11, unsub)
    deadline = time.monotonic() + 3
    while node.stats()["fwd_filters"] != 2 + 6000 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not shed(node.publisher("pub-after"), "many/5999/x", b"unsubscribed")
