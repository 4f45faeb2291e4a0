"""Capture (capture.c, issue 25 slice 2): with `plugin_opt_capture_socket`, a client's message
that a plain subscription of `.fwd` matches becomes one MQFB record on a unix socket the
sidecar listens on, and Mosquitto queues `.fwd` no copy of it. Records stay until
acknowledged; a reconnect resends what is not; bad input from the sidecar closes the
connection without losing anything; past `capture_max_bytes` QoS 0 is dropped and QoS 1/2
takes the MQTT path."""

from __future__ import annotations

import asyncio
import base64
import re
import shutil
import struct
import threading
import time
from pathlib import Path

import pytest

from sidecar.local.capture_link import CaptureLink
from sidecar.local.capture_wire import Hello
from sidecar.message import MessageProperties
from tests.harness.procs import wait_for
from tests.system.plugin.capture_peer import CapturePeer
from tests.system.plugin.helpers import (
    SECRET,
    SIDECAR_ID,
    SIDECAR_USER,
    Client,
    FakeSidecar,
    RawClient,
    mosquitto_dir,
)

pytestmark = pytest.mark.timeout(90)

FWD_ID = SIDECAR_ID + ".fwd"
PROBE = "$SYS/broker/mqfed/fwd-probe"
# payload format 1, content type, response topic, correlation data, two user properties, and
# a message expiry of 300 s (which Mosquitto 2.0.11 keeps out of the MESSAGE callback's
# properties: the plugin reads it from the packet)
PUB_PROPS = (b"\x01\x01" b"\x03\x00\x04text" b"\x08\x00\x03r/1" b"\x09\x00\x02\x00c"
             b"\x26\x00\x01k\x00\x01v" b"\x26\x00\x01k\x00\x01w" b"\x02\x00\x00\x01\x2c")
REC_PROPS = MessageProperties(user=(("k", "v"), ("k", "w")), content_type="text",
                              payload_format=1, correlation_data=b"\x00c",
                              response_topic="r/1", message_expiry=300)


class Node:
    """A broker with capture on (or off), the fake sidecar's control connection, `.fwd` and
    a publisher; the capture socket's listener is `peer`."""

    def __init__(self, make_broker, clients, request, opts: dict | None = None,
                 capture: bool = True, resume=None, wrapper: list[str] | None = None) -> None:
        self.clients = clients
        self.dir = mosquitto_dir()
        request.addfinalizer(lambda: shutil.rmtree(self.dir, ignore_errors=True))
        self.path = str(self.dir / "capture.sock")
        self.peer = CapturePeer(self.path, resume) if capture else None
        if self.peer:
            request.addfinalizer(self.peer.close)
        o = {"capture_socket": self.path} if capture else {}
        self.b = make_broker(opts={**o, **(opts or {})}, wrapper=wrapper)
        self.sc = clients(FakeSidecar(self.b.sock)).start()
        self.fwd = self.sidecar_conn(FWD_ID)
        self.pub = clients(RawClient("pub", port=self.b.port))
        self.pub.connect()

    def sidecar_conn(self, cid: str) -> RawClient:
        c = self.clients(RawClient(cid, sock=self.b.sock, username=SIDECAR_USER,
                                   password=SECRET, clean_start=False, session_expiry=3600))
        c.connect()
        return c

    def stats(self) -> dict:
        return self.sc.call("stats")["capture"]

    def settle(self, conn: RawClient | None = None) -> None:
        """Everything published so far was routed: a message of the sidecar's control
        connection (never captured) reached `.fwd` (or `conn`) over MQTT."""
        mark = f"mark-{time.monotonic_ns()}".encode()
        self.sc.publish("t/mark", mark, qos=1)
        got = (conn or self.fwd).wait_messages(lambda m: m.payload == mark)
        assert got, "the marker did not reach .fwd"

    def fwd_copies(self, conn: RawClient | None = None) -> list[bytes]:
        return [m.payload for m in (conn or self.fwd).received(lambda m: m.topic != "t/mark")]


@pytest.fixture
def node(make_broker, clients, request) -> Node:
    n = Node(make_broker, clients, request)
    assert n.fwd.subscribe("t/#", 2, no_local=True, sub_id=1) == [2]
    n.peer.wait_hellos(1)
    return n


def test_messages_arrive_as_records_in_order_and_fwd_gets_no_copy(node):
    plain = node.clients(Client("plain", port=node.b.port))
    plain.connect()
    assert plain.subscribe("t/#", 2) == [2]
    node.pub.publish("t/0", b"zero", qos=0)
    node.pub.publish("t/1", b"one", qos=1, props=PUB_PROPS)
    node.pub.publish2("t/2", b"two")
    node.pub.publish("t/r", b"kept", qos=1, retain=True)
    node.pub.publish("t/e", b"", qos=1)
    node.pub.publish("u/none", b"not wanted", qos=1)   # no forwarding filter matches
    recs = node.peer.wait_records(5)
    assert [(r.seq, r.topic, r.payload, r.qos, r.retain, r.client, r.kind) for r in recs] == [
        (1, "t/0", b"zero", 0, False, "pub", 1), (2, "t/1", b"one", 1, False, "pub", 1),
        (3, "t/2", b"two", 2, False, "pub", 1), (4, "t/r", b"kept", 1, True, "pub", 1),
        (5, "t/e", b"", 1, False, "pub", 1)]
    assert recs[1].properties == REC_PROPS
    assert all(r.properties == MessageProperties() for r in recs if r.seq != 2)
    now = int(time.time() * 1000)
    assert all(now - 10000 < r.hlc >> 16 <= now for r in recs)
    assert [r.hlc for r in recs] == sorted({r.hlc for r in recs})   # strictly increasing
    # one batch at a time, named by its first record; the hello gave the first seq
    assert all(b.batch_id == b.records[0].seq for b in node.peer.batches)
    hello = node.peer.hellos[0]
    assert hello.next_seq == 1 and hello.epoch == int(node.sc.call("stats")["epoch"], 16)
    node.settle()
    assert node.fwd_copies() == []          # no MQTT copy of a captured message
    # other subscribers are served as always
    assert len(plain.wait_messages(lambda m: m.topic != "t/mark", count=5)) == 5
    st = node.stats()
    assert (st["on"], st["connected"], st["records"], st["buffered"], st["acked"],
            st["next_seq"], st["connects"]) == (True, True, 5, 5, 0, 6, 1)
    assert st["buffered_bytes"] == sum(len(r.topic) + len(r.client) + len(r.payload) + 34
                                       + (len(PUB_PROPS) if r.seq == 2 else 0)
                                       for r in recs)
    # acks free records: cumulative, then one listed above it
    node.peer.ack(2, (4,))
    wait_for(lambda: node.stats()["buffered"] == 2, 5, "the ack applied")
    node.peer.ack(5)
    wait_for(lambda: node.stats()["buffered"] == 0, 5, "the ack applied")
    st = node.stats()
    assert (st["acked"], st["buffered_bytes"], st["malformed"]) == (5, 0, 0)


def test_barrier_and_cut_markers_keep_their_place_among_the_records(node):
    """With capture on, a barrier probe the sidecar has delivered to `.fwd` (a token) is
    also a kind-4 record after the records captured before it, and a moving session's cut
    (hold.c) is a kind-2 record naming the client instead of the MQTT probe `cut:<id>`: the
    sidecar learns both in order with the records (routing.capture)."""
    node.pub.publish("t/1", b"one", qos=1)
    node.settle()
    token = base64.b64encode(b"barrier-1").decode()
    assert node.sc.call("deliver", client=FWD_ID, topic=PROBE, payload=token, qos=1)["ok"]
    assert node.sc.call("deliver", client=FWD_ID, topic=PROBE, payload="", qos=1)["ok"]
    node.pub.publish("t/2", b"two", qos=1)
    mover = node.clients(RawClient("mover", port=node.b.port, clean_start=False,
                                   session_expiry=300))
    mover.connect()
    mover.subscribe("m/#", 1)
    mover.disconnect()
    node.sc.wait_type("disconnect", client="mover")
    assert node.sc.call("hold", client="mover", on=True, cut=True)["ok"]   # at the tick
    recs = node.peer.wait_records(4)
    node.pub.publish("t/3", b"three", qos=1)
    recs = node.peer.wait_records(5)
    assert [(r.kind, r.topic, r.payload, r.client) for r in recs] == [
        (1, "t/1", b"one", "pub"), (4, "", b"barrier-1", ""), (1, "t/2", b"two", "pub"),
        (2, "", b"", "mover"), (1, "t/3", b"three", "pub")]
    assert [r.seq for r in recs] == [1, 2, 3, 4, 5]
    probes = [m.payload for m in node.fwd.received(lambda m: m.topic == PROBE)]
    assert probes == [b"barrier-1", b""]    # the MQTT probes still come; no `cut:` one


def test_message_expiry_is_what_remains_when_the_record_is_made(node):
    """A QoS 2 message is captured at its PUBREL: its record carries the expiry left then."""
    mid = node.pub.publish("t/q2", b"later", qos=2, props=b"\x02\x00\x00\x00\x64")
    node.pub.publish("t/q1", b"now", qos=1, props=b"\x26\x00\x01a\x00\x01b\x02\x00\x00\x00\x64")
    node.pub.publish("t/q0", b"none", qos=0, props=b"\x23\x00\x01")   # a topic alias only
    time.sleep(2.2)
    node.pub.pubrel(mid)
    recs = node.peer.wait_records(3)
    assert [(r.payload, r.properties.message_expiry) for r in recs[:2]] == [
        (b"now", 100), (b"none", None)]
    assert recs[0].properties.user == (("a", "b"),)
    assert recs[2].payload == b"later" and 95 <= recs[2].properties.message_expiry <= 98


def test_one_record_per_message_matching_several_fwd_subscriptions(node):
    assert node.fwd.subscribe("t/a", 1, no_local=True, sub_id=2) == [1]
    assert node.fwd.subscribe("t/+", 0, no_local=True, sub_id=3) == [0]
    node.pub.publish("t/a", b"q1", qos=1)
    node.pub.publish2("t/a", b"q2")
    node.pub.publish("t/a", b"q0", qos=0)
    recs = node.peer.wait_records(3)
    node.settle()
    time.sleep(0.2)
    assert [(r.seq, r.payload, r.qos) for r in node.peer.records] == [
        (1, b"q1", 1), (2, b"q2", 2), (3, b"q0", 0)]
    assert recs and node.fwd_copies() == []
    # a QoS 2 message released later than its PUBREC is found at its PUBREL
    mid = node.pub.publish("t/a", b"late", qos=2)
    node.pub.publish("t/a", b"between", qos=1)
    node.pub.pubrel(mid)
    assert [(r.seq, r.payload) for r in node.peer.wait_records(5)[3:]] == [
        (4, b"between"), (5, b"late")]
    node.settle()
    assert node.fwd_copies() == []


def test_what_capture_leaves_on_the_mqtt_path(node):
    """Shared picks of `.fwd`, shards, the sidecar's own messages: as before."""
    assert node.fwd.subscribe("$share/g/s/#", 1, sub_id=4) == [1]
    shard = node.sidecar_conn(FWD_ID + "1")
    assert shard.subscribe("t/#", 1, sub_id=5) == [1]
    node.pub.publish("s/1", b"shared", qos=1)
    node.pub.publish("t/1", b"both", qos=1)
    node.sc.publish("t/sc", b"sidecar", qos=1)
    node.settle()
    node.settle(shard)
    assert [r.payload for r in node.peer.wait_records(1)] == [b"both"]
    assert sorted(node.fwd_copies()) == [b"shared", b"sidecar"]
    assert sorted(node.fwd_copies(shard)) == [b"both", b"sidecar"]


def test_a_shared_pick_after_several_plain_subscriptions_keeps_the_mqtt_path(node):
    """Mosquitto checks `.fwd`'s plain subscriptions first (here two match), then its pick of
    the group: the first makes the record, the second is refused, the pick is allowed."""
    assert node.fwd.subscribe("t/+", 1, no_local=True, sub_id=2) == [1]
    assert node.fwd.subscribe("$share/g/t/#", 1, sub_id=3) == [1]
    assert node.fwd.subscribe("$share/h/t/+", 1, sub_id=4) == [1]
    node.pub.publish("t/1", b"one", qos=1)
    node.pub.publish2("t/2", b"two")
    node.pub.publish("t/a/b", b"deep", qos=1)       # one plain match, one group
    node.settle()
    assert [(r.seq, r.payload) for r in node.peer.wait_records(3)] == [
        (1, b"one"), (2, b"two"), (3, b"deep")]
    picks = sorted((m.payload, m.sub_ids) for m in node.fwd.received(
        lambda m: m.topic != "t/mark"))
    assert picks == [(b"deep", [3]), (b"one", [3]), (b"one", [4]), (b"two", [3]),
                     (b"two", [4])]


def test_offline_fwd_session_is_captured_not_queued(node):
    node.fwd.disconnect()
    node.pub.publish("t/1", b"while away", qos=1)
    node.pub.publish2("t/2", b"q2 while away")
    assert [r.payload for r in node.peer.wait_records(2)] == [b"while away", b"q2 while away"]
    fwd = node.sidecar_conn(FWD_ID)       # its session: nothing queued
    node.settle(fwd)
    assert node.fwd_copies(fwd) == []


def test_a_reconnect_resends_what_is_unacknowledged_after_the_resume(make_broker, clients,
                                                                      request):
    n = Node(make_broker, clients, request, resume=lambda h: None)
    assert n.fwd.subscribe("t/#", 2, no_local=True) == [2]
    assert n.peer.wait_hellos(1) == [Hello(n.peer.hellos[0].epoch, 1)]
    for i in range(5):
        n.pub.publish("t/x", str(i).encode(), qos=1)
    time.sleep(0.3)
    assert n.peer.records == []            # nothing before the resume
    n.peer.resume(0)
    assert [r.seq for r in n.peer.wait_records(5)] == [1, 2, 3, 4, 5]
    n.peer.ack(2)
    wait_for(lambda: n.stats()["buffered"] == 3, 5, "ack 2")
    n.peer.drop_connection()
    hellos = n.peer.wait_hellos(2)
    assert hellos[1] == Hello(hellos[0].epoch, 6)
    n.peer.resume(3, (5,))                 # the sidecar has 3 and 5: only 4 comes again
    n.pub.publish("t/x", b"5", qos=1)
    recs = n.peer.wait_records(7)
    assert [(r.seq, r.payload) for r in recs[5:]] == [(4, b"3"), (6, b"5")]
    wait_for(lambda: n.stats()["buffered"] == 2, 5, "the resume settled 3 and 5")
    st = n.stats()
    assert (st["connects"], st["acked"], st["records"]) == (2, 4, 6)


def test_a_killed_sidecar_loses_nothing(make_broker, clients, request):
    n = Node(make_broker, clients, request)
    assert n.fwd.subscribe("t/#", 2, no_local=True) == [2]
    n.peer.wait_hellos(1)
    n.peer.close()                         # the sidecar goes away
    for i in range(20):
        n.pub.publish("t/x", str(i).encode(), qos=i % 2)
    n.pub.publish2("t/x", b"q2")
    assert n.stats()["buffered"] == 21
    peer = CapturePeer(n.path)             # a new sidecar, nothing received yet: resume 0
    request.addfinalizer(peer.close)
    recs = peer.wait_records(21)
    assert [r.seq for r in recs] == list(range(1, 22))
    assert recs[-1].payload == b"q2"
    assert peer.hellos[0].next_seq == 22


@pytest.mark.parametrize("bad", [
    b"JUNKJUNKJUNKJUNK",                                   # not an ack
    b"MQFA\x02\x02\x00\x00" + bytes(8),                    # version
    b"MQFA\x01\x07\x00\x00" + bytes(8),                    # kind
    b"MQFA\x01\x02\x00\x00" + struct.pack("<Q", 99),       # a seq never sent
    b"MQFA\x01\x02\x01\x00" + struct.pack("<QQ", 2, 1),    # a listed seq below the cumulative
    b"MQFA\x01\x01\x00\x00" + bytes(8),                    # a second resume
])
def test_a_malformed_message_closes_the_connection_without_loss(node, bad):
    for i in range(3):
        node.pub.publish("t/x", str(i).encode(), qos=1)
    node.peer.wait_records(3)
    node.peer.send(bad)
    node.peer.wait(lambda: node.peer.closed_conns == 1, 5, "the plugin closed")
    hellos = node.peer.wait_hellos(2)      # it reconnects; resume 3 (the default) ...
    assert hellos[1].next_seq == 4
    node.peer.ack(3)
    wait_for(lambda: node.stats()["buffered"] == 0, 5, "the ack on the new connection")
    st = node.stats()
    assert (st["malformed"], st["connects"], st["acked"]) == (1, 2, 3)
    assert "malformed message from the sidecar" in node.b.log()


def test_a_malformed_message_keeps_the_records_for_the_next_connection(make_broker, clients,
                                                                        request):
    n = Node(make_broker, clients, request, resume=lambda h: None)
    assert n.fwd.subscribe("t/#", 2, no_local=True) == [2]
    n.peer.wait_hellos(1)
    n.pub.publish("t/x", b"a", qos=1)
    n.peer.send(b"MQFA\x01\x02\x00\x00" + bytes(8))    # an ack before the resume
    n.peer.wait_hellos(2)
    n.peer.resume(0)
    assert [r.payload for r in n.peer.wait_records(1)] == [b"a"]
    assert n.stats()["malformed"] == 1


def test_past_the_bound_qos0_is_dropped_and_qos1_takes_the_mqtt_path(make_broker, clients,
                                                                    request):
    n = Node(make_broker, clients, request, opts={"capture_max_bytes": 65536},
             resume=lambda h: None)
    assert n.fwd.subscribe("t/#", 2, no_local=True) == [2]
    n.peer.wait_hellos(1)
    big = b"x" * 20000
    for i in range(3):
        n.pub.publish("t/big", big + bytes([i]), qos=1)   # 60 KiB held
    n.pub.publish("t/q0", big, qos=0)                     # dropped
    n.pub.publish("t/q1", big + b"!", qos=1)               # MQTT path
    n.pub.publish2("t/q2", big + b"?")                     # MQTT path
    n.pub.publish("t/small", b"s", qos=0)                  # still fits
    n.settle()
    st = n.stats()
    assert (st["records"], st["dropped"], st["passed"]) == (4, 1, 2)
    assert sorted(n.fwd_copies()) == [big + b"!", big + b"?"]
    n.peer.resume(0)
    recs = n.peer.wait_records(4)
    assert [r.topic for r in recs] == ["t/big"] * 3 + ["t/small"]
    n.peer.ack(4)
    wait_for(lambda: n.stats()["buffered"] == 0, 5, "the ack")
    n.pub.publish("t/q1", b"captured again", qos=1)
    assert n.peer.wait_records(5)[-1].payload == b"captured again"


def test_capture_counts_for_shedding(make_broker, clients, request):
    """The shed rule uses the exact count of records held: past fwd_backlog_max a QoS 1
    publisher of a wanted topic is disconnected before its message is acknowledged."""
    n = Node(make_broker, clients, request, opts={"fwd_backlog_max": 3},
             resume=lambda h: None)
    assert n.fwd.subscribe("t/#", 2, no_local=True) == [2]
    n.peer.wait_hellos(1)
    for i in range(3):
        n.pub.publish("t/x", str(i).encode(), qos=1)
    assert n.sc.call("stats")["fwd_backlog"] == 3
    shed = n.clients(Client("shed-me", port=n.b.port))
    shed.connect()
    shed.c.publish("t/x", b"refused", qos=1)
    assert shed.wait_disconnected(5)
    n.peer.resume(3)
    wait_for(lambda: n.sc.call("stats")["fwd_backlog"] == 0, 5, "the records settled")


def test_without_the_option_nothing_changes(make_broker, clients, request):
    n = Node(make_broker, clients, request, capture=False)
    assert n.fwd.subscribe("t/#", 2, no_local=True) == [2]
    n.pub.publish("t/1", b"one", qos=1)
    n.pub.publish2("t/2", b"two")
    n.settle()
    assert n.fwd_copies() == [b"one", b"two"]
    st = n.stats()
    assert (st["on"], st["records"], st["connects"]) == (False, 0, 0)


def test_an_invalid_option_refuses_to_start(make_broker):
    with pytest.raises(RuntimeError, match="exited at start"):
        make_broker(opts={"capture_socket": "relative.sock"})


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_capture_is_valgrind_clean(make_broker, clients, request, tmp_path):
    """capture.c under valgrind: records of every QoS with properties, several and shared
    subscriptions of `.fwd`, acks (listed too), a resume, a reconnect, malformed input, the
    bound, barrier and cut markers, a QoS 2 message never released and records
    unacknowledged at shutdown."""
    if shutil.which("valgrind") is None:
        pytest.fail("valgrind is not installed")
    vglog = tmp_path / "valgrind.log"
    supp = str(Path(__file__).with_name("mosquitto.supp"))
    n = Node(make_broker, clients, request, opts={"capture_max_bytes": 65536},
             resume=lambda h: None,
             wrapper=["valgrind", "--error-exitcode=99", "--errors-for-leak-kinds=definite",
                      "--leak-check=full", "--trace-children=no", f"--suppressions={supp}",
                      f"--log-file={vglog}"])
    assert n.fwd.subscribe("t/#", 2, no_local=True, sub_id=1) == [2]
    assert n.fwd.subscribe("t/a", 1, no_local=True, sub_id=2) == [1]
    assert n.fwd.subscribe("$share/g/t/#", 1, sub_id=3) == [1]
    n.peer.wait_hellos(1, timeout=20)
    n.pub.publish("t/a", b"q0", qos=0)
    n.pub.publish("t/a", b"q1", qos=1, props=PUB_PROPS)
    n.pub.publish2("t/a", b"q2")
    mid = n.pub.publish("t/a", b"dup", qos=2)
    n.pub.publish("t/a", b"dup", qos=2, mid=mid, dup=True)
    n.pub.pubrel(mid)
    n.pub.publish("t/left", b"never released", qos=2, props=PUB_PROPS)
    n.peer.resume(0)
    n.peer.wait_records(4, timeout=20)
    n.peer.ack(1, (3,))
    n.peer.drop_connection()
    n.peer.wait_hellos(2, timeout=20)
    n.peer.resume(2)
    n.peer.wait_records(5, timeout=20)
    n.peer.send(b"MQFA\x01\x02\x00\x00" + struct.pack("<Q", 99))   # a seq never sent
    n.peer.wait_hellos(3, timeout=20)
    n.peer.resume(4)
    # markers: a barrier token delivered to .fwd, a moving session's cut
    assert n.sc.call("deliver", client=FWD_ID, topic=PROBE,
                     payload=base64.b64encode(b"barrier-9").decode(), qos=1)["ok"]
    mover = clients(RawClient("mover", port=n.b.port, clean_start=False, session_expiry=300))
    mover.connect(timeout=20)
    mover.subscribe("m/#", 1)
    mover.disconnect()
    n.sc.wait_type("disconnect", client="mover", timeout=20)
    assert n.sc.call("hold", client="mover", on=True, cut=True)["ok"]
    big = b"x" * 30000
    for i in range(3):
        n.pub.publish("t/big", big, qos=i % 2)                     # the last is dropped
    n.pub.publish("t/big", big, qos=1)                             # passed
    n.settle()
    st = n.stats()
    assert st["malformed"] == 1 and st["dropped"] >= 1 and st["passed"] >= 1, st
    n.fwd.disconnect()
    fresh = clients(RawClient(FWD_ID, sock=n.b.sock, username=SIDECAR_USER, password=SECRET,
                              clean_start=True, session_expiry=0))
    fresh.connect(timeout=20)
    n.pub.publish("t/a", b"after a clean start", qos=1)
    time.sleep(0.5)
    for c in (n.sc, n.pub, fresh):
        c.close()
    rc = n.b.stop(timeout=60)
    report = vglog.read_text()
    assert "Memcheck" in report, report[-2000:]
    summary = re.findall(r"ERROR SUMMARY: (\d+) errors", report)
    assert summary and summary[-1] == "0", report[-6000:]
    assert rc == 0, f"exit code {rc}\n{report[-4000:]}"
    assert "definitely lost: 0 bytes" in report or "no leaks are possible" in report, \
        report[-4000:]


def test_the_sidecars_adapter_against_the_plugin(make_broker, clients, request):
    """sidecar.local.capture_link.CaptureLink (asyncio, in a thread here) as the listener."""
    n = Node(make_broker, clients, request, capture=False)
    path = str(n.dir / "link.sock")
    batches: list = []
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    link = CaptureLink(path, lambda hello: 0, lambda hello, b: batches.append((hello, b)))

    def stop() -> None:
        asyncio.run_coroutine_threadsafe(link.close(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()

    request.addfinalizer(stop)
    asyncio.run_coroutine_threadsafe(link.start(), loop).result(5)
    n.b.stop()
    n.b.opts["capture_socket"] = path
    n.b.start()
    sc = clients(FakeSidecar(n.b.sock)).start()
    fwd = n.sidecar_conn(FWD_ID)
    assert fwd.subscribe("t/#", 1, no_local=True) == [1]
    pub = clients(RawClient("pub2", port=n.b.port))
    pub.connect()
    for i in range(3):
        pub.publish("t/x", str(i).encode(), qos=1)
    wait_for(lambda: sum(len(b.records) for _, b in batches) == 3, 5, "3 records")
    assert [r.payload for _, b in batches for r in b.records] == [b"0", b"1", b"2"]
    assert batches[0][0].epoch == int(sc.call("stats")["epoch"], 16)
    assert loop.call_soon_threadsafe(link.ack, 3) is not None
    wait_for(lambda: sc.call("stats")["capture"]["acked"] == 3, 5, "the ack")
