"""Capability `records` (issue 25): plain messages travel between nodes as the MQFB records
the receiving plugin re-injects, and a peer that does not take them gets envelopes, also for
what was queued for it as records before. Real 3-node clusters."""

from __future__ import annotations

from tests.harness.procs import wait_for
from tests.system.cluster.conftest import mqfed
from tests.system.node.mqtt import Client
from tests.system.routing.traffic import check_sequence, publish_sequence, values, wait_arrivals


def test_a_peer_without_records_gets_envelopes_also_for_records_queued_for_it(cluster_factory):
    """QoS 1 from n1 to subscribers on n2 and n3 while n2's sidecar is down: n1 queues n2's
    messages as records. n2's sidecar comes back without `records` (`routing.inject_batches`
    off): n1 sends them, and what follows, as envelopes; n3 gets records all along. Both
    get every message in order."""
    cluster = cluster_factory(3)
    topic, count = "records/mixed", 400
    subs = {}
    for node in ("n2", "n3"):
        sub = Client(cluster.ports[node], f"rec-sub-{node}")
        assert sub.wait_connected()
        sub.subscribe(topic, qos=1)
        cluster.wait_interest(node, topic)
        subs[node] = sub
    result = mqfed("stop-node", "--run-dir", str(cluster.run_dir), "n2", "--sidecar-only")
    assert result.returncode == 0, result.stderr
    publisher = publish_sequence(cluster.ports["n1"], count // 2, 400.0, topic, "rec-pub-a")
    publisher.join(30)
    queued = cluster.routing("n1")["queues"]["n2"]["count"]
    assert queued >= count // 2, cluster.routing("n1")["queues"]
    result = mqfed("start-node", "--run-dir", str(cluster.run_dir), "n2",
                   env={"MQFED_ROUTING_INJECT_BATCHES": "false"})
    assert result.returncode == 0, result.stderr
    cluster.wait_meshed()
    wait_for(lambda: "records" not in cluster.routing("n1")["peers"]["n2"]["capabilities"],
             10, "n1 knows n2 does not take records")
    assert wait_arrivals(subs["n2"], count // 2, limit=30) >= count // 2
    second = Client(cluster.ports["n1"], "rec-pub-b")
    assert second.wait_connected()
    for i in range(count // 2, count):
        second.publish(topic, str(i).encode(), qos=1, wait=False)
    for sub in subs.values():
        wait_arrivals(sub, count, limit=60)
        check_sequence(values(sub), count)
    # (each node writes state.json every second: wait for both)
    wait_for(lambda: cluster.routing("n3")["records_received"] >= count, 5, "n3's records")
    wait_for(lambda: cluster.routing("n1")["records_sent"] >= count, 5,  # n3's, at least
             "n1's records sent")
    assert cluster.routing("n2")["records_received"] == 0
    for client in (second, *subs.values()):
        client.close()
