"""The audit with sidecar hop records: where each lost delivery was lost, delay per hop."""

from __future__ import annotations

from pyspark.sql import SparkSession

from pipeline import metrics, source
from tests.system.pipeline.handmade import MS, T0, Trace, rows

TOPIC = "load/r/n1/0"


def hop(tr: Trace, event: str, node: str, peer: str, seq: int, at: float) -> None:
    tr.rows.append({"v": 1, "kind": "hop", "event": event, "node": node, "peer": peer,
                    "topic": TOPIC, "pub": 0, "seq": seq, "qos": 1, "id": f"n1/1/{seq}",
                    "hlc": 0, "t": T0 + int(at * MS)})


def full_path(tr: Trace, seq: int, at: float, upto: str = "acked") -> None:
    """Hop records of seq's way from n1 to n2, up to `upto`."""
    steps = [("forwarded", "n1", "n2", 1), ("received", "n2", "n1", 3),
             ("reinjected", "n2", "n1", 4), ("acked", "n2", "", 6)]
    for event, node, peer, dt in steps:
        hop(tr, event, node, peer, seq, at + dt)
        if event == upto:
            return


def test_each_lost_delivery_is_placed_after_its_last_hop(spark: SparkSession) -> None:
    tr = Trace().subscribe("s2", "n2", "load/r/#").subscribe("s1", "n1", "load/r/#")
    for seq in range(6):
        tr.publish(0, seq, TOPIC, "n1", at=seq * 10)
    tr.receive("s1", "n1", 0, 0, TOPIC, at=1)          # seq 1..5 never reach s1: same node
    tr.receive("s2", "n2", 0, 0, TOPIC, at=8)
    full_path(tr, 0, 0)
    full_path(tr, 2, 20, upto="forwarded")              # never received by n2
    full_path(tr, 3, 30, upto="received")               # never re-injected
    full_path(tr, 4, 40, upto="reinjected")             # never acknowledged by n2's broker
    full_path(tr, 5, 50)                                # acknowledged, never delivered
    data = source.split(tr.frame(spark))
    d = tr.deliveries(spark)
    times = metrics.hop_times(data.hop)
    located = rows(metrics.lost_at(metrics.lost(d), times), "node", "seq")
    got = {(r["node"], r["seq"]): r["lost_at"] for r in located}
    assert got == {**{("n1", s): "same_node" for s in range(1, 6)},
                   ("n2", 1): "origin", ("n2", 2): "link", ("n2", 3): "dest_sidecar",
                   ("n2", 4): "dest_broker", ("n2", 5): "delivery"}
    by_hop = rows(metrics.lost_by_hop(metrics.lost_at(metrics.lost(d), times)), "lost_at")
    assert {(r["dest"], r["lost_at"]): r["lost"] for r in by_hop}[("n1", "same_node")] == 5


def test_delay_per_hop(spark: SparkSession) -> None:
    tr = Trace().subscribe("s2", "n2", "load/r/#")
    tr.publish(0, 0, TOPIC, "n1", at=0).receive("s2", "n2", 0, 0, TOPIC, at=9)
    full_path(tr, 0, 0)
    hop(tr, "received", "n2", "n1", 0, 50)  # a later copy (a replay): the first one counts
    data = source.split(tr.frame(spark))
    lat = rows(metrics.hop_latency(tr.deliveries(spark), metrics.hop_times(data.hop)), "stage")
    assert {r["stage"]: r["p50_ms"] for r in lat} == {
        "origin": 1.0, "link": 2.0, "dest_sidecar": 1.0, "dest_broker": 5.0}
    assert all(r["origin"] == "n1" and r["dest"] == "n2" and r["count"] == 1 for r in lat)
