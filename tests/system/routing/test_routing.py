"""Cross-node routing on a real 3-node cluster: one logical broker for live traffic."""

from __future__ import annotations

import time

from tests.harness.procs import wait_for
from tests.system.node.mqtt import Client


def _clients(cluster, *specs):
    out = []
    for node, cid, kw in specs:
        c = Client(cluster.ports[node], cid, **kw)
        assert c.wait_connected(), f"{cid} could not connect to {node}"
        out.append(c)
    return out


def test_publish_on_one_node_reaches_subscribers_everywhere_exactly_once(cluster_factory):
    cluster = cluster_factory(3)
    local, remote2, remote3 = _clients(cluster, ("n1", "s1", {}), ("n2", "s2", {}),
                                       ("n3", "s3", {"v5": False}))
    for sub in (local, remote2, remote3):
        sub.subscribe("orders/#", qos=1)
    for node in ("n2", "n3"):
        cluster.wait_interest(node, "orders/#")
    (pub,) = _clients(cluster, ("n1", "pub", {}))
    for i in range(200):
        pub.publish(f"orders/{i % 7}", f"{i}".encode(), qos=1, wait=False)
    for sub in (local, remote2, remote3):
        sub.wait_count(200)
        time.sleep(0.3)
        payloads = [int(m.payload) for m in sub.messages]
        assert payloads == list(range(200)), (sub.client._client_id, len(payloads))
    for c in (local, remote2, remote3, pub):
        c.close()


def test_qos_downgrade_and_upgrade_rules(cluster_factory):
    cluster = cluster_factory(3)
    q0, q1, q2 = _clients(cluster, ("n2", "q0", {}), ("n2", "q1", {}), ("n3", "q2", {}))
    q0.subscribe("q/t", qos=0)
    q1.subscribe("q/t", qos=1)
    q2.subscribe("q/t", qos=2)
    cluster.wait_interest("n2", "q/t")
    cluster.wait_interest("n3", "q/t")
    (pub,) = _clients(cluster, ("n1", "pubq", {}))
    pub.publish("q/t", b"two", qos=2)
    pub.publish("q/t", b"zero", qos=0)
    for sub, expect in ((q0, [0, 0]), (q1, [1, 0]), (q2, [2, 0])):
        got = sub.wait_count(2)
        assert sorted(m.qos for m in got) == sorted(expect), sub.client._client_id
        assert {m.payload for m in got} == {b"two", b"zero"}
    for c in (q0, q1, q2, pub):
        c.close()


def test_overlapping_subscriptions_behave_like_one_broker(cluster_factory):
    """A v5 client with overlapping filters gets one copy per subscription (as Mosquitto does
    on a single broker); a v3.1.1 client gets one; the message crosses the cluster once."""
    cluster = cluster_factory(3)
    v5, v3 = _clients(cluster, ("n2", "ov5", {}), ("n2", "ov3", {"v5": False}))
    for c in (v5, v3):
        c.subscribe("a/#", 1)
        c.subscribe("a/+/c", 1)
    cluster.wait_interest("n2", "a/+/c")
    (pub,) = _clients(cluster, ("n1", "pubov", {}))
    pub.publish("a/b/c", b"x", qos=1)
    assert len(v5.wait_count(2)) == 2
    time.sleep(0.5)
    assert len(v5.messages) == 2 and len(v3.messages) == 1
    wait_for(lambda: cluster.routing("n2").get("received") == 1, 5, "n2's counter")
    time.sleep(0.6)
    assert cluster.routing("n2")["received"] == 1, "forwarded once, not once per filter"
    for c in (v5, v3, pub):
        c.close()


def test_node_without_subscribers_receives_nothing(cluster_factory):
    cluster = cluster_factory(3)
    (sub,) = _clients(cluster, ("n2", "only-n2", {}))
    sub.subscribe("z/#", 1)
    cluster.wait_interest("n2", "z/#")
    (pub,) = _clients(cluster, ("n1", "pubz", {}))
    for i in range(50):
        pub.publish(f"z/{i}", b"p", qos=1)
    assert len(sub.wait_count(50)) == 50
    wait_for(lambda: cluster.routing("n2").get("received") == 50, 5, "n2's counter")
    time.sleep(0.6)
    assert cluster.routing("n2")["received"] == 50
    assert cluster.routing("n3")["received"] == 0
    assert cluster.routing("n1")["received"] == 0
    sub.close()
    pub.close()


def test_dollar_topics_and_hash(cluster_factory):
    cluster = cluster_factory(3)
    hash_sub, dollar_sub = _clients(cluster, ("n2", "hash", {}), ("n3", "dollar", {}))
    hash_sub.subscribe("#", 1)
    dollar_sub.subscribe("$app/#", 1)
    cluster.wait_interest("n2", "#")
    cluster.wait_interest("n3", "$app/#")
    (pub,) = _clients(cluster, ("n1", "pubd", {}))
    pub.publish("$app/x", b"dollar", qos=1)
    pub.publish("plain/x", b"plain", qos=1)
    assert [m.payload for m in dollar_sub.wait_count(1)] == [b"dollar"]
    got = hash_sub.wait_count(1)  # a leaked $app/x, published first, would come first
    assert all(not m.topic.startswith("$") for m in hash_sub.messages)
    assert [m.payload for m in got] == [b"plain"]
    for c in (hash_sub, dollar_sub, pub):
        c.close()




def test_five_nodes_no_loops_no_duplicates(cluster_factory):
    """Publishers on every node, overlapping subscribers on every node: each subscriber gets
    each message exactly once per subscription, nothing loops between five nodes."""
    cluster = cluster_factory(5)
    nodes = sorted(cluster.ports)
    subs = []
    for node in nodes:
        (sub,) = _clients(cluster, (node, f"sub-{node}", {"v5": False}))
        sub.subscribe("mesh/#", 1)
        sub.subscribe("mesh/+/x", 1)  # overlapping: a v3.1.1 client still gets one copy
        subs.append(sub)
    for node in nodes:
        cluster.wait_interest(node, "mesh/#")
    pubs = [_clients(cluster, (node, f"pub-{node}", {}))[0] for node in nodes]
    per_publisher = 40
    for i in range(per_publisher):
        for n, pub in enumerate(pubs):
            pub.publish(f"mesh/{n}/x", f"{n}:{i}".encode(), qos=1, wait=False)
    expected = per_publisher * len(pubs)
    for sub in subs:
        sub.wait_count(expected, timeout=20)
    time.sleep(1.0)
    for sub in subs:
        payloads = [m.payload.decode() for m in sub.messages]
        assert len(payloads) == expected == len(set(payloads)), sub.client._client_id
        for n in range(len(pubs)):
            order = [int(p.split(":")[1]) for p in payloads if p.startswith(f"{n}:")]
            assert order == list(range(per_publisher)), "per-publisher order"
    received = sum(cluster.routing(node)["received"] for node in nodes)
    assert received == expected * (len(nodes) - 1), "each message crosses to each other node once"
    for c in subs + pubs:
        c.close()


def test_sys_topics_stay_on_their_node(cluster_factory, readable_dir):
    """`$SYS/#` is each broker's own status: a subscriber on n2 never makes n1 or n3 forward
    theirs, and a '#' subscriber gets no $SYS at all, also once every broker has published
    $SYS updates while it was subscribed (sys_interval 1 s here)."""
    conf = readable_dir / "sys.conf"
    conf.write_text("sys_interval 1\n")
    conf.chmod(0o644)
    cluster = cluster_factory(3, env={"MQFED_MQTT_INCLUDE": str(conf)})
    sys_sub, plain, everything = _clients(cluster, ("n2", "sys-sub", {}),
                                          ("n2", "plain-sub", {}), ("n2", "hash-sub", {}))
    sys_sub.subscribe("$SYS/#", 0)
    plain.subscribe("marker", 1)
    cluster.wait_interest("n2", "marker")
    for other in ("n1", "n3"):
        subs = cluster.routing(other)["forwarding_subscriptions"]
        assert subs == 1, f"{other} forwards only 'marker', not $SYS ({subs})"
    everything.subscribe("#", 1)
    cluster.wait_interest("n2", "#")
    watchers = {n: _clients(cluster, (n, f"sys-watch-{n}", {}))[0] for n in ("n1", "n3")}
    watchers["n2"] = sys_sub
    for watcher in watchers.values():
        watcher.messages.clear()
        watcher.subscribe("$SYS/broker/uptime", 0)
    for node, watcher in watchers.items():  # a live update, not the retained copy
        wait_for(lambda w=watcher: any(not m.retain for m in list(w.messages)), 10,
                 f"{node}'s broker published $SYS with '#' subscribed on n2")
    pubs = _clients(cluster, ("n1", "marker-pub-n1", {}), ("n3", "marker-pub-n3", {}))
    for node, pub in zip(("n1", "n3"), pubs, strict=True):  # after what they would forward
        pub.publish("marker", node.encode())
    wait_for(lambda: {m.payload for m in list(everything.messages)
                      if m.topic == "marker"} == {b"n1", b"n3"}, 10, "both markers")
    leaked = sorted({m.topic for m in list(everything.messages) if m.topic.startswith("$")})
    assert not leaked, f"'#' got $SYS topics: {leaked[:5]}"
    wait_for(lambda: cluster.routing("n2").get("received", 0) >= 2, 5, "n2's status")
    assert cluster.routing("n2")["received"] == 2, "only the markers came from peers"
    for c in (sys_sub, plain, everything, watchers["n1"], watchers["n3"], *pubs):
        c.close()
