"""The scale benchmark's pure parts: where clients connect, and the per-size table."""

from __future__ import annotations

from sidecar.bench.scale import _render_series
from sidecar.bench.scale_clients import plan_ports, render_clients, render_fanout, spread
from sidecar.bench.scale_state import median_traffic, parse_peer_traffic, traffic_delta


def test_clients_go_through_the_front_up_to_its_room_then_to_the_nodes_in_turn():
    assert plan_ports(5, 100, 10, [1, 2, 3]) == [100] * 5
    assert plan_ports(7, 100, 3, [1, 2, 3]) == [100, 100, 100, 1, 2, 3, 1]
    assert plan_ports(2, 100, 0, [1, 2]) == [1, 2]


def test_spread_takes_the_items_in_turn():
    assert spread(5, ["n1", "n2"]) == ["n1", "n2", "n1", "n2", "n1"]
    assert spread(0, ["n1"]) == []


def _fanout(reached: int, p50: float, p99: float, peers: dict[str, int], total: int) -> dict:
    return {"reached": reached, "subscribers": 20, "p50_ms": p50, "p99_ms": p99,
            "n1_messages_per_publish_per_peer": {p: 1.0 for p in peers},
            "n1_bytes_per_publish_per_peer": peers, "all_peer_bytes_per_publish": total}


def test_the_series_table_has_a_row_per_size_and_only_the_phases_that_ran():
    runs = [{"nodes": 3, "fanout": _fanout(20, 2.0, 9.5, {"n2": 155, "n3": 155}, 364)},
            {"nodes": 5, "fanout": _fanout(19, 3.0, 12.0, {"n2": 155, "n3": 156, "n4": 155,
                                                           "n5": 155}, 1700)}]
    lines = _render_series(runs).splitlines()
    assert len(lines) == 3
    assert lines[0].split() == ["nodes", "fanout", "reached", "fanout", "p50/p99", "ms",
                                "n1->peer", "msg/pub", "n1->peer", "B/pub", "all", "peer",
                                "B/pub"]
    assert lines[1].split() == ["3", "20/20", "2.0/9.5", "1.0", "155", "364"]
    assert lines[2].split() == ["5", "19/20", "3.0/12.0", "1.0", "155-156", "1,700"]


def _clients(**changes) -> dict:
    report = {"clients": 3, "via_front": 2, "front_maxconn": 2, "direct": {"n2": 1},
              "on_node": {"n1": 1, "n2": 2}, "connect_errors": 0, "errors_shown": [],
              "connacked_s": 0.1, "subacked_s": 0.2, "routed_after_suback_s": 0.3,
              "reached": 3, "missing": 0, "missing_shown": [], "publish_acked_s": 0.01,
              "delivered_s": 0.02, "front_bytes_per_client": 3000,
              "bytes_per_client": {"n1 sidecar": {"per_node_client": 10,
                                                  "per_cluster_client": 5}}}
    return {**report, **changes}


def test_the_clients_phase_names_the_clients_a_publish_missed():
    assert "MISSING" not in "\n".join(render_clients(_clients()))
    text = "\n".join(render_clients(_clients(reached=1, missing=2,
                                             missing_shown=["sc-1", "sc-2"])))
    assert "reached 1 of 3; MISSING 2: sc-1, sc-2;" in text
    text = "\n".join(render_clients(_clients(reached=0, missing=30, missing_shown=["a"])))
    assert "MISSING 30: a and 29 more" in text
    assert "straight to n2 1" in text


def test_the_fanout_phase_shows_the_messages_and_bytes_per_publish_per_peer():
    text = "\n".join(render_fanout({
        "subscribers": 4, "publishes": 2, "payload_bytes": 100, "on_node": {"n1": 2, "n2": 2},
        "reached": 4, "missing": 0, "missing_shown": [], "p50_ms": 1.0, "p99_ms": 2.0,
        "max_ms": 2.5, "all_reached_p50_ms": 2.0, "n1_bytes_per_publish_per_peer": {"n2": 155},
        "n1_messages_per_publish_per_peer": {"n2": 1.0}, "all_peer_bytes_per_publish": 190}))
    assert "n1->n2 1.0 msg 155 B;" in text and "peers 190 B" in text


METRICS = """# HELP mqfed_peer_bytes_total Stream bytes.
mqfed_peer_bytes_total{peer="n2",stream="outbound",direction="out"} 1000.0
mqfed_peer_bytes_total{peer="n2",stream="inbound",direction="out"} 20.0
mqfed_peer_bytes_total{peer="n2",stream="outbound",direction="in"} 999.0
mqfed_peer_messages_sent_total{peer="n2"} 7.0
mqfed_peer_messages_received_total{peer="n2"} 3.0
mqfed_peer_bytes_total{peer="n3",stream="outbound",direction="out"} 5.0
"""


def test_peer_traffic_counts_the_bytes_written_on_both_streams_and_the_messages_sent():
    assert parse_peer_traffic(METRICS) == {"n2": [1020.0, 7.0], "n3": [5.0, 0.0]}


def test_the_traffic_per_publish_is_the_median_so_one_stray_frame_does_not_count():
    reads = [{"n1": {"n2": [0.0, 0.0]}, "n2": {"n1": [0.0, 0.0]}},
             {"n1": {"n2": [150.0, 1.0]}, "n2": {"n1": [30.0, 0.0]}},
             {"n1": {"n2": [300.0, 2.0]}, "n2": {"n1": [60.0, 0.0]}},
             {"n1": {"n2": [1100.0, 3.0]}, "n2": {"n1": [90.0, 0.0]}}]  # + a stray 650 B
    deltas = [traffic_delta(a, b) for a, b in zip(reads, reads[1:], strict=False)]
    assert deltas[2] == {"n1": {"n2": [800.0, 1.0]}, "n2": {"n1": [30.0, 0.0]}}
    assert median_traffic(deltas) == {"pairs": {"n1": {"n2": [150.0, 1.0]},
                                                "n2": {"n1": [30.0, 0.0]}},
                                      "all_bytes": 180.0}
    assert median_traffic(deltas[:2])["all_bytes"] == 180.0
