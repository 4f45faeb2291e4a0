"""A peer stream cut while both sidecars live: the origin re-sends what was not acked, some of
it already delivered, and the receiver's dedup keeps every subscriber at exactly once."""

from __future__ import annotations

from tests.harness.procs import wait_for
from tests.harness.proxy import CuttableProxy
from tests.system.node.mqtt import Client
from tests.system.routing.traffic import SteadyPublisher, check_sequence, values

CUTS = 4  # attempts to catch envelopes delivered whose ack was still on the way


def _outbound(cluster, src: str, dst: str) -> dict:
    return cluster.routing(src).get("peers", {}).get(dst, {}).get("outbound", {})


def test_cut_peer_stream_under_qos1_load_delivers_each_message_once(cluster_factory):
    """n1 → n2 through a proxy that black-holes the stream: envelopes n2 took whose acks
    were still on the way come again after the stream is back (n2 counts them as
    duplicates); the subscriber gets every message once, in order."""
    cluster = cluster_factory(2)
    proxy = CuttableProxy(cluster.grpc_port("n2"))
    sub = pub = None
    try:
        cluster.advertise_via("n2", proxy.address)
        sub = Client(cluster.ports["n2"], "cut-sub")
        assert sub.wait_connected()
        sub.subscribe("cut/x", qos=1)
        cluster.wait_interest("n2", "cut/x")
        pub = SteadyPublisher(cluster.ports["n1"], "cut/x", rate=400).start()
        for _ in range(CUTS):
            seen = len(sub.messages)
            wait_for(lambda seen=seen: len(sub.messages) > seen + 200, 15, "traffic flowing")
            proxy.cut()
            wait_for(lambda: _outbound(cluster, "n1", "n2").get("state") != "up", 20,
                     "n1 finds its stream to n2 dead")
            proxy.restore()
            cluster.wait_meshed(30)
            if cluster.routing("n2").get("duplicates", 0) > 0:
                break
        sent = pub.stop()
        pub = None
        wait_for(lambda: len(set(values(sub))) >= sent, 30, "every message")
        duplicates = cluster.routing("n2")["duplicates"]
        assert duplicates > 0, f"no duplicate envelope in {CUTS} cuts: nothing was tested"
        got = values(sub)
        check_sequence(got, sent)
        twice = len(got) - len(set(got))
        assert twice == 0, (f"{twice} of {sent} messages reached the subscriber twice"
                            f" ({duplicates} duplicate envelopes arrived at n2)")
    finally:
        if pub is not None:
            pub.stop()
        if sub is not None:
            sub.close()
        proxy.close()
