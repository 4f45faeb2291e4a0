"""Unit tests of the sans-IO membership view."""

from __future__ import annotations

import json

import pytest

from sidecar.membership.view import BadRecord, Change, MembershipView, NodeRecord

P = "/c1/nodes/"


def rec(node: str, inc: int = 1, grpc: str | None = None) -> NodeRecord:
    return NodeRecord(node, grpc or f"127.0.0.1:{7000 + len(node)}", "127.0.0.1:1883", "0.1",
                      inc, 1700000000.5)


def kinds(changes: list[Change]) -> list[tuple[str, str]]:
    return [(c.kind, c.node_id) for c in changes]


def test_record_round_trip_and_unknown_keys_ignored() -> None:
    r = rec("a", 7)
    assert NodeRecord.decode(r.encode()) == r
    obj = json.loads(r.encode()) | {"zone": "eu-1"}
    assert NodeRecord.decode(json.dumps(obj)) == r


@pytest.mark.parametrize("raw, words", [
    (b"not json", "not JSON"),
    (b"[1]", "JSON object"),
    (json.dumps({"node_id": "a"}).encode(), "lacks field"),
    (json.dumps(json.loads(rec("a").encode()) | {"incarnation": "x"}).encode(), "integer"),
    (json.dumps(json.loads(rec("a").encode()) | {"grpc": ""}).encode(), "must not be empty"),
])
def test_bad_records_raise_clear_errors(raw: bytes, words: str) -> None:
    with pytest.raises(BadRecord, match=words):
        NodeRecord.decode(raw)


def test_join_leave_and_self_excluded_from_peers() -> None:
    v = MembershipView(P, "a")
    assert kinds(v.put(P + "a", rec("a").encode())) == [("joined", "a")]
    assert kinds(v.put(P + "b", rec("b").encode())) == [("joined", "b")]
    assert v.peers() == {"b": rec("b").grpc}
    assert set(v.members()) == {"a", "b"}
    assert v.put(P + "b", rec("b").encode()) == []  # same record again: nothing
    assert kinds(v.delete(P + "b")) == [("crashed", "b")]
    assert v.delete(P + "b") == []
    assert v.peers() == {}


def test_restart_with_new_incarnation_and_stale_record_ignored() -> None:
    v = MembershipView(P, "a")
    v.put(P + "b", rec("b", 5).encode())
    assert kinds(v.put(P + "b", rec("b", 6, "h:1").encode())) == [("restarted", "b")]
    assert v.put(P + "b", rec("b", 5).encode()) == []  # stale: ignored
    assert v.peers() == {"b": "h:1"}
    assert kinds(v.put(P + "b", rec("b", 6, "h:2").encode())) == [("updated", "b")]
    v.delete(P + "b")
    assert v.put(P + "b", rec("b", 4).encode()) == []  # stale even after it left
    assert kinds(v.put(P + "b", rec("b", 7).encode())) == [("joined", "b")]


def test_bad_or_misfiled_records_are_skipped() -> None:
    v = MembershipView(P, "a")
    assert v.put(P + "b", b"{garbage") == []
    assert v.put(P + "b", rec("c").encode()) == []  # record of c under b's key
    assert v.put("/other/nodes/b", rec("b").encode()) == []
    assert v.put(P + "x/y", rec("x").encode()) == []
    assert v.peers() == {}


def test_snapshot_replaces_contents() -> None:
    v = MembershipView(P, "a")
    v.snapshot([(P + "a", rec("a").encode()), (P + "b", rec("b").encode()),
                (P + "c", rec("c").encode())])
    assert set(v.peers()) == {"b", "c"}
    changes = v.snapshot([(P.encode() + b"a", rec("a").encode()),
                          (P.encode() + b"c", rec("c", 2).encode()),
                          (P.encode() + b"d", rec("d").encode()),
                          (P.encode() + b"e", b"bad")])
    assert sorted(kinds(changes)) == [("crashed", "b"), ("joined", "d"), ("restarted", "c")]
    assert set(v.peers()) == {"c", "d"}


def test_no_events_means_view_kept() -> None:
    """etcd unreachable = nothing fed: the last view stays as it is, whatever the clock."""
    v = MembershipView(P, "a")
    v.put(P + "b", rec("b").encode())
    assert v.tick(1e9) == [] and v.up(1e9) == {"b"}
    assert v.peers() == {"b": rec("b").grpc}


def test_stream_failure_marks_down_after_timeout_and_ok_brings_up() -> None:
    v = MembershipView(P, "a", stream_down_after=3.0)
    v.put(P + "b", rec("b").encode())
    v.put(P + "c", rec("c").encode())
    v.peer_stream_failed("b", now=10.0)
    v.peer_stream_failed("b", now=11.0)  # the first failure time counts
    assert v.tick(12.9) == [] and v.up(12.9) == {"b", "c"}
    assert kinds(v.tick(13.0)) == [("down", "b")]
    assert v.tick(14.0) == []
    assert v.up(14.0) == {"c"}
    assert "b" in v.peers()  # still dialled by the transport
    assert kinds(v.peer_stream_ok("b")) == [("up", "b")]
    assert v.up(14.0) == {"b", "c"}
    assert v.peer_stream_ok("b") == []


def test_restart_or_leave_clears_stream_failure() -> None:
    v = MembershipView(P, "a", stream_down_after=1.0)
    v.put(P + "b", rec("b", 1).encode())
    v.peer_stream_failed("b", 0.0)
    v.tick(5.0)
    assert v.up(5.0) == set()
    v.put(P + "b", rec("b", 2).encode())
    assert v.up(5.0) == {"b"}
    v.peer_stream_failed("b", 6.0)
    v.delete(P + "b")
    v.put(P + "b", rec("b", 3).encode())
    assert v.up(100.0) == {"b"}


def test_graceful_leave_announced_before_the_delete():
    from sidecar.membership.view import MembershipView, NodeRecord

    v = MembershipView("/c/nodes/", "a")
    rec = NodeRecord("b", "127.0.0.1:2", "127.0.0.1:3", "1", 5, 1.0)
    v.put("/c/nodes/b", rec.encode())
    leaving = NodeRecord("b", "127.0.0.1:2", "127.0.0.1:3", "1", 5, 1.0, leaving=True)
    assert [(c.kind, c.node_id) for c in v.put("/c/nodes/b", leaving.encode())] == [("left", "b")]
    assert v.peers() == {}
    assert v.delete("/c/nodes/b") == []  # the delete that follows is no news
