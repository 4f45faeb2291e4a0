"""Which peers a node routes to (sidecar.membership.routed), without etcd."""

from __future__ import annotations

from sidecar.membership.routed import RoutedPeers, static_peers, within_retention
from sidecar.membership.view import Change, NodeRecord


def rec(node: str) -> NodeRecord:
    return NodeRecord(node, f"{node}:7001", f"{node}:1883", "v", 1, 0.0)


def test_the_view_is_routed():
    r = RoutedPeers()
    assert r.on_view({"n2": "a2", "n3": "a3"}, 0.0) == (True, [])
    assert r.routed == {"n2": "a2", "n3": "a3"}
    assert r.on_view({"n2": "a2", "n3": "a3"}, 1.0) == (False, [])


def test_a_crashed_peer_stays_routed_until_retention_ends():
    r = RoutedPeers(retention=10.0)
    r.on_view({"n2": "n2:7001"}, 0.0)
    assert r.on_events([Change("crashed", "n2", rec("n2"))], 1.0) == ["n2"]
    assert r.on_view({}, 1.0) == (False, [])  # the view lost it, routing keeps it
    assert r.routed == {"n2": "n2:7001"} and r.retaining
    assert r.refresh(10.9) == (False, [])
    assert r.refresh(11.0) == (True, ["n2"])
    assert r.routed == {} and not r.retaining


def test_a_graceful_leave_drops_at_once_and_a_return_ends_retention():
    r = RoutedPeers()
    r.on_view({"n2": "a2", "n3": "a3"}, 0.0)
    r.on_events([Change("left", "n2", rec("n2"))], 1.0)
    assert r.on_view({"n3": "a3"}, 1.0) == (True, [])
    assert r.routed == {"n3": "a3"}
    r.on_events([Change("crashed", "n3", rec("n3"))], 2.0)
    r.on_view({}, 2.0)
    assert r.routed == {"n3": "n3:7001"}  # its last record's address
    r.on_view({"n3": "new:7001"}, 3.0)  # back, at a new address
    assert r.routed == {"n3": "new:7001"} and not r.retaining


def test_static_peers_and_retention_helper():
    assert static_peers(["n2@127.0.0.1:7002", "n3@h:7003"]) == {"n2": "127.0.0.1:7002",
                                                                 "n3": "h:7003"}
    assert within_retention(0.0, 599.0) and not within_retention(0.0, 600.0)
