"""Reading what a node's Mosquitto holds, and waiting for the cluster to converge."""

from __future__ import annotations

import threading
import time
import uuid

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from tests.harness.procs import wait_for


def read_retained(port: int, filt: str = "#", quiet: float = 0.5,
                  timeout: float = 20.0) -> dict[str, bytes]:
    """Every retained message a new subscriber to `filt` gets from the node on `port`:
    topic -> payload (collected until nothing new arrived for `quiet` seconds)."""
    got: dict[str, mqtt.MQTTMessage] = {}
    last = [time.monotonic()]
    subscribed = threading.Event()
    client = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                         client_id=f"reader-{uuid.uuid4().hex[:8]}", protocol=mqtt.MQTTv5)

    def on_message(c, u, msg: mqtt.MQTTMessage) -> None:
        if msg.retain:
            got[msg.topic] = msg
            last[0] = time.monotonic()

    client.on_message = on_message
    client.on_subscribe = lambda *a: subscribed.set()
    client.connect("127.0.0.1", port, keepalive=30, clean_start=True)
    client.loop_start()
    try:
        client.subscribe(filt, options=SubscribeOptions(qos=1))
        assert subscribed.wait(5), "no SUBACK"
        last[0] = time.monotonic()
        deadline = time.monotonic() + timeout
        while time.monotonic() - last[0] < quiet and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        client.disconnect()
        client.loop_stop()
    return {t: m.payload for t, m in got.items()}


def retained_status(cluster, node: str) -> dict:
    return cluster.routing(node).get("retained") or {}


def wait_converged(cluster, nodes: list[str], entries: int, timeout: float = 30.0) -> str:
    """Every node holds `entries` entries (tombstones included: the writes a test made, so
    a status file from before the last write does not count), reports the same retained
    digest and has nothing in progress; returns the digest."""
    def same() -> bool:
        states = [retained_status(cluster, n) for n in nodes]
        return (all(s.get("digest") and s.get("entries") == entries for s in states)
                and len({s["digest"] for s in states}) == 1
                and all(s.get("busy_topics") == 0 for s in states))

    wait_for(same, timeout, f"retained digests of {nodes} equal", interval=0.2)
    return retained_status(cluster, nodes[0])["digest"]


def expiry_props(seconds: int) -> Properties:
    props = Properties(PacketTypes.PUBLISH)
    props.MessageExpiryInterval = seconds
    return props


def index_values(cluster, node: str) -> dict[str, bytes]:
    """The live values of a node's durable retained index (its SQLite file)."""
    import sqlite3

    path = cluster.run_dir / "nodes" / node / "retained.sqlite"
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        now = int(time.time() * 1000)
        rows = db.execute("SELECT topic, payload, expires_at_ms FROM retained WHERE deleted = 0")
        return {t: bytes(p) for t, p, e in rows if e is None or e > now}
    finally:
        db.close()


def index_versions(cluster, node: str) -> dict[str, tuple[int, str, bytes]]:
    """topic -> (hlc, origin, payload) of every row of a node's durable retained index. The
    file keeps a row's highest version whatever arrives later (its own last-writer-wins)."""
    import sqlite3

    path = cluster.run_dir / "nodes" / node / "retained.sqlite"
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT topic, hlc, origin, payload FROM retained")
        return {t: (h, o, bytes(p)) for t, h, o, p in rows}
    finally:
        db.close()
