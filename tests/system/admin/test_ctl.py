"""`mqfed ctl` and the metrics listener against one real 3-node cluster (etcd, Mosquitto with
the plugin, sidecars). Tests run in file order; the last one stops a node."""

from __future__ import annotations

import json
import threading
import time
import uuid

import grpc
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from sidecar._proto import admin_pb2
from sidecar.admin.wire import path
from tests.harness.procs import free_port, wait_for
from tests.system.admin.conftest import AdminCluster
from tests.system.cluster.conftest import mqfed


class Sub:
    """A paho MQTT v5 client on one node that keeps what it receives."""

    def __init__(self, port: int, client_id: str, clean: bool = True) -> None:
        self.messages: list[mqtt.MQTTMessage] = []
        self.client = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                                  client_id=client_id, protocol=mqtt.MQTTv5)
        ok, subacked = threading.Event(), threading.Event()
        self.client.on_connect = lambda c, u, f, rc, p: ok.set()
        self.client.on_subscribe = lambda *a: subacked.set()
        self.client.on_message = lambda c, u, m: self.messages.append(m)
        self._subacked = subacked
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 0 if clean else 300
        self.client.connect("127.0.0.1", port, clean_start=clean, properties=props)
        self.client.loop_start()
        assert ok.wait(5), f"no CONNACK from port {port}"

    def subscribe(self, filt: str) -> None:
        self._subacked.clear()
        self.client.subscribe(filt, 1)
        assert self._subacked.wait(5), f"no SUBACK for {filt}"

    def publish(self, topic: str, n: int) -> None:
        infos = [self.client.publish(topic, f"m{i}".encode(), qos=1) for i in range(n)]
        for info in infos:
            info.wait_for_publish(10)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture(scope="module")
def meshed(cluster: AdminCluster) -> AdminCluster:
    """The cluster once every node answers and sees both peer streams of every pair up."""
    def all_up() -> bool:
        r = cluster.ctl("--json", "status")
        if r.code != 0:
            return False
        statuses = r.json()["statuses"]
        return len(statuses) == 3 and all(
            len(s["peers"]) == 2 and all(p["outbound"] == "up" and p["inbound"] == "up"
                                         for p in s["peers"]) for s in statuses)
    wait_for(all_up, 30, "every peer stream up as ctl status reports it", interval=0.5)
    return cluster


@pytest.fixture(scope="module")
def subscriber(meshed: AdminCluster):
    """A persistent client on n2 subscribed to adm/+/temp, seen as interest by n1 and n3."""
    sub = Sub(meshed.port("n2"), "adm-sub-" + uuid.uuid4().hex[:6], clean=False)
    sub.subscribe("adm/+/temp")

    def routed() -> bool:
        r = meshed.ctl("--json", "routes", "--topic", "adm/k1/temp")
        return r.code == 0 and {(x["from_node"], x["to_node"]) for x in r.json()["routes"]} \
            >= {("n1", "n2"), ("n3", "n2")}
    wait_for(routed, 15, "n1 and n3 route adm/+/temp to n2", interval=0.3)
    yield sub
    sub.close()


def test_status_names_every_node_and_stream(meshed: AdminCluster) -> None:
    r = meshed.ctl("--json", "status", node="n2")
    assert r.code == 0, r.err
    data = r.json()
    assert data["cluster"] == "mqfed" and data["answered_by"] == "n2"
    assert data["missing"] == []
    assert {n["node_id"]: (n["state"], n["answered"]) for n in data["nodes"]} == {
        "n1": ("up", True), "n2": ("up", True), "n3": ("up", True)}
    assert [n["node_id"] for n in data["nodes"] if n["self"]] == ["n2"]
    by_id = {s["node_id"]: s for s in data["statuses"]}
    assert set(by_id) == {"n1", "n2", "n3"}
    for node, s in by_id.items():
        assert s["ready"] and s["plugin_in_sync"] and s["membership"] == "etcd"
        assert s["etcd_reachable"] and s["etcd_registered"]
        assert s["admin"] == meshed.admin(node) and s["incarnation"] != "0"
        assert float(s["uptime_s"]) > 0
        assert {p["peer"] for p in s["peers"]} == {"n1", "n2", "n3"} - {node}
    human = meshed.ctl("status")
    assert human.code == 0 and "peer streams" in human.out
    assert "INTEREST LAG" in human.out and "DELTAS PENDING" in human.out
    assert all(f"\n{n} " in human.out for n in ("n1", "n2", "n3"))


def test_nodes_lists_membership_with_admin_addresses(meshed: AdminCluster) -> None:
    r = meshed.ctl("--json", "nodes", node="n3")
    assert r.code == 0, r.err
    nodes = {n["node_id"]: n for n in r.json()["nodes"]}
    assert set(nodes) == {"n1", "n2", "n3"}
    for node, n in nodes.items():
        assert n["state"] == "up" and n["admin"] == meshed.admin(node)
        assert n["mqtt"] == meshed.nodes[node]["mqtt"] and n["grpc"] == meshed.nodes[node]["grpc"]
    assert nodes["n3"]["self"] and not nodes["n1"]["self"]


def test_routes_subscriptions_and_clients(meshed: AdminCluster, subscriber: Sub) -> None:
    client = subscriber.client._client_id.decode()
    routes = meshed.ctl("--json", "routes", "--topic", "adm/k1/temp", node="n3")
    assert routes.code == 0, routes.err
    rows = {(x["from_node"], x["to_node"], x["filter"]) for x in routes.json()["routes"]}
    assert rows == {("n1", "n2", "adm/+/temp"), ("n2", "n2", "adm/+/temp"),
                    ("n3", "n2", "adm/+/temp")}
    local = [x for x in routes.json()["routes"] if x["from_node"] == "n2"]
    assert local[0]["subscribers"] == 1
    only = meshed.ctl("--json", "routes", "--node", "n1", "--topic", "adm/k1/temp")
    assert {x["from_node"] for x in only.json()["routes"]} == {"n1"}
    none = meshed.ctl("--json", "routes", "--topic", "other/k1/temp")
    assert none.code == 0 and none.json()["routes"] == []
    assert "no route" in meshed.ctl("routes", "--topic", "other/x").out

    subs = meshed.ctl("--json", "subscriptions", "--client", client)
    assert subs.code == 0, subs.err
    assert [(s["node_id"], s["client"], s["filter"], s["qos"], s["online"])
            for s in subs.json()["subscriptions"]] == [("n2", client, "adm/+/temp", 1, True)]

    clients = meshed.ctl("--json", "clients")
    assert clients.code == 0, clients.err
    mine = [c for c in clients.json()["clients"] if c["client"] == client]
    assert len(mine) == 1 and mine[0]["node_id"] == "n2" and mine[0]["online"]
    assert mine[0]["persistent"] and mine[0]["session_expiry"] == "300"
    assert mine[0]["protocol"] == "mqtt5" and mine[0]["subscriptions"] == 1
    on_n1 = meshed.ctl("--json", "clients", "--node", "n1")
    assert all(c["node_id"] == "n1" for c in on_n1.json()["clients"])
    table = meshed.ctl("clients", "--node", "n2")
    assert table.out.startswith("NODE") and client in table.out


def test_retained_reads_the_retained_source(meshed: AdminCluster) -> None:
    pub = Sub(meshed.port("n1"), "adm-ret-" + uuid.uuid4().hex[:6])
    try:
        pub.client.publish("adm/r/one", b"12345", qos=1, retain=True).wait_for_publish(5)
    finally:
        pub.close()
    first = meshed.ctl("--json", "retained", "--prefix", "adm/r/", node="n3")
    assert first.code == 0, first.err
    assert first.json()["answered_by"] == "n3" and set(first.json()["sources"]) == {"n3"}
    if first.json()["sources"]["n3"].startswith("none"):  # no replicated index in this tree
        assert first.json()["entries"] == []
        return

    def listed() -> list:
        r = meshed.ctl("--json", "retained", "--prefix", "adm/r/", node="n3")
        return [(e["topic"], e["payload_bytes"], e["origin_node"]) for e in r.json()["entries"]]
    wait_for(lambda: listed() == [("adm/r/one", "5", "n1")], 10, "adm/r/one listed by n3")
    assert meshed.ctl("--json", "retained", "--prefix", "zzz/").json()["entries"] == []
    assert "adm/r/one" in meshed.ctl("retained", node="n2").out


def test_trace_follows_a_message_through_its_hops(meshed: AdminCluster, subscriber: Sub) -> None:
    r = meshed.ctl("--json", "trace", "--topic", "adm/t1/temp", "--wait", "2500")
    assert r.code == 0, r.err
    data = r.json()
    assert data["origin"] == "n1" and data["topic"] == "adm/t1/temp" and data["missing"] == []
    hops = [(h["node_id"], h["event"], h["peer"]) for h in data["hops"]]
    assert hops == [("n1", "published", ""), ("n1", "forwarded", "n2"),
                    ("n2", "received", "n1"), ("n2", "reinjected", "n1"),
                    ("n2", "broker_acked", "")], hops
    times = [h["at_ms"] for h in data["hops"]]
    assert times == sorted(times) and all(h["trace_id"] == data["trace_id"] for h in data["hops"])
    wait_for(lambda: any(m.topic == "adm/t1/temp" for m in subscriber.messages), 5,
             "the traced message at the subscriber")
    got = next(m for m in subscriber.messages if m.topic == "adm/t1/temp")
    assert ("mqfed-trace", data["trace_id"]) in got.properties.UserProperty
    human = meshed.ctl("trace", "--topic", "adm/t2/temp", node="n3")
    assert human.code == 0 and "forwarded" in human.out and "received" in human.out
    lonely = meshed.ctl("--json", "trace", "--topic", "nobody/here", "--wait", "300")
    assert [h["event"] for h in lonely.json()["hops"]] == ["published"]


def _sample(m: dict, name: str, **labels: str) -> float:
    return m.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_move_under_traffic(meshed: AdminCluster, subscriber: Sub) -> None:
    before1, before2 = meshed.metrics("n1"), meshed.metrics("n2")
    pub = Sub(meshed.port("n1"), "adm-pub-" + uuid.uuid4().hex[:6])
    try:
        pub.publish("adm/m/temp", 50)
    finally:
        pub.close()
    wait_for(lambda: sum(m.topic == "adm/m/temp" for m in subscriber.messages) >= 50, 10,
             "50 messages at the subscriber on n2")

    def moved() -> bool:
        a1, a2 = meshed.metrics("n1"), meshed.metrics("n2")
        return (_sample(a1, "mqfed_forwarded_total") - _sample(before1, "mqfed_forwarded_total")
                >= 50
                and _sample(a1, "mqfed_peer_messages_sent_total", peer="n2")
                - _sample(before1, "mqfed_peer_messages_sent_total", peer="n2") >= 50
                and _sample(a2, "mqfed_peer_messages_received_total", peer="n1")
                - _sample(before2, "mqfed_peer_messages_received_total", peer="n1") >= 50
                and _sample(a2, "mqfed_forward_hop_latency_seconds_count")
                - _sample(before2, "mqfed_forward_hop_latency_seconds_count") >= 50)
    wait_for(moved, 10, "counters to count the 50 forwarded messages", interval=0.3)
    after2 = meshed.metrics("n2")
    assert _sample(after2, "mqfed_peer_stream_up", peer="n1", stream="inbound") == 1
    assert _sample(after2, "mqfed_peer_stream_state", peer="n1", state="up") == 1
    assert _sample(after2, "mqfed_peer_stream_state", peer="n1", state="backoff") == 0
    assert _sample(after2, "mqfed_etcd_registered") == 1
    assert _sample(after2, "mqfed_ready") == 1
    assert _sample(after2, "mqfed_clients", state="online") >= 1
    assert _sample(after2, "mqfed_forward_hop_latency_seconds_bucket", le="+Inf") == \
        _sample(after2, "mqfed_forward_hop_latency_seconds_count")
    assert ("mqfed_dropped_total", (("reason", "qos0_stream_down"),)) in after2
    assert _sample(after2, "mqfed_dropped_total", reason="mosquitto_overflow") == 0
    assert ("mqfed_forward_recoveries_total", ()) in after2
    assert ("mqfed_retained_entries", (("kind", "tombstones"),)) in after2
    assert ("mqfed_retained_purged_total", ()) in after2
    assert ("mqfed_plugin_event_gaps_total", ()) in after2
    assert ("mqfed_queue_messages", (("peer", "n1"),)) in after2
    # n2's subscription reached n1 and n3: they put it into effect and said so
    wait_for(lambda: _sample(meshed.metrics("n2"), "mqfed_interest_deltas_pending",
                             peer="n1") == 0, 10, "n1 to apply n2's interest")
    after2 = meshed.metrics("n2")
    assert ("mqfed_interest_lag_seconds", (("peer", "n1"),)) in after2
    assert _sample(after2, "mqfed_interest_lag_seconds", peer="n3") < 5
    assert _sample(after2, "mqfed_interest_apply_seconds_count") >= 1
    assert _sample(meshed.metrics("n1"), "mqfed_interest_keys_held", peer="n2") >= 1
    for probe in ("/healthz", "/readyz"):
        status, body = meshed.http("n2", probe)
        assert status == 200 and '"ok": true' in body, (probe, body)
    assert meshed.http("n2", "/nope")[0] == 404


def test_unauthenticated_calls_are_refused(meshed: AdminCluster) -> None:
    r = meshed.ctl("status", token=False)
    assert r.code == 1 and "admin call refused: no token" in r.err, r.err
    wrong = meshed.ctl("nodes", token="not-the-token")
    assert wrong.code == 1 and "does not match this node's token" in wrong.err, wrong.err
    assert "warning: --token puts the admin token on the command line" in wrong.err
    channel = grpc.insecure_channel(meshed.admin("n1"))
    try:
        call = channel.unary_unary(path("Nodes"), request_serializer=admin_pb2.Query.
                                   SerializeToString,
                                   response_deserializer=admin_pb2.NodesReply.FromString)
        with pytest.raises(grpc.RpcError) as info:
            call(admin_pb2.Query(), timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "admin call refused" in info.value.details()
    finally:
        channel.close()


def test_usage_and_unreachable_exit_codes(meshed: AdminCluster) -> None:
    assert meshed.ctl("clients", "--node", "n9").code == 2
    bad = meshed.ctl("routes", "--topic", "adm/+/x")
    assert bad.code == 2 and "adm/+/x" in bad.err, bad.err
    assert meshed.ctl("frobnicate").code == 2
    r = mqfed("ctl", "--node", f"127.0.0.1:{free_port()}", "--timeout", "3", "status")
    assert r.returncode == 3 and "unreachable" in r.stderr


def test_run_dir_asks_a_local_cluster_with_its_token(meshed: AdminCluster, tmp_path) -> None:
    """`mqfed ctl --run-dir DIR` (a cluster of `mqfed up`): no address, no token to name."""
    env = {"MQFED_ADMIN_TOKEN": "", "MQFED_ADMIN_TOKEN_FILE": "", "MQFED_CTL_NODE": ""}
    r = mqfed("ctl", "--run-dir", str(meshed.run_dir), "--json", "status", timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    assert sorted(s["node_id"] for s in json.loads(r.stdout)["statuses"]) == ["n1", "n2", "n3"]
    none = mqfed("ctl", "--run-dir", str(tmp_path), "status", timeout=60, env=env)
    assert none.returncode == 2 and "no cluster in" in none.stderr, none.stderr


def test_stopped_node_is_named(meshed: AdminCluster) -> None:
    """Last: n3 crashes (SIGKILL). Status says so; cluster-wide commands exit 4 naming it."""
    stopped = mqfed("stop-node", "--run-dir", str(meshed.run_dir), "--kill", "n3")
    assert stopped.returncode == 0, stopped.stderr
    status = meshed.ctl("--json", "status")
    assert status.code == 4, status.err
    data = status.json()
    assert [m["node_id"] for m in data["missing"]] == ["n3"]
    assert {n["node_id"]: n["answered"] for n in data["nodes"]} == {
        "n1": True, "n2": True, "n3": False}
    assert {s["node_id"] for s in data["statuses"]} == {"n1", "n2"}
    assert "n3" in status.err and "partial answer" in status.err
    human = meshed.ctl("status")
    assert human.code == 4 and any(line.startswith("n3") and "unreachable" in line or
                                   line.startswith("n3") and "crashed" in line
                                   for line in human.out.splitlines()), human.out
    clients = meshed.ctl("clients", node="n2")
    assert clients.code == 4 and "no answer from n3" in clients.err, clients.err
    # once its lease expires, the membership view says it crashed; it is still asked
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        nodes = {n["node_id"]: n["state"] for n in meshed.ctl("--json", "nodes").json()["nodes"]}
        if nodes["n3"] == "crashed":
            break
        time.sleep(0.5)
    assert nodes == {"n1": "up", "n2": "up", "n3": "crashed"}
    again = meshed.ctl("--json", "subscriptions")
    assert again.code == 4 and [m["node_id"] for m in again.json()["missing"]] == ["n3"]
