"""etcd membership wired into the node: runtime join, graceful leave, duplicate ids."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

from sidecar.config import render_toml
from sidecar.procinfo import cmdline, pid_alive
from tests.harness.procs import ManagedProcess, free_port, wait_for
from tests.system.cluster.conftest import REPO, etcd_membership, etcdctl_env, mqfed
from tests.system.node.mqtt import Client


def test_added_node_joins_a_running_cluster_and_routes_both_ways(cluster_factory):
    cluster = cluster_factory(3)
    sub1 = Client(cluster.ports["n1"], "join-sub1")
    assert sub1.wait_connected()
    sub1.subscribe("m/#", 1)
    cluster.wait_interest("n1", "m/#")
    started = time.monotonic()
    result = mqfed("add-node", "--run-dir", str(cluster.run_dir), "--json")
    assert result.returncode == 0, result.stderr
    entry = json.loads(result.stdout)
    node, port = entry["id"], int(entry["mqtt"].rpartition(":")[2])
    cluster.ports[node] = port

    def joined() -> bool:
        peers = cluster.routing("n1").get("peers", {})
        return peers.get(node, {}).get("outbound", {}).get("state") == "up"

    wait_for(joined, 10, f"{node} meshed with n1")
    print(f"join: {node} routed with n1 {time.monotonic() - started:.2f}s after add-node")
    sub4 = Client(port, "join-sub4")
    assert sub4.wait_connected()
    sub4.subscribe("m/#", 1)
    cluster.wait_interest(node, "m/#")
    pub4, pub1 = Client(port, "join-pub4"), Client(cluster.ports["n1"], "join-pub1")
    assert pub4.wait_connected() and pub1.wait_connected()
    pub4.publish("m/from4", b"a", qos=1)
    pub1.publish("m/from1", b"b", qos=1)
    assert {m.payload for m in sub1.wait_count(2)} == {b"a", b"b"}
    assert {m.payload for m in sub4.wait_count(2)} == {b"a", b"b"}
    for c in (sub1, sub4, pub4, pub1):
        c.close()


def test_graceful_leave_drops_its_interest_at_once(cluster_factory):
    cluster = cluster_factory(3)
    sub = Client(cluster.ports["n3"], "leave-sub")
    assert sub.wait_connected()
    sub.subscribe("leave/#", 1)
    cluster.wait_interest("n3", "leave/#")
    assert cluster.routing("n1")["forwarding_subscriptions"] == 1
    sub.close()
    started = time.monotonic()
    assert mqfed("stop-node", "--run-dir", str(cluster.run_dir), "n3").returncode == 0
    wait_for(lambda: "n3" not in cluster.state("n1").get("peers", {}), 4,
             "n1 drops n3 before its lease (5 s) could expire")
    assert cluster.routing("n1")["forwarding_subscriptions"] == 0
    print(f"leave: n1 dropped n3 {time.monotonic() - started:.2f}s after stop-node")


def test_duplicate_node_id_is_refused(cluster_factory, tmp_path):
    cluster = cluster_factory(3)
    values = {
        "node": {"id": "n2", "run_dir": str(tmp_path / "imposter")},
        "mqtt": {"listen": f"127.0.0.1:{free_port()}"},
        "grpc": {"listen": f"127.0.0.1:{free_port()}"},
        "admin": {"listen": f"127.0.0.1:{free_port()}", "metrics": ""},
        "membership": etcd_membership(cluster.info),
    }
    path = tmp_path / "n2.toml"
    path.write_text(render_toml(values))
    result = subprocess.run([sys.executable, "-m", "sidecar.cli", "node", "--config", str(path)],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "node id 'n2' is already registered in cluster 'mqfed'" in result.stderr
    assert not (tmp_path / "imposter" / "mosquitto.pid").exists(), "no Mosquitto was started"
    assert cluster.state("n2").get("ready") is True, "the real n2 is untouched"


def test_etcd_down_30s_under_traffic_disconnects_nobody(cluster_factory):
    """Availability first: with etcd stopped for 30 s, routing continues on the last view, no
    client is disconnected, and every node re-registers when etcd is back. etcd comes back
    with its data lost (data dir wiped; one restarted with its data keeps the leases, and the
    keys would be there without any node registering again)."""
    cluster = cluster_factory(3)
    state = json.loads((cluster.run_dir / "cluster.json").read_text())
    etcd_pid = state["etcd"]["pid"]
    argv = cmdline(etcd_pid)
    assert argv and "etcd" in argv[0]
    sub = Client(cluster.ports["n2"], "etcd-sub")
    pub = Client(cluster.ports["n1"], "etcd-pub")
    assert sub.wait_connected() and pub.wait_connected()
    sub.subscribe("e/#", 1)
    cluster.wait_interest("n2", "e/#")
    disconnects: list[int] = []
    sub.client.on_disconnect = lambda *a: disconnects.append(1)
    os.kill(etcd_pid, signal.SIGKILL)
    wait_for(lambda: not pid_alive(etcd_pid), 5, "etcd stopped")
    shutil.rmtree(argv[argv.index("--data-dir") + 1])
    restarted = None
    try:
        deadline = time.monotonic() + 30
        sent = 0
        while time.monotonic() < deadline:
            pub.publish("e/x", str(sent).encode(), qos=1, wait=False)
            sent += 1
            time.sleep(0.02)
        got = sub.wait_count(sent, timeout=20)
        assert len({m.payload for m in got}) == sent, "routing continued without etcd"
        assert not disconnects, "no client is disconnected because etcd is away"
        restarted = ManagedProcess("etcd-again", argv, cluster.run_dir / "etcd-again.log")
        def registered() -> bool:
            out = subprocess.run(["etcdctl", "--endpoints", cluster.info["etcd"][0], "get",
                                  "--prefix", "/mqfed/nodes/", "--keys-only"],
                                 capture_output=True, text=True,
                                 env=etcdctl_env(cluster.info))
            return sum(1 for line in out.stdout.splitlines() if line.strip()) == 3
        wait_for(registered, 30, "all three nodes registered again")
        pub.publish("e/after", b"after", qos=1)
        assert sub.wait_count(1, topic="e/after")
    finally:
        if restarted is not None:
            restarted.stop()
        for c in (sub, pub):
            c.close()
