"""The scale benchmark's pure parts: where clients connect, and the per-size table."""

from __future__ import annotations

from sidecar.bench.scale import _render_series
from sidecar.bench.scale_clients import plan_ports, spread


def test_clients_go_through_the_front_up_to_its_room_then_to_the_nodes_in_turn():
    assert plan_ports(5, 100, 10, [1, 2, 3]) == [100] * 5
    assert plan_ports(7, 100, 3, [1, 2, 3]) == [100, 100, 100, 1, 2, 3, 1]
    assert plan_ports(2, 100, 0, [1, 2]) == [1, 2]


def test_spread_takes_the_items_in_turn():
    assert spread(5, ["n1", "n2"]) == ["n1", "n2", "n1", "n2", "n1"]
    assert spread(0, ["n1"]) == []


def test_the_series_table_has_a_row_per_size_and_only_the_phases_that_ran():
    runs = [{"nodes": 3, "fanout": {"reached": 20, "subscribers": 20, "p50_ms": 2.0,
                                    "p99_ms": 9.5, "n1_bytes_per_publish_per_peer":
                                    {"n2": 155, "n3": 155}, "all_peer_bytes_per_publish": 364}},
            {"nodes": 5, "fanout": {"reached": 19, "subscribers": 20, "p50_ms": 3.0,
                                    "p99_ms": 12.0, "n1_bytes_per_publish_per_peer":
                                    {"n2": 155, "n3": 156, "n4": 155, "n5": 155},
                                    "all_peer_bytes_per_publish": 700}}]
    lines = _render_series(runs).splitlines()
    assert len(lines) == 3
    assert lines[0].split() == ["nodes", "fanout", "reached", "fanout", "p50/p99", "ms",
                                "n1->peer", "B/pub", "all", "peer", "B/pub"]
    assert lines[1].split() == ["3", "20/20", "2.0/9.5", "155", "364"]
    assert lines[2].split() == ["5", "19/20", "3.0/12.0", "155/156", "700"]
