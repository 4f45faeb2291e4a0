"""`routing.forward_shards` = 4 on a real 3-node cluster (an option, default 1): the
forwarding subscriptions spread over `.fwd` … `.fwd3`, and traffic behaves as with one
connection: every message once, QoS 2, shared groups, no re-injection forwarded back (a loop
would show as duplicates). `TEST_SHARDS=1` runs the same with one connection."""

from __future__ import annotations

import os
import time

from tests.system.node.mqtt import Client

SHARDS = {"MQFED_ROUTING_FORWARD_SHARDS": os.environ.get("TEST_SHARDS", "4"),
          "MQFED_ROUTING_CAPTURE": "false"}  # (capture needs one forwarding connection)


def test_four_forwarding_shards_route_like_one(cluster_factory):
    cluster = cluster_factory(3, env=SHARDS)
    subs = []
    for node, cid in (("n2", "sh-a"), ("n3", "sh-b")):
        c = Client(cluster.ports[node], cid)
        assert c.wait_connected()
        subs.append(c)
    filters = [f"sh/{k}/#" for k in range(12)]  # spread over the shards by their hash
    for c in subs:
        for f in filters:
            c.subscribe(f, qos=2)
    member = Client(cluster.ports["n3"], "sh-member")
    assert member.wait_connected()
    member.subscribe("$share/g/job/#", qos=1)
    for node in ("n2", "n3"):
        cluster.wait_interest(node, filters[-1])
    assert cluster.routing("n1")["fwd"]["shards"] == int(SHARDS["MQFED_ROUTING_FORWARD_SHARDS"])
    pub = Client(cluster.ports["n1"], "sh-pub")
    assert pub.wait_connected()
    for i in range(240):
        pub.publish(f"sh/{i % 12}/x", f"{i}".encode(), qos=(1, 2)[i % 2], wait=False)
        pub.publish(f"job/{i}", f"{i}".encode(), qos=1, wait=False)
    for c in subs:
        c.wait_count(240)
        time.sleep(0.5)  # a loop would bring more
        values = [int(m.payload) for m in c.messages]
        assert sorted(values) == list(range(240)), (len(values), len(set(values)))
    jobs = member.wait_count(240)
    assert sorted(int(m.payload) for m in jobs) == list(range(240))
    for c in (*subs, member, pub):
        c.close()
