"""Every topic the sidecar uses is closed to clients (issue 16): `$mqfed/…` (the retained read
sentinel), `$SYS/broker/mqfed/…` (events, replies, probes, drain markers) and
`$CONTROL/mqfed/…` (commands, barriers). The attack that stopped a node's retained replication
for good, `mosquitto_pub -t '$mqfed/read-sentinel' -r -n -q 1`, now changes nothing."""

from __future__ import annotations

import subprocess
import time

from tests.system.plugin.helpers import SECRET, SIDECAR_ID, SIDECAR_USER, Client
from tests.system.security.clients import AckClient

SENTINEL = "$mqfed/read-sentinel"
FWD_ID = SIDECAR_ID + ".fwd"
RESERVED_FILTERS = [
    "$mqfed/#", "$mqfed/+", "$mqfed", SENTINEL, "$share/g/$mqfed/#",
    "$CONTROL/mqfed/#", "$CONTROL/mqfed/v1", "$CONTROL/mqfed/barrier",
    "$SYS/broker/mqfed/#", "$SYS/broker/mqfed/events", "$share/g/$SYS/broker/mqfed/#",
]


def trusted(broker, clients, client_id: str = FWD_ID) -> Client:
    """The sidecar's forwarding connection: its id, username and secret on the private
    socket."""
    c = clients(Client(client_id, sock=broker.sock, username=SIDECAR_USER, password=SECRET))
    c.connect()
    return c


def retained_sentinel(broker, clients) -> list[bytes]:
    """What a trusted reader (the forwarding connection's identity, taking over any earlier
    one) gets of the retained sentinel."""
    reader = trusted(broker, clients, SIDECAR_ID + ".fwd")
    reader.subscribe(SENTINEL, 0)
    got = reader.wait_messages(lambda m: m.topic == SENTINEL, timeout=1.0)
    reader.disconnect()
    return [m.payload for m in got]


def test_clients_cannot_subscribe_to_reserved_topics(broker, sidecar, client_factory, clients):
    v5 = client_factory("spy5")
    v5.connect()
    assert v5.subscribe([(f, 1) for f in RESERVED_FILTERS]) == [135] * len(RESERVED_FILTERS)
    v3 = client_factory("spy3", protocol=4)
    v3.connect()
    assert v3.subscribe([(f, 1) for f in RESERVED_FILTERS]) == [128] * len(RESERVED_FILTERS)
    # wider filters are allowed, and get nothing of the reserved topics
    assert v5.subscribe([("#", 1), ("$SYS/#", 1), ("+/+", 1)]) == [1, 1, 1]
    fwd = trusted(broker, clients)
    fwd.publish(SENTINEL, b"1", qos=1, retain=True)
    fwd.publish("$CONTROL/mqfed/barrier", b"", qos=1)
    sidecar.call("stats")
    time.sleep(0.3)
    leaked = [m.topic for m in v5.messages + v3.messages if "mqfed" in m.topic]
    assert leaked == []
    assert retained_sentinel(broker, clients) == [b"1"]  # the sidecar's own reads still work
    # the refused subscriptions are not reported to the sidecar as the clients' interest
    subs = [e["filter"] for e in sidecar.unique_events() if e["type"] == "subscribe"]
    assert sorted(subs) == ["#", "$SYS/#", "+/+"]


def test_clients_cannot_write_the_sentinel(broker, sidecar, clients):
    fwd = trusted(broker, clients)
    fwd.publish(SENTINEL, b"1", qos=1, retain=True)
    # the attack of the issue, with the real client (MQTT 3.1.1: a refused publish is acked)
    attack = subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(broker.port),
                             "-t", SENTINEL, "-r", "-n", "-q", "1"],
                            capture_output=True, text=True, timeout=10)
    assert attack.returncode == 0, attack.stderr
    # MQTT v5: refused with "not authorized", also with a message expiry, and for every
    # reserved topic; a shadow (the sidecar's username and secret, another id) may not either
    v5 = clients(AckClient("attacker", port=broker.port))
    v5.connect()
    shadow = clients(AckClient("shadow-of-c", sock=broker.sock, username=SIDECAR_USER,
                               password=SECRET))
    shadow.connect()
    for client in (v5, shadow):
        for topic, kw in [(SENTINEL, {"retain": True}), (SENTINEL, {"retain": True, "expiry": 1}),
                          ("$mqfed/other", {}), ("$CONTROL/mqfed/v1", {}),
                          ("$CONTROL/mqfed/barrier", {})]:
            assert client.ack_of(client.send(topic, b"", qos=1, **kw)) == 135, (client, topic)
    time.sleep(1.5)  # past the refused expiry
    assert retained_sentinel(broker, clients) == [b"1"]
    assert not [e for e in sidecar.unique_events() if e["type"] == "retained"]
    assert not v5.disconnected  # refused, not disconnected: its other messages still go
