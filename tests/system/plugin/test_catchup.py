"""Catch-up ring (recent.c) on a real Mosquitto: the recent publishes a new forwarding
subscription missed, the control connection's observer subscription, bounds and stats."""

from __future__ import annotations

import base64
import time

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from tests.system.plugin.helpers import (
    SECRET,
    SIDECAR_ID,
    SIDECAR_USER,
    Client,
    FakeSidecar,
    RawClient,
)

pytestmark = pytest.mark.timeout(60)


def observe(sc: FakeSidecar) -> None:
    """What the sidecar does when catch-up is on: `#` at QoS 0, no retained messages."""
    rc, mid = sc.c.subscribe("#", options=SubscribeOptions(qos=0, retainHandling=2))
    assert rc == mqtt.MQTT_ERR_SUCCESS
    assert [c.value for c in sc._wait_ack(mid, 5)] == [0]


@pytest.fixture
def node(make_broker, clients):
    """A broker with catch-up on, the observing fake sidecar, a forwarding connection and a
    publisher."""
    b = make_broker(opts={"catchup_ms": 5000})
    sc = clients(FakeSidecar(b.sock)).start()
    observe(sc)
    fwd = clients(RawClient(SIDECAR_ID + ".fwd", sock=b.sock, username=SIDECAR_USER,
                            password=SECRET, clean_start=False, session_expiry=3600))
    fwd.connect()
    pub = clients(Client("pub", port=b.port))
    pub.connect()
    return b, sc, fwd, pub


def now_ms() -> int:
    return int(time.time() * 1000)


def catchup(sc: FakeSidecar, *filters: tuple[str, int]) -> dict:
    rep = sc.call("catchup", filters=[{"filter": f, "since": s} for f, s in filters])
    assert rep["ok"], rep
    return rep


def replayed(rep: dict) -> list[tuple[str, bytes]]:
    return [(m["topic"], base64.b64decode(m["payload"])) for m in rep["messages"]]


def test_catchup_returns_what_no_forwarding_subscription_took(node):
    b, sc, fwd, pub = node
    fwd.subscribe("a/#", 2, no_local=True)
    t0 = now_ms()
    pub.publish("a/1", b"taken", qos=1)           # the forwarding connection got it
    pub.publish("b/1", b"missed", qos=1)          # nobody did
    pub.publish("b/2", b"q0", qos=0)
    pub.publish("b/ret", b"retained", qos=1, retain=True)  # its own path
    pub.publish("c/1", b"other", qos=1)           # not asked for
    fwd.wait_messages(lambda m: m.topic == "a/1")
    time.sleep(0.1)
    rep = catchup(sc, ("b/#", t0), ("a/#", t0))
    assert replayed(rep) == [("b/1", b"missed"), ("b/2", b"q0")]
    assert [(m["qos"], m["plain"], m["shared"]) for m in rep["messages"]] == [
        (1, True, []), (0, True, [])]
    assert all(m["t"] >= t0 for m in rep["messages"])
    assert rep["complete"] is True
    # the observer subscription gets nothing, yet counts as a subscriber
    assert not sc.other
    st = sc.call("stats")
    assert st["catchup"] is True and st["catchup_entries"] == 4
    assert st["catchup_replayed"] == 2 and st["catchup_requests"] == 1


def test_catchup_counts_from_the_subscribe_time(node):
    b, sc, fwd, pub = node
    pub.publish("s/1", b"before", qos=1)
    time.sleep(0.05)
    since = now_ms()
    pub.publish("s/1", b"after", qos=1)
    time.sleep(0.05)
    assert replayed(catchup(sc, ("s/1", since))) == [("s/1", b"after")]
    assert replayed(catchup(sc, ("s/+", since - 1000))) == [("s/1", b"before"),
                                                            ("s/1", b"after")]


def test_qos2_counts_at_its_pubrel(node, clients):
    b, sc, fwd, pub = node
    raw = clients(RawClient("raw-pub", port=b.port))
    raw.connect()
    t0 = now_ms()
    early = raw.publish("q/1", b"released", qos=2)
    raw.pubrel(early)                              # routed now, to nobody
    waiting = raw.publish("q/2", b"waiting", qos=2)  # routed at its PUBREL
    rep = catchup(sc, ("q/#", t0))
    assert replayed(rep) == [("q/1", b"released")]
    assert sc.call("stats")["catchup_pending"] == 1
    fwd.subscribe("q/#", 2, no_local=True)
    raw.pubrel(waiting)                            # now the forwarding connection takes it
    fwd.wait_messages(lambda m: m.topic == "q/2")
    assert replayed(catchup(sc, ("q/#", t0))) == [("q/1", b"released")]
    assert sc.call("stats")["catchup_pending"] == 0


def test_shared_catchup_until_the_group_is_joined(node):
    b, sc, fwd, pub = node
    fwd.subscribe("s/#", 2, no_local=True)        # plain interest of another node
    t0 = now_ms()
    pub.publish("s/1", b"no member yet", qos=1)
    fwd.wait_messages(lambda m: m.topic == "s/1")
    fwd.subscribe("$share/g/s/#", 2)               # the group's first member elsewhere
    pub.publish("s/2", b"member picked", qos=1)
    fwd.wait_messages(lambda m: m.payload == b"member picked", count=2)
    rep = catchup(sc, ("s/#", t0), ("$share/g/s/#", t0))
    # the plain filter: the forwarding connection had both; the group: only s/1 was missed
    assert replayed(rep) == [("s/1", b"no member yet")]
    assert rep["messages"][0]["plain"] is False and rep["messages"][0]["shared"] == [1]
    assert replayed(catchup(sc, ("$share/other/s/#", t0))) == []  # never joined here


def test_properties_are_kept(node):
    b, sc, fwd, pub = node
    props = Properties(PacketTypes.PUBLISH)
    props.UserProperty = [("k", "v"), ("k", "w")]
    props.ResponseTopic = "reply/1"
    props.CorrelationData = b"\x01\x02"
    props.ContentType = "text/plain"
    t0 = now_ms()
    pub.publish("p/1", b"req", qos=1, properties=props)
    rep = catchup(sc, ("p/1", t0))
    assert rep["messages"][0]["properties"] == {
        "user": [["k", "v"], ["k", "w"]], "response_topic": "reply/1",
        "correlation_data": base64.b64encode(b"\x01\x02").decode(),
        "content_type": "text/plain"}


def test_sidecar_and_retained_reads_are_unchanged(node, clients):
    """Re-injections are not kept; the control connection still reads retained messages."""
    b, sc, fwd, pub = node
    t0 = now_ms()
    fwd.publish("r/1", b"reinjected", qos=1)
    pub.publish("r/ret", b"kept", qos=1, retain=True)
    assert replayed(catchup(sc, ("r/#", t0))) == []
    sc.subscribe("r/ret", 0)
    got = sc.wait_messages(lambda m: m.topic == "r/ret")
    assert got and got[0].payload == b"kept" and got[0].retain
    sub = clients(Client("plain-sub", port=b.port))
    sub.connect()
    sub.subscribe("r/#", 1)
    pub.publish("r/live", b"live", qos=1)
    assert sub.wait_messages(lambda m: m.topic == "r/live")
    time.sleep(0.1)
    assert [m.topic for m in sc.other] == ["r/ret"]


def test_bounds_and_stats(make_broker, clients):
    b = make_broker(opts={"catchup_ms": 300, "catchup_bytes": 4096})
    sc = clients(FakeSidecar(b.sock)).start()
    observe(sc)
    pub = clients(Client("pub", port=b.port))
    pub.connect()
    t0 = now_ms()
    for i in range(40):
        pub.publish(f"x/{i}", b"y" * 100, qos=1)
    st = sc.call("stats")
    assert 0 < st["catchup_entries"] < 40 and st["catchup_bytes"] <= 4096
    rep = catchup(sc, ("x/#", t0))
    assert rep["complete"] is False and len(rep["messages"]) == st["catchup_entries"]
    assert [m["topic"] for m in rep["messages"]] == [f"x/{i}" for i in range(
        40 - st["catchup_entries"], 40)]
    time.sleep(0.6)  # older than the window: dropped at a tick
    st = sc.call("stats")
    assert st["catchup_entries"] == 0 and st["catchup_bytes"] == 0
    assert st["catchup_incomplete"] == 1


def test_bad_requests_and_disabled(broker, sidecar, make_broker, clients):
    assert sidecar.call("catchup", filters=[{"filter": "a", "since": 1}])["error"] == "disabled"
    b = make_broker(opts={"catchup_ms": 1000})
    sc = clients(FakeSidecar(b.sock)).start()
    for bad in ([], "x", [{"filter": "a/#/b", "since": 1}], [{"filter": "a", "since": -1}],
                [{"filter": "$share//a", "since": 1}], [{"filter": "$share/g+/a", "since": 1}],
                [{"filter": "$share/g", "since": 1}], [{"since": 1}],
                [{"filter": "a", "since": 1}] * 1001):
        assert sc.call("catchup", filters=bad)["error"] == "bad_request", bad
    with pytest.raises(Exception, match="catchup_ms"):
        make_broker(opts={"catchup_ms": 600001})


def test_replies_follow_routing_order_and_skip_what_was_never_routed(node, clients):
    b, sc, fwd, pub = node
    raw = clients(RawClient("raw-order", port=b.port))
    raw.connect()
    t0 = now_ms()
    late = raw.publish("o/1", b"first published", qos=2)
    raw.publish("o/2", b"first routed", qos=1)
    raw.pubrel(late)
    assert replayed(catchup(sc, ("o/#", t0))) == [("o/2", b"first routed"),
                                                  ("o/1", b"first published")]
    # a shed publish is never routed: never replayed
    fwd.subscribe("shed/#", 2, no_local=True)
    assert sc.call("pressure", unacked=1, taken=0, shed_ms=60000)["shedding"] is True
    victim = clients(Client("victim", port=b.port))
    victim.connect()
    victim.c.publish("shed/1", b"refused", qos=1)
    assert victim.wait_disconnected(5)
    sc.call("pressure", unacked=0, taken=0, shed_ms=0)
    assert replayed(catchup(sc, ("shed/#", t0))) == []


class _NoAck(RawClient):
    """A sidecar connection that never acknowledges what it receives (events stay in flight)."""

    def _handle(self, first: int, body: bytes) -> None:
        if first >> 4 != 3:
            super()._handle(first, body)


def test_observer_does_not_refuse_the_control_sessions_queued_messages(node, clients):
    """At a reconnect Mosquitto re-checks the session's queued messages (READ): refusing them
    dropped in-flight events without their quota and the session stalled."""
    b, sc, fwd, pub = node
    sc.close()
    raw = _NoAck(SIDECAR_ID, sock=b.sock, username=SIDECAR_USER, password=SECRET,
                 clean_start=False, session_expiry=1234567891)
    raw.connect()
    raw._send(0x30 | 2, b"\x00\x11$CONTROL/mqfed/v1" + b"\x00\x01" + b"\x00" + (
        b'{"v":1,"id":"r","reply":"$SYS/broker/mqfed/replies/r","cmd":"snapshot"}'))
    subscriber = clients(Client("events-maker", port=b.port))
    subscriber.connect()
    subscriber.subscribe([(f"ev/{i}", 1) for i in range(200)])  # events, left in flight
    time.sleep(0.3)
    raw.close()
    sc2 = clients(FakeSidecar(b.sock))
    sc2.connect()
    assert sc2.call("stats")["ok"] is True
