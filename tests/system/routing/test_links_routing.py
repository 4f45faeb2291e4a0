"""`routing.links` (issue 25, slice 3; experimental, off by default): the plugin writes the
copies peers want straight to their Mosquittos over its own MQTT links, set by the sidecar
from the handshakes (link addresses), the peer token (the password) and the interest (each
link's filters). Nothing goes through the sidecars per message. Real 3-node clusters."""

from __future__ import annotations

import time

from tests.harness.procs import wait_for
from tests.system.node.mqtt import Client
from tests.system.routing.test_capture_routing import qos_runs_in_order_with_properties

LINKS = {"MQFED_ROUTING_LINKS": "true"}


def _links(cluster, node: str) -> dict:
    return cluster.routing(node).get("links") or {}


def _link_records(cluster, node: str, peer: str) -> int:
    listed = _links(cluster, node).get("plugin", {}).get("list", [])
    return next((link["records"] for link in listed if link["peer"] == peer), 0)


def _carrying(cluster) -> None:
    wait_for(lambda: all(_links(cluster, n).get("carrying")
                         and _links(cluster, n).get("plugin", {}).get("up") == 2
                         for n in cluster.ports), 20, "every node's links up and carrying")


def test_links_carry_qos_0_1_2_across_nodes_in_order_with_properties(cluster_factory):
    """A publisher on n1, subscribers on n2 and n3 (one per QoS): every message arrives once,
    in order, with its properties, and went over n1's links: neither its capture socket nor
    its sidecar's peer streams carried any."""
    cluster = cluster_factory(3, env=LINKS)
    _carrying(cluster)
    count = 300
    clients = qos_runs_in_order_with_properties(cluster, "link", count)
    wait_for(lambda: _link_records(cluster, "n1", "n2") >= 3 * count
             and _link_records(cluster, "n1", "n3") >= 3 * count, 10, "n1's link counters")
    assert cluster.routing("n1")["capture"]["records"] == 0  # nothing through the sidecar
    assert cluster.routing("n1").get("records_sent", 0) == 0
    assert cluster.routing("n1")["forwarded"] == 0
    for client in clients:
        client.close()


def test_an_unsubscribe_takes_its_filter_off_the_link(cluster_factory):
    """n2's only subscriber of a topic leaves it while n3 keeps one: n1's link to n2 carries
    none of what n1 publishes there afterwards (its link to n3 does), and a new subscription
    on n2 puts the filter back."""
    cluster = cluster_factory(3, env=LINKS)
    _carrying(cluster)
    subs = {}
    for node in ("n2", "n3"):
        subs[node] = Client(cluster.ports[node], f"link-unsub-{node}")
        assert subs[node].wait_connected()
        subs[node].subscribe("unlink/x", qos=1)
        cluster.wait_interest(node, "unlink/x")
    pub = Client(cluster.ports["n1"], "link-unsub-pub")
    assert pub.wait_connected()

    def publish(tag: str) -> None:
        for i in range(20):
            pub.publish("unlink/x", f"{tag}{i}".encode(), qos=1)

    publish("a")
    wait_for(lambda: len(subs["n2"].messages) >= 20, 10, "the first 20")
    wait_for(lambda: _link_records(cluster, "n1", "n2") >= 20, 10, "n1's link counter")
    before = _link_records(cluster, "n1", "n2")
    subs["n2"].unsubscribe("unlink/x")
    wait_for(lambda: ["unlink/x"] not in [r[1:2] for r in cluster.state("n2").get("interest",
                                                                                  [])],
             10, "n2's interest gone")
    time.sleep(1.0)  # (n1 applies it)
    publish("b")
    wait_for(lambda: len(subs["n3"].messages) >= 40, 10, "n3 got the second 20")
    time.sleep(2.5)  # (the plugin's counters reach state.json every 2 s)
    assert _link_records(cluster, "n1", "n3") >= 40
    assert _link_records(cluster, "n1", "n2") == before, "n2's link carried what n2 left"
    assert len(subs["n2"].messages) == 20
    subs["n2"].subscribe("unlink/x", qos=1)
    cluster.wait_interest("n2", "unlink/x")
    time.sleep(0.5)  # (the link's filter follows the forwarding subscription)
    publish("c")
    wait_for(lambda: len(subs["n2"].messages) >= 40, 10, "the last 20")
    assert [m.payload.decode() for m in subs["n2"].messages][20:] == [f"c{i}" for i in range(20)]
    pub.close()
    for sub in subs.values():
        sub.close()


def test_twenty_moves_under_qos1_traffic_over_links_lose_nothing(cluster_factory):
    """tests/system/sessions' twenty moves with the links on (a publisher on n2, the client
    moving n1 → n2 → n3 …): a move's barrier waits for what the links took to be
    acknowledged, so nothing is lost; the messages went over n2's links."""
    from tests.system.sessions.test_sessions import _session, _twenty_moves

    cluster = cluster_factory(3, env=LINKS)
    _carrying(cluster)
    topic = "moves/links"
    dev = _session(cluster, "n1", topic)
    sent = _twenty_moves(cluster, dev, topic, 1, front=False, catch_up=5.0)
    got = dev.wait_count(len(set(sent)), timeout=30)
    missing = sorted(set(sent) - set(got))
    print(f"20 moves over links: {len(sent)} sent, {len(got) - len(set(got))} duplicates")
    assert not missing, f"lost {len(missing)} of {len(sent)}: {missing[:10]}"
    assert dev.connects.count(True) == 21, dev.connects
    time.sleep(2.5)
    assert _link_records(cluster, "n2", "n1") + _link_records(cluster, "n2", "n3") > 0
    dev.leave()
