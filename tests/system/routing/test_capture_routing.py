"""`routing.capture` (issue 25, slice 2): the plugin hands the sidecar a node's local
publishes that peers want as records over a unix socket, not as MQTT copies on `.fwd`; the
sidecar forwards each once, naming its publisher, and acknowledges it to the plugin only once
every target peer has it (or spilled it). Real 3-node clusters."""

from __future__ import annotations

import os
import signal
import threading
import time

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from tests.harness.procs import wait_for
from tests.system.cluster.conftest import mqfed
from tests.system.node.mqtt import Client
from tests.system.routing.test_faults import origin_crash_while_the_receiver_is_frozen
from tests.system.routing.traffic import check_sequence, publish_sequence, wait_arrivals

# TEST_CAPTURE=false runs the same tests with capture off: those checking capture's state or
# No Local fail then; the frozen-receiver crash test passes on both paths (it checks what
# both must keep; it fails when records are acknowledged on receipt)
CAPTURE = {"MQFED_ROUTING_CAPTURE": os.environ.get("TEST_CAPTURE", "true")}


def _capture(cluster, node: str) -> dict:
    return cluster.routing(node).get("capture") or {}


def _props(i: int) -> Properties:
    props = Properties(PacketTypes.PUBLISH)
    props.UserProperty = [("n", str(i)), ("k", "v")]
    props.ContentType = "text/plain"
    props.CorrelationData = b"\x00c" + str(i).encode()
    props.ResponseTopic = f"reply/{i}"
    props.MessageExpiryInterval = 300
    return props


def qos_runs_in_order_with_properties(cluster, prefix: str, count: int = 300) -> list[Client]:
    """Subscribers on n2 and n3 (one per QoS: Mosquitto 2.0.11 may reorder one client's QoS
    1 and QoS 2 deliveries), `count` messages of each QoS with properties from n1: every
    QoS 1/2 message arrives once and in order, QoS 0 in order, each with its properties.
    Returns the clients (the publisher first) for the caller to close."""
    subs = {}
    for node in ("n2", "n3"):
        for qos in (0, 1, 2):
            sub = Client(cluster.ports[node], f"{prefix}-sub-{node}-{qos}")
            assert sub.wait_connected()
            sub.subscribe(f"{prefix}/q{qos}", qos=qos)
            cluster.wait_interest(node, f"{prefix}/q{qos}")
            subs[node, qos] = sub
    pub = Client(cluster.ports["n1"], f"{prefix}-pub")
    assert pub.wait_connected()
    for i in range(count):
        for qos in (0, 1, 2):
            pub.publish(f"{prefix}/q{qos}", str(i).encode(), qos=qos, wait=False,
                        properties=_props(i))
        time.sleep(0.002)  # (a burst makes Mosquitto drop QoS 0 on a loaded machine)
    for (node, qos), sub in subs.items():
        if qos:
            wait_for(lambda s=sub: len(s.messages) >= count, 30, f"QoS {qos} on {node}")
        else:
            time.sleep(0.5)
        got = list(sub.messages)
        values = [int(m.payload) for m in got]
        if qos:
            breaks = [(i, values[i - 1], values[i]) for i in range(1, len(values))
                      if values[i] != values[i - 1] + 1]
            assert values == list(range(count)), (node, qos, len(values), breaks[:10])
        else:  # QoS 0 may drop, never reorder or duplicate
            assert values and values == sorted(set(values)), (node, qos, len(values))
        for m in got:
            p = m.properties
            n = m.payload.decode()
            assert p.UserProperty == [("n", n), ("k", "v")], p
            assert p.ContentType == "text/plain"
            assert p.CorrelationData == b"\x00c" + m.payload
            assert p.ResponseTopic == f"reply/{n}"
            assert 290 <= p.MessageExpiryInterval <= 300
    return [pub, *subs.values()]


def test_qos_0_1_2_cross_nodes_in_order_with_properties_as_records(cluster_factory):
    """A publisher on n1, subscribers on n2 and n3 (one per QoS: Mosquitto 2.0.11 may
    reorder one client's QoS 1 and QoS 2 deliveries, capture or not): every message arrives
    once, in order, with its properties, n1's sidecar got them as records (no MQTT copies on
    `.fwd`) and sent them on as records."""
    cluster = cluster_factory(3, env=CAPTURE)
    count = 300
    clients = qos_runs_in_order_with_properties(cluster, "cap", count)
    capture = _capture(cluster, "n1")
    assert capture.get("connected") and capture["records"] >= 3 * count, capture
    wait_for(lambda: _capture(cluster, "n1")["pending"] == 0, 10, "every record settled")
    assert _capture(cluster, "n1")["acked"] >= 3 * count
    assert cluster.routing("n1")["fwd"]["unacked"] == 0
    # between nodes as records too (capability `records`): nothing decoded into an envelope
    assert cluster.routing("n1")["records_sent"] >= 3 * count
    for node in ("n2", "n3"):
        assert cluster.routing(node)["records_received"] >= 2 * count
        assert cluster.routing(node)["invalid"] == 0
    for client in clients:
        client.close()


def test_a_killed_origin_sidecar_loses_nothing(cluster_factory):
    """QoS 1 at 400 msgs/s n1 → n2; n1's sidecar is killed (SIGKILL; its Mosquitto keeps
    the unacknowledged records) and restarted a second later: every message arrives, first
    arrivals in publish order (the records the dead sidecar forwarded but had not
    acknowledged come again: duplicates are possible, as with `.fwd`'s copies)."""
    cluster = cluster_factory(3, env=CAPTURE)
    topic = "capkill/n1"
    count = 1500
    sub = Client(cluster.ports["n2"], "capkill-sub", clean=False, session_expiry=600)
    assert sub.wait_connected()
    sub.subscribe(topic, qos=1)
    cluster.wait_interest("n2", topic)
    thread = publish_sequence(cluster.ports["n1"], count, rate=400, topic=topic,
                              client_id="cap-seq")
    wait_for(lambda: len(sub.messages) > 300, 15, "traffic flowing")
    result = mqfed("stop-node", "--run-dir", str(cluster.run_dir), "n1", "--sidecar-only")
    assert result.returncode == 0, result.stderr
    time.sleep(1.0)
    result = mqfed("start-node", "--run-dir", str(cluster.run_dir), "n1", env=CAPTURE)
    assert result.returncode == 0, result.stderr
    thread.join(30)
    wait_arrivals(sub, count)
    got = [int(m.payload) for m in sub.messages]
    check_sequence(got, count)
    # (state.json is written every few hundred ms: the last peer acks may trail it)
    wait_for(lambda: _capture(cluster, "n1").get("pending") == 0, 10, "every record settled")
    capture = _capture(cluster, "n1")
    print(f"after the kill: {len(got) - len(set(got))} duplicates; n1 capture {capture}")
    assert capture.get("connected"), capture
    # what the dead sidecar had acknowledged is skipped: the cumulative ack moves past it
    assert capture["settled_above"] == 0 and capture["acked"] == capture["received"], capture
    sub.close()


def test_an_origin_crash_while_the_receiver_is_frozen_loses_nothing_acknowledged(
        cluster_factory):
    """n1's sidecar forwarded records to a frozen n2 that acked none, and is killed: the
    records it held only in memory were not acknowledged to the plugin, which sends them
    again to its successor (test_faults' test, with capture on)."""
    origin_crash_while_the_receiver_is_frozen(cluster_factory, env=CAPTURE)


def test_a_burst_while_the_origin_sidecar_is_frozen_waits_in_the_plugin(cluster_factory):
    """15,000 QoS 1 messages published while n1's sidecar is frozen (SIGSTOP): Mosquitto
    would drop `.fwd`'s packets past max_queued_messages (test_faults' burst test, the MQTT
    path's recovery); with capture the plugin holds them as records and sends them once the
    sidecar reads again: every one arrives, in order, none by the MQTT path."""
    cluster = cluster_factory(2, env={**CAPTURE, "MQFED_OVERLOAD_BACKLOG_MAX": "1000000"})
    count = 15_000
    sub = Client(cluster.ports["n2"], "capburst-sub")
    assert sub.wait_connected()
    sub.subscribe("capburst/#", qos=1)
    cluster.wait_interest("n2", "capburst/#")
    sidecar = cluster.state("n1")["pid"]
    pub = Client(cluster.ports["n1"], "capburst-pub")
    assert pub.wait_connected()
    os.kill(sidecar, signal.SIGSTOP)
    try:
        infos = [pub.client.publish("capburst/x", str(i).encode(), qos=1)
                 for i in range(count)]
        for info in infos:
            info.wait_for_publish(30)
    finally:
        os.kill(sidecar, signal.SIGCONT)
    wait_arrivals(sub, count, limit=90)
    check_sequence([int(m.payload) for m in sub.messages], count)
    wait_for(lambda: _capture(cluster, "n1").get("received", 0) >= count, 10, "state")
    fwd = cluster.routing("n1")["fwd"]
    assert fwd["dropped_by_mosquitto"] == 0 and fwd["unacked"] == 0, fwd
    sub.close()
    pub.close()


def test_a_clients_own_message_skips_its_no_local_subscription_on_another_node(
        cluster_factory):
    """No Local across nodes: the record names its publisher, so a node holding a copy of
    the publisher's session (here: its replica, which keeps what it refuses while the
    client is online and replays it when the owner dies) never queues the client's own
    messages for its No Local subscription. The client publishes on its owner n1 until n1
    is killed, then resumes elsewhere: it gets the other publisher's messages, never its
    own."""
    cluster = cluster_factory(3, env=CAPTURE)
    topic = "capnl/t"
    me = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                     client_id="capnl-me", protocol=mqtt.MQTTv5)
    got: list[mqtt.MQTTMessage] = []
    up = threading.Event()
    me.on_message = lambda c, u, m: got.append(m)
    me.on_connect = lambda c, u, f, rc, p: up.set()
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 600
    me.connect("127.0.0.1", cluster.ports["n1"], 30, clean_start=True, properties=props)
    me.loop_start()
    assert up.wait(10)
    done = threading.Event()
    me.on_subscribe = lambda *a: done.set()
    me.subscribe([(topic, SubscribeOptions(qos=1, noLocal=True))])
    assert done.wait(5)
    cluster.wait_interest("n1", topic)
    wait_for(lambda: sum((cluster.state(n).get("cluster_sessions") or {}).get("replicas", 0)
                         for n in ("n2", "n3")) == 1, 15, "a replica")
    other = Client(cluster.ports["n2"], "capnl-other")
    assert other.wait_connected()
    stop = threading.Event()

    def run() -> None:
        i = 0
        while not stop.is_set():
            me.publish(topic, f"me-{i}", qos=1)
            other.publish(topic, f"other-{i}".encode(), qos=1, wait=False)
            i += 1
            time.sleep(0.005)

    sender = threading.Thread(target=run)
    sender.start()
    try:
        time.sleep(1.5)
        result = mqfed("stop-node", "--run-dir", str(cluster.run_dir), "n1", "--kill")
        assert result.returncode == 0, result.stderr
        stop.set()
        sender.join()
        me.disconnect()
        me.loop_stop()
        up.clear()
        me.connect("127.0.0.1", cluster.front, 30, clean_start=False, properties=props)
        me.loop_start()
        assert up.wait(20)
        time.sleep(5.0)
    finally:
        stop.set()
        sender.join()
    own = [m.payload for m in got if m.payload.startswith(b"me-")]
    others = [m.payload for m in got if m.payload.startswith(b"other-")]
    print(f"{len(others)} of the other's messages, {len(own)} own")
    assert others, "the other publisher's messages arrive"
    assert not own, f"{len(own)} of its own messages came back: {own[:5]}"
    me.disconnect()
    me.loop_stop()
    other.close()
