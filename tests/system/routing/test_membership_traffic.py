"""Membership changes under steady QoS 1 traffic (issue 4): a node joins, leaves gracefully,
crashes whole (Mosquitto too) and returns, or is cut off from etcd. Delivery is checked
before, during and after each change."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from sidecar.config import render_toml
from tests.harness.procs import ManagedProcess, free_port, wait_for
from tests.harness.proxy import CuttableProxy
from tests.system.cluster.conftest import REPO, etcd_membership, etcdctl_env, mqfed
from tests.system.node.mqtt import Client
from tests.system.routing.traffic import SteadyPublisher, check_contiguous, check_sequence, values

ADMINISTRATIVE_ACTION = 0x98


def _subscriber(cluster, node: str, name: str, topic: str) -> Client:
    sub = Client(cluster.ports[node], name)
    assert sub.wait_connected(), f"{name} could not connect to {node}"
    sub.subscribe(topic, 1)
    cluster.wait_interest(node, topic)
    return sub


def _record_disconnects(client: Client) -> list[tuple[bool, int]]:
    seen: list[tuple[bool, int]] = []
    client.client.on_disconnect = lambda c, u, flags, rc, props: seen.append(
        (flags.is_disconnect_packet_from_server, rc.value))
    return seen


def _stream_up(cluster, node: str, peer: str) -> bool:
    return cluster.routing(node).get("peers", {}).get(peer, {}).get(
        "outbound", {}).get("state") == "up"


def _etcd_keys(cluster) -> set[str]:
    out = subprocess.run(["etcdctl", "--endpoints", cluster.info["etcd"][0], "get", "--prefix",
                          "/mqfed/nodes/", "--keys-only"],
                         capture_output=True, text=True, env=etcdctl_env(cluster.info),
                         timeout=10)
    return {line.rpartition("/")[2] for line in out.stdout.split() if line.strip()}


def _new_live_messages(sub: Client, count: int, timeout: float = 15.0) -> None:
    wait_for(lambda: len(sub.messages) >= count, timeout, f"{count} messages at {sub}")


def _restart_n3_and_publish_from_it(cluster, prefix: str) -> Client:
    """n3 back (`start-node`): a new subscriber there gets the live stream, and a message
    published on n3 goes out. Returns the new subscriber."""
    assert mqfed("start-node", "--run-dir", str(cluster.run_dir), "n3").returncode == 0
    cluster.wait_meshed()
    # what n1 queued for n3 while it was away drains first (paced); a subscriber made during
    # that drain would get those older messages after newer live ones (CI, once: "gap,
    # duplicate or reorder in 286 messages from 1472"), which one broker never does to a
    # subscription made after they were published (noted for issue 18)
    wait_for(lambda: cluster.routing("n1").get("queues", {}).get("n3", {}).get("count", 1)
             == 0, 30, "n1's queue for n3 drained")
    sub = _subscriber(cluster, "n3", f"{prefix}-sub3b", f"{prefix}/#")
    _new_live_messages(sub, 100)
    pub = Client(cluster.ports["n3"], f"{prefix}-pub3")
    assert pub.wait_connected()
    pub.publish(f"{prefix}/from3", b"7", qos=1)
    pub.close()
    return sub


def _check_after_return(prefix: str, sent: int, sub2: Client, sub3b: Client) -> None:
    """n2 got the whole steady stream in order, n3's new subscriber an unbroken run up to its
    end, and n2 the message published on n3."""
    steady = f"{prefix}/steady"
    wait_for(lambda: len(set(values(sub2, steady))) >= sent, 20, "the steady stream at n2")
    check_sequence(values(sub2, steady), sent)
    wait_for(lambda: values(sub3b, steady)[-1:] == [sent - 1], 20, "stream's end at n3")
    check_contiguous(values(sub3b, steady))
    wait_for(lambda: values(sub2, f"{prefix}/from3") == [7], 10, "n3's message at n2")


def test_node_added_under_traffic_routes_both_ways_and_loses_nothing(cluster_factory):
    cluster = cluster_factory(3)
    sub2 = _subscriber(cluster, "n2", "add-sub2", "t/#")
    pub = SteadyPublisher(cluster.ports["n1"], "t/steady").start()
    try:
        _new_live_messages(sub2, 100)
        result = mqfed("add-node", "--run-dir", str(cluster.run_dir), "--json")
        assert result.returncode == 0, result.stderr
        entry = json.loads(result.stdout)
        node, port = entry["id"], int(entry["mqtt"].rpartition(":")[2])
        cluster.ports[node] = port
        wait_for(lambda: all(_stream_up(cluster, n, node) and _stream_up(cluster, node, n)
                             for n in ("n1", "n2", "n3")), 15, f"{node} meshed")
        sub4 = _subscriber(cluster, node, "add-sub4", "t/#")
        _new_live_messages(sub4, 100)
        pub4 = Client(port, "add-pub4")
        assert pub4.wait_connected()
        for i in range(20):
            pub4.publish("t/from4", str(i).encode(), qos=1)
        pub4.close()
    finally:
        sent = pub.stop()
    wait_for(lambda: len(set(values(sub2, "t/steady"))) >= sent, 20, "the steady stream at n2")
    check_sequence(values(sub2, "t/steady"), sent)
    wait_for(lambda: values(sub4, "t/steady")[-1:] == [sent - 1], 20, "the stream's end at n4")
    check_contiguous(values(sub4, "t/steady"))
    wait_for(lambda: len(values(sub2, "t/from4")) >= 20, 10, "n4's messages at n2")
    assert values(sub2, "t/from4") == list(range(20))
    sub2.close()
    sub4.close()


def test_graceful_leave_under_traffic_disconnects_cleanly_then_returns(cluster_factory):
    cluster = cluster_factory(3)
    sub2 = _subscriber(cluster, "n2", "leave-sub2", "g/#")
    sub3 = _subscriber(cluster, "n3", "leave-sub3", "g/#")
    # An idle client shows the clean DISCONNECT deterministically. sub3, busy sending PUBACKs,
    # may instead see the close as a reset: Mosquitto closes right after writing DISCONNECT,
    # and unread PUBACKs make the kernel reset the connection, discarding it.
    idle3 = Client(cluster.ports["n3"], "leave-idle3")
    assert idle3.wait_connected()
    disconnects = _record_disconnects(idle3)
    busy = _record_disconnects(sub3)
    pub = SteadyPublisher(cluster.ports["n1"], "g/steady").start()
    try:
        _new_live_messages(sub3, 150)
        started = time.monotonic()
        assert mqfed("stop-node", "--run-dir", str(cluster.run_dir), "n3").returncode == 0
        print(f"leave: stop-node took {time.monotonic() - started:.2f}s")
        wait_for(lambda: disconnects and busy, 5, "both n3 clients disconnected")
        assert disconnects[0] == (True, ADMINISTRATIVE_ACTION), (
            f"n3's client gets a DISCONNECT from the server, not a dropped socket: {disconnects}")
        assert busy[0] in ((True, ADMINISTRATIVE_ACTION), (False, 128)), busy
        idle3.close()
        sub3.close()
        before = values(sub3, "g/steady")
        check_contiguous(before)  # everything up to the leave arrived, in order
        assert before[0] == 0
        assert "n3" not in cluster.state("n1").get("peers", {})
        assert "n3" not in _etcd_keys(cluster)
        _new_live_messages(sub2, len(sub2.messages) + 100)  # the others kept routing
        sub3b = _restart_n3_and_publish_from_it(cluster, "g")
    finally:
        sent = pub.stop()
    _check_after_return("g", sent, sub2, sub3b)
    sub2.close()
    sub3b.close()


def test_whole_node_killed_under_traffic_returns_and_resyncs(cluster_factory):
    cluster = cluster_factory(3)
    sub2 = _subscriber(cluster, "n2", "kill-sub2", "k/#")
    sub3 = _subscriber(cluster, "n3", "kill-sub3", "k/#")
    old_incarnation = cluster.routing("n3")["incarnation"]
    pub = SteadyPublisher(cluster.ports["n1"], "k/steady").start()
    try:
        _new_live_messages(sub3, 150)
        result = mqfed("stop-node", "--run-dir", str(cluster.run_dir), "n3", "--kill")
        assert result.returncode == 0, result.stderr
        sub3.close()
        check_contiguous(values(sub3, "k/steady"))
        # the lease expires; n1 keeps n3's interest and queues for it (a crash, not a leave)
        wait_for(lambda: "n3" not in _etcd_keys(cluster), 15, "n3's lease expired")
        wait_for(lambda: cluster.routing("n1").get("queues", {}).get("n3", {}).get(
            "count", 0) > 0, 10, "n1 queues n3's messages while it is away")
        _new_live_messages(sub2, len(sub2.messages) + 100)
        sub3b = _restart_n3_and_publish_from_it(cluster, "k")
        assert cluster.routing("n3")["incarnation"] > old_incarnation
    finally:
        sent = pub.stop()
    _check_after_return("k", sent, sub2, sub3b)
    wait_for(lambda: cluster.routing("n1")["queues"]["n3"]["count"] == 0, 20,
             "n1's queue for n3 drained to its new incarnation")
    sub2.close()
    sub3b.close()


def _start_node_via(cluster, node: str, etcd: str) -> tuple[ManagedProcess, int]:
    """A 4th node whose only way to etcd is `etcd` (a proxy the test controls)."""
    run_dir = cluster.run_dir / "nodes" / node
    run_dir.mkdir(parents=True)
    port = free_port()
    settings = {
        "node": {"id": node, "run_dir": str(run_dir)},
        "mqtt": {"listen": f"127.0.0.1:{port}"},
        "grpc": {"listen": f"127.0.0.1:{free_port()}",
                 "token_file": str(cluster.run_dir / "peer-token")},  # the cluster's secret
        "admin": {"listen": f"127.0.0.1:{free_port()}", "metrics": ""},
        "membership": {**etcd_membership(cluster.info), "etcd": [etcd]},
    }
    config = run_dir / "node.toml"
    config.write_text(render_toml(settings))
    proc = ManagedProcess(node, [sys.executable, "-m", "sidecar.cli", "node", "--config",
                                 str(config)], run_dir / "node.log", cwd=REPO)
    cluster.ports[node] = port
    return proc, port


def test_node_cut_from_etcd_keeps_routing_and_reregisters(cluster_factory):
    """Availability first: a node that loses etcd (the others keep it) stays in routing both
    ways, nobody is disconnected; when etcd is reachable again it registers again."""
    cluster = cluster_factory(3)
    etcd_port = int(cluster.info["etcd"][0].rpartition(":")[2])
    proxy = CuttableProxy(etcd_port)
    node = None
    clients: list[Client] = []
    pubs: list[SteadyPublisher] = []
    try:
        node, port = _start_node_via(cluster, "n4", proxy.address)
        wait_for(lambda: cluster.state("n4").get("ready") is True, 30, "n4 ready")
        wait_for(lambda: all(_stream_up(cluster, n, "n4") for n in ("n1", "n2", "n3")), 15,
                 "n4 meshed")
        sub1 = _subscriber(cluster, "n1", "cut-sub1", "c/from4")
        sub4 = _subscriber(cluster, "n4", "cut-sub4", "c/from1")
        clients += [sub1, sub4]
        disconnects = [_record_disconnects(sub1), _record_disconnects(sub4)]
        pubs += [SteadyPublisher(cluster.ports["n1"], "c/from1", rate=100).start(),
                 SteadyPublisher(port, "c/from4", rate=100).start()]
        _new_live_messages(sub4, 50)
        proxy.cut()
        wait_for(lambda: "n4" not in _etcd_keys(cluster), 20, "n4's lease expired in etcd")
        during = len(sub1.messages), len(sub4.messages)
        time.sleep(3)
        assert len(sub1.messages) > during[0] + 100 and len(sub4.messages) > during[1] + 100, (
            "routing to and from the cut node continues")
        assert _stream_up(cluster, "n1", "n4") and _stream_up(cluster, "n4", "n1")
        proxy.restore()
        wait_for(lambda: "n4" in _etcd_keys(cluster), 20, "n4 registered again")
        sent = [p.stop() for p in pubs]
        pubs.clear()
        wait_for(lambda: len(set(values(sub4))) >= sent[0]
                 and len(set(values(sub1))) >= sent[1], 20, "every message")
        check_sequence(values(sub4), sent[0])
        check_sequence(values(sub1), sent[1])
        assert disconnects == [[], []], f"no client disconnected because of etcd: {disconnects}"
        assert "etcd" in (cluster.run_dir / "nodes" / "n4" / "node.log").read_text()
    finally:
        for p in pubs:
            p.stop()
        for c in clients:
            c.close()
        if node is not None:
            node.stop(timeout=20)
        proxy.close()
