"""The attacks of issue 16 against real `mqfed node` processes (Mosquitto with the generated
config, the plugin, the sidecar): each is refused and the node keeps working."""

from __future__ import annotations

import subprocess
import time

from tests.harness.procs import free_port, wait_for
from tests.system.node.conftest import node_config, pair_static
from tests.system.node.mqtt import Client
from tests.system.retained.helpers import read_retained
from tests.system.security.certs import make_certs
from tests.system.security.clients import TlsClient


def _retained_counters(node) -> dict:
    return (node.state().get("routing") or {}).get("retained") or {}


def test_sentinel_attack_leaves_retained_replication_working(nodes, tmp_path):
    values = {n: node_config(tmp_path, n) for n in ("n1", "n2")}
    pair_static(values)
    n1, n2 = (nodes.start(values[n]) for n in ("n1", "n2"))
    # the attack of the issue: delete the read sentinel (and set one that expires)
    for extra in ([], ["-D", "publish", "message-expiry-interval", "1", "-V", "mqttv5"]):
        attack = subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(n1.port),
                                 "-t", "$mqfed/read-sentinel", "-r", "-n", "-q", "1", *extra],
                                capture_output=True, text=True, timeout=10)
        assert attack.returncode == 0, attack.stderr
    time.sleep(1.5)
    pub = Client(n1.port, "writer")
    assert pub.wait_connected()
    for i in range(3):
        pub.publish(f"cfg/{i}", f"v{i}".encode(), retain=True)
    wait_for(lambda: read_retained(n2.port, "cfg/#", quiet=0.2) == {
        f"cfg/{i}": f"v{i}".encode() for i in range(3)}, 20, "the writes replicated to n2")
    # (the state file is written every 0.2-0.5 s: it may not show the reads yet; CI saw 0)
    wait_for(lambda: _retained_counters(n1).get("reads", 0) >= 1, 5, "n1's retained reads")
    counters = _retained_counters(n1)
    assert counters.get("read_failures") == 0, counters
    pub.client.disconnect()
    pub.client.loop_stop()


def test_certificate_client_cannot_take_the_node_sidecar_identity(nodes, tmp_path,
                                                                  readable_dir):
    certs = make_certs(readable_dir, ("server", "alice"))
    tls_port = free_port()
    include = readable_dir / "tls.conf"
    include.write_text(f"listener {tls_port} 127.0.0.1\ncafile {certs}/ca.pem\n"
                       f"certfile {certs}/server.pem\nkeyfile {certs}/server.key\n"
                       "require_certificate true\nuse_identity_as_username true\n")
    include.chmod(0o644)
    node = nodes.start(node_config(tmp_path, "n1", mqtt={"include": str(include)}))
    resyncs = node.state()["stream"]["resyncs"]
    sub = Client(node.port, "ordinary")
    assert sub.wait_connected()
    sub.subscribe("a/#")
    attackers = []
    for cid in ("mqfed-sidecar", "mqfed-sidecar.fwd"):
        att = TlsClient(cid, tls_port, certs, "alice", clean_start=False, session_expiry=3600)
        att.connect()
        att.c.subscribe("#", 1)  # its first packet: disconnected
        attackers.append(att)
    for att in attackers:
        assert att.wait_disconnected(5)
    pub = Client(node.port, "pub")
    assert pub.wait_connected()
    pub.publish("a/1", b"x")
    assert [m.payload for m in sub.wait_count(1, topic="a/1")] == [b"x"]
    log = (node.run_dir / "mosquitto.log").read_text()
    # the sidecar's own connections were never taken over (their ids are not guessable)
    assert "already connected, closing old connection" not in log, log[-3000:]
    assert "without having proven it" in log
    state = node.state()
    assert state["stream"]["resyncs"] == resyncs and state["stream"]["in_sync"]
    for att in attackers:
        assert att.messages == []
        att.close()
    for c in (sub, pub):
        c.client.disconnect()
        c.client.loop_stop()
