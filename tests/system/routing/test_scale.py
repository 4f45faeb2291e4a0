"""Interest at scale on a real 3-node cluster: a backlog of filters never delays new ones."""

from __future__ import annotations

import threading
import time

from tests.harness.procs import wait_for
from tests.system.node.mqtt import Client

FILTERS = 20_000
PER_PACKET = 100


def _bulk_subscribe(client: Client, filters: list[str]) -> list[int]:
    """SUBSCRIBE packets of PER_PACKET filters, all sent at once; every reason code."""
    codes: list[int] = []
    acked = threading.Semaphore(0)

    def on_subscribe(c, userdata, mid, reason_codes, properties) -> None:
        codes.extend(rc.value for rc in reason_codes)
        acked.release()

    client.client.on_subscribe = on_subscribe
    packets = range(0, len(filters), PER_PACKET)
    for i in packets:
        client.client.subscribe([(f, 1) for f in filters[i:i + PER_PACKET]])
    for _ in packets:
        assert acked.acquire(timeout=60), f"SUBACKs missing: {len(codes)} codes so far"
    return codes


def test_a_new_subscription_after_20000_filters_is_routed_from_every_node_within_2s(
        cluster_factory):
    cluster = cluster_factory(3)
    bulk = Client(cluster.ports["n1"], "bulk")
    fresh = Client(cluster.ports["n1"], "fresh")
    pubs = {n: Client(cluster.ports[n], f"pub-{n}") for n in ("n2", "n3")}
    clients = [bulk, fresh, *pubs.values()]
    try:
        assert all(c.wait_connected() for c in clients)
        codes = _bulk_subscribe(bulk, [f"scale/{i // 100}/{i % 100}" for i in range(FILTERS)])
        assert len(codes) == FILTERS and set(codes) == {1}, "every filter granted QoS 1"
        granted: list[int] = []
        subacked = threading.Event()
        fresh.client.on_subscribe = lambda c, u, mid, rcs, p: (
            granted.extend(rc.value for rc in rcs), subacked.set())
        fresh.client.subscribe("fresh/topic", 1)
        assert subacked.wait(5) and granted == [1]
        start = time.monotonic()
        arrived: dict[str, float] = {}
        seq = 0
        while time.monotonic() - start < 2.0 and len(arrived) < 2:
            for node, pub in pubs.items():
                if node not in arrived:
                    pub.publish("fresh/topic", f"{node}:{seq}".encode(), qos=1, wait=False)
            seq += 1
            time.sleep(0.05)
            for m in list(fresh.messages):
                arrived.setdefault(m.payload.decode().split(":")[0], time.monotonic() - start)
        assert set(arrived) == {"n2", "n3"}, (
            f"routed within 2 s of the SUBACK from {sorted(arrived)} only; n2/n3 hold "
            f"{[cluster.routing(n).get('forwarding_subscriptions') for n in ('n2', 'n3')]}"
            f" forwarding subscriptions")
        # and the 20,000 themselves are routed everywhere
        wait_for(lambda: all(cluster.routing(n).get("forwarding_subscriptions", 0) > FILTERS
                             for n in ("n2", "n3")), 60, "all filters on n2 and n3")
        pubs["n3"].publish("scale/199/99", b"last", qos=1)
        assert [m.payload for m in bulk.wait_count(1, topic="scale/199/99")] == [b"last"]
    finally:
        for c in clients:
            c.close()
