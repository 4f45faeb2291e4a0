"""One message size limit, end to end (issue 16). The plugin refuses a client's message over
`message_size_limit` (payload) or with more than 1 MiB of topic and properties before Mosquitto
stores or acknowledges it: MQTT v5 gets reason code 0x87, MQTT 3 (which cannot refuse) is
disconnected. Mosquitto's `max_packet_size` (derived by `mqfed node`) refuses anything larger
before reading it. Nothing is acknowledged and then lost; a message just under the limit
crosses nodes."""

from __future__ import annotations

import contextlib
import socket
import time

from sidecar.bench.wire import remaining_length
from sidecar.broker.conf import DEFAULT_MESSAGE_SIZE_LIMIT, max_packet_size_for
from tests.harness.procs import wait_for
from tests.system.node.conftest import node_config, pair_static
from tests.system.node.mqtt import Client as NodeClient
from tests.system.plugin.helpers import SECRET, SIDECAR_ID, SIDECAR_USER, Client, FakeSidecar
from tests.system.retained.helpers import read_retained
from tests.system.security.clients import AckClient

LIMIT = 1000
NOT_AUTHORIZED = 0x87


def raw_oversize_publish(port: int, size: int, retain: bool) -> bytes:
    """Over a plain socket (MQTT v5): CONNECT, then the start of a QoS 1 PUBLISH announcing
    `size` bytes of payload; returns what the broker sends back after its CONNACK."""
    client_id = b"raw-oversize"
    connect = (b"\x00\x04MQTT\x05\x02\x00\x3c\x00"
               + len(client_id).to_bytes(2, "big") + client_id)
    topic = b"big/huge"
    head = len(topic).to_bytes(2, "big") + topic + b"\x00\x01\x00"  # mid 1, no properties
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"\x10" + remaining_length(len(connect)) + connect)
        header = sock.recv(2)  # CONNACK, with its properties (remaining length < 128)
        connack = sock.recv(header[1], socket.MSG_WAITALL)
        assert header[:1] == b"\x20" and connack[1:2] == b"\x00", (header, connack)
        sock.sendall(bytes([0x32 | retain]) + remaining_length(len(head) + size) + head)
        with contextlib.suppress(OSError):
            sock.sendall(b"\0" * (1 << 16))
        answer = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(64):
                answer += chunk
        return answer


def test_oversized_messages_are_refused_before_they_are_acknowledged(make_broker, clients):
    b = make_broker(opts={"message_size_limit": str(LIMIT)},
                    extra=f"max_packet_size {max_packet_size_for(LIMIT)}")
    sc = clients(FakeSidecar(b.sock)).start()
    sub = clients(Client("sub", port=b.port))
    sub.connect()
    sub.subscribe("s/#", 1)
    v5 = clients(AckClient("v5", port=b.port))
    v5.connect()
    # v5: QoS 1 and 2 refused with 0x87 (and it stays connected), QoS 0 dropped; at the limit
    # everything passes (paho ignores a PUBREC's reason code: QoS 2 is checked by delivery)
    assert v5.ack_of(v5.send("s/big1", b"x" * (LIMIT + 1), qos=1)) == NOT_AUTHORIZED
    v5.ack_of(v5.send("s/big2", b"x" * (LIMIT + 1), qos=2))
    assert v5.ack_of(v5.send("s/bigr", b"x" * (LIMIT + 1), qos=1, retain=True)) \
        == NOT_AUTHORIZED
    v5.send("s/big0", b"x" * (LIMIT + 1), qos=0)
    # topic and properties beyond 1 MiB, with a small payload
    many = [(f"k{i}", "v" * 1000) for i in range(1100)]
    assert v5.ack_of(v5.send("s/props", b"small", qos=1, user=many)) == NOT_AUTHORIZED
    assert v5.ack_of(v5.send("s/fits", b"x" * LIMIT, qos=1)) == 0
    assert not v5.disconnected
    # MQTT 3.1.1 cannot refuse a message: disconnected, never acknowledged
    v3 = clients(AckClient("v3", port=b.port, protocol=4))
    v3.connect()
    assert v3.ack_of(v3.send("s/big3", b"x" * (LIMIT + 1), qos=1)) is None
    assert v3.disconnected
    # the sidecar's own connections are not limited (re-injections from peers)
    fwd = clients(Client(SIDECAR_ID + ".fwd", sock=b.sock, username=SIDECAR_USER,
                         password=SECRET))
    fwd.connect()
    fwd.publish("s/fwd", b"x" * (LIMIT * 2), qos=1)
    got = sub.wait_messages(lambda m: m.topic in ("s/fits", "s/fwd"), count=2)
    time.sleep(0.3)
    assert sorted(m.topic for m in sub.messages) == ["s/fits", "s/fwd"]
    assert [len(m.payload) for m in sorted(got, key=lambda m: m.topic)] == [LIMIT, LIMIT * 2]
    assert not [e for e in sc.unique_events() if e["type"] == "retained"]
    warnings = [line for line in b.log().splitlines() if "mqfed: refused a" in line]
    assert len(warnings) == 1, warnings  # rate-limited


def test_the_limit_holds_across_a_cluster(nodes, tmp_path):
    values = {n: node_config(tmp_path, n) for n in ("n1", "n2")}
    pair_static(values)
    n1, n2 = (nodes.start(values[n]) for n in ("n1", "n2"))
    assert f"max_packet_size {max_packet_size_for(DEFAULT_MESSAGE_SIZE_LIMIT)}" in \
        (n1.run_dir / "mosquitto.conf").read_text()
    far = NodeClient(n2.port, "far")
    assert far.wait_connected()
    far.subscribe("big/#")
    wait_for(lambda: any(f == "big/#" for _, f, _ in n2.state().get("interest", [])), 10,
             "n2's interest")
    time.sleep(0.5)  # n1 subscribes for it
    # 70 MiB, plain and retained: Mosquitto refuses the packet before reading it, never
    # acknowledged (paho, still writing, sees a lost connection; a client that reads gets
    # DISCONNECT "packet too large")
    for retain in (False, True):
        big = AckClient(f"big-{retain}", port=n1.port)
        big.connect()
        mid = big.send("big/huge", b"\0" * (70 << 20), qos=1, retain=retain)
        assert big.ack_of(mid, timeout=30) is None
        assert big.wait_disconnected(10)
        big.close()
        assert raw_oversize_publish(n1.port, 70 << 20, retain) == bytes([0xE0, 1, 0x95])
    # just under the limit: delivered on the other node, and replicated when retained
    payload = bytes(range(256)) * ((DEFAULT_MESSAGE_SIZE_LIMIT - 1024) // 256)
    pub = AckClient("pub", port=n1.port)
    pub.connect()
    assert pub.ack_of(pub.send("big/ok", payload, qos=1), timeout=30) == 0
    assert pub.ack_of(pub.send("big/kept", payload, qos=1, retain=True), timeout=30) == 0
    got = far.wait_count(2, timeout=60)
    assert sorted((m.topic, m.payload == payload) for m in got) == [
        ("big/kept", True), ("big/ok", True)]
    assert read_retained(n2.port, "big/#", quiet=0.5) == {"big/kept": payload}
    for c in (far,):
        c.client.disconnect()
        c.client.loop_stop()
    pub.close()
