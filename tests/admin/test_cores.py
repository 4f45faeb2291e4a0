"""The admin and metrics cores without I/O: auth, directory, merging, rendering, histogram,
health answers, and the config rules for the admin section."""

from __future__ import annotations

import json

import pytest

from sidecar._proto import admin_pb2
from sidecar.admin.auth import AuthPolicy
from sidecar.admin.directory import Directory, UnknownNode
from sidecar.admin.fanout import merge
from sidecar.admin.render import drain_line, missing_line, render, table
from sidecar.admin.trace import TRACE_PROPERTY, TraceRecorder, trace_id
from sidecar.admin.wire import METHODS
from sidecar.config import ConfigError, build_config
from sidecar.membership.view import Change, NodeRecord
from sidecar.observability.health import HealthFacts, liveness, readiness
from sidecar.observability.http import parse_request
from sidecar.observability.latency import LatencyHistogram


def rec(node: str, admin: str = "") -> NodeRecord:
    return NodeRecord(node, f"h:{node}", "h:1883", "1", 7, 100.0, admin=admin or f"a:{node}")


def test_auth_policy() -> None:
    policy = AuthPolicy("s3cret")
    assert policy.refusal("ok", bearer=False) is None
    assert "no token" in policy.refusal(None, bearer=False)
    assert "--token-file" in policy.refusal(None, bearer=False)
    failed = policy.refusal("the proof does not match this node's token", bearer=False)
    assert "refused" in failed and "does not match" in failed
    assert "older mqfed" in policy.refusal(None, bearer=True)  # a token sent in the clear
    assert "no admin token configured" in AuthPolicy(None).refusal(None, bearer=True)
    assert AuthPolicy(None, dev_mode=True).refusal(None, bearer=False) is None


@pytest.mark.parametrize("listen", ["0.0.0.0:7101", "10.1.2.3:7101", "example.com:7101"])
def test_dev_mode_only_on_loopback(listen: str) -> None:
    data = {"node": {"id": "n1"}, "admin": {"listen": listen, "dev_mode": True}}
    with pytest.raises(ConfigError, match="admin.dev_mode .* loopback"):
        build_config(data, env={})
    for loopback in ("127.0.0.1:7101", "localhost:7101", "[::1]:7101"):
        data["admin"]["listen"] = loopback
        assert build_config(data, env={})["admin"]["dev_mode"] is True


def test_token_and_token_file_are_exclusive(tmp_path) -> None:
    data = {"node": {"id": "n1"}, "admin": {"token": "x", "token_file": "t"}}
    with pytest.raises(ConfigError, match="set one"):
        build_config(data, env={})
    cfg = build_config({"node": {"id": "n1"}, "admin": {"token_file": "t"}}, env={},
                       source=tmp_path / "n.toml")
    assert cfg["admin"]["token_file"] == str(tmp_path / "t")  # relative to the config file


def test_record_carries_the_admin_address_and_old_records_decode() -> None:
    r = rec("b", "127.0.0.1:7102")
    assert NodeRecord.decode(r.encode()) == r
    old = {k: v for k, v in json.loads(r.encode()).items() if k != "admin"}
    assert NodeRecord.decode(json.dumps(old)).admin == ""


def test_directory_retention_runs_on_the_monotonic_clock() -> None:
    """The wall clock stepping back an hour neither keeps a crashed node a target longer nor
    changes what `since` says."""
    d = Directory(rec("a"), crashed_retention=60)
    d.on_events([Change("joined", "b", rec("b"))], now=5000, monotonic=100)
    d.on_events([Change("crashed", "b", rec("b"))], now=5010, monotonic=110)
    assert d.entries()[1].since == 5010  # wall time, shown to people
    assert [e.record.node_id for e in d.targets([], 169)] == ["a", "b"]
    assert [e.record.node_id for e in d.targets([], 171)] == ["a"]


def test_directory_states_and_targets() -> None:
    d = Directory(rec("a"), crashed_retention=60)
    d.on_events([Change("joined", "a", rec("a")), Change("joined", "b", rec("b")),
                 Change("joined", "c", rec("c"))], now=1000)
    assert [e.record.node_id for e in d.targets([], 1000)] == ["a", "b", "c"]
    d.on_events([Change("crashed", "b", rec("b")), Change("left", "c", rec("c"))], now=1010)
    assert {e.record.node_id: e.state for e in d.entries()} == {
        "a": "up", "b": "crashed", "c": "left"}
    assert [e.record.node_id for e in d.targets([], 1020)] == ["a", "b"]  # crashed: still asked
    assert [e.record.node_id for e in d.targets([], 1080)] == ["a"]  # past the retention
    assert [e.record.node_id for e in d.targets(["c"], 1080)] == ["c"]  # named: asked anyway
    with pytest.raises(UnknownNode, match="no node zz"):
        d.targets(["zz"], 1080)
    d.on_events([Change("joined", "b", rec("b"))], now=1090)
    assert d.entries()[1].state == "up" and d.entries()[1].since == 1090


def test_static_peers_have_no_admin_address() -> None:
    d = Directory(rec("a"))
    d.add_static({"b": "h:7002", "a": "h:7001"}, now=5)
    assert [(e.record.node_id, e.record.admin) for e in d.entries()] == [
        ("a", "a:a"), ("b", "")]


def test_merge_concatenates_rows_and_names_missing() -> None:
    a = admin_pb2.ClientsReply(clients=[admin_pb2.Client(node_id="a", client="x")])
    b = admin_pb2.ClientsReply(clients=[admin_pb2.Client(node_id="b", client="y")])
    out = merge(METHODS["Clients"], "a", [a, b], {"c": ("h:3", "unreachable"),
                                                  "b2": ("", "no address")})
    assert [c.client for c in out.clients] == ["x", "y"] and out.answered_by == "a"
    assert [(m.node_id, m.error) for m in out.missing] == [("b2", "no address"),
                                                           ("c", "unreachable")]
    assert missing_line(out.missing).startswith("partial answer: no answer from b2")
    r1 = admin_pb2.RetainedReply(entries=[admin_pb2.RetainedEntry(topic="t")])
    r1.sources["a"] = "none"
    merged = merge(METHODS["Retained"], "a", [r1], {})
    assert dict(merged.sources) == {"a": "none"} and len(merged.entries) == 1


def test_table_and_render() -> None:
    assert table(["A", "BB"], [["x", 1], ["long", None]]) == "A     BB\nx     1\nlong"
    assert table(["A"], [], empty="nothing") == "nothing"
    reply = admin_pb2.StatusReply(cluster="c", answered_by="a")
    reply.nodes.add(node_id="a", state="up", answered=True, self=True)
    reply.nodes.add(node_id="b", state="up", answered=False)
    reply.nodes.add(node_id="c", state="crashed", since=90)
    reply.statuses.add(node_id="a", ready=True, membership="etcd", etcd_reachable=True,
                       etcd_registered=True, uptime_s=5).peers.add(
        peer="b", outbound="backoff", inbound="down", last_error="refused")
    text = render(reply, now=100)
    nodes = text.split("\n\n")[1].splitlines()  # the nodes table
    assert nodes[2].startswith("b ") and "unreachable" in nodes[2]
    assert nodes[3].startswith("c ") and "crashed" in nodes[3] and "since 10s" in nodes[3]
    assert "refused" in text and "cluster c (answered by a)" in text


def test_trace_recorder() -> None:
    assert trace_id([("k", "v"), (TRACE_PROPERTY, "t1")]) == "t1"
    assert trace_id([("k", "v")]) is None
    r = TraceRecorder("n1", size=3)
    r.record("t1", "published", 1.0)
    r.expect_ack(5, "t1")
    assert r.waiting
    r.on_acked([4, 5], 2.0)
    assert not r.waiting
    assert [h.event for h in r.hops("t1")] == ["published", "broker_acked"]
    for i in range(3):
        r.record("t2", "received", 3.0 + i)
    assert r.hops("t1") == [] and len(r.hops("t2")) == 3  # a ring: the oldest go


def test_latency_histogram() -> None:
    h = LatencyHistogram((1, 10))
    for ms in (-3, 0.5, 1, 5, 50):
        h.observe(ms)
    assert h.cumulative() == [(1, 3), (10, 4), (float("inf"), 5)]
    assert h.count == 5 and h.sum_ms == 56.5


def test_health_answers() -> None:
    up = HealthFacts("n1", ready=True, stopping=False, loop_lag_s=0.1)
    assert liveness(up)[0] == 200 and readiness(up)[0] == 200
    starting = HealthFacts("n1", ready=False, stopping=False, loop_lag_s=0.0)
    assert liveness(starting)[0] == 200 and readiness(starting)[0] == 503
    assert b"starting" in readiness(starting)[1]
    stopping = HealthFacts("n1", ready=True, stopping=True, loop_lag_s=0.0)
    assert readiness(stopping)[0] == 503
    stalled = HealthFacts("n1", ready=True, stopping=False, loop_lag_s=30)
    assert liveness(stalled)[0] == 503 and b"stalled" in liveness(stalled)[1]
    assert liveness(HealthFacts("n1", True, False, 0, fatal="plugin"))[0] == 503


def test_parse_request() -> None:
    request = parse_request(b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\nX-A:  b \r\n\r\n")
    assert request is not None
    assert (request.method, request.path, request.query) == ("GET", "/metrics", {"x": "1"})
    assert request.headers == {"host": "a", "x-a": "b"}
    assert parse_request(b"garbage\r\n\r\n") is None


def test_sessions_render_one_row_per_client_with_where_it_is_held() -> None:
    reply = admin_pb2.SessionsReply(sessions=[
        admin_pb2.Session(node_id="n1", client="dev", owner="n2", online=True, persistent=True,
                          session_expiry=600, expires_in_s=-1, protocol="mqtt5",
                          subscriptions=1, here=""),
        admin_pb2.Session(node_id="n2", client="dev", owner="n2", online=True, persistent=True,
                          session_expiry=600, expires_in_s=-1, protocol="mqtt5",
                          subscriptions=2, here="online"),
        admin_pb2.Session(node_id="n3", client="dev", owner="n2", online=True, persistent=True,
                          session_expiry=600, expires_in_s=-1, protocol="mqtt5",
                          subscriptions=1, here="replica-held", replicas=["n3"]),
    ])
    reply.sessions[1].replicas.append("n3")
    lines = render(reply, now=0).splitlines()
    assert len(lines) == 2, lines
    row = lines[1].split()
    assert row[:4] == ["dev", "n2", "n3", "yes"]
    assert row[-2:] == ["2", "n2:online,n3:replica-held"]


def test_sessions_render_what_each_node_queued_for_an_offline_session() -> None:
    views = [admin_pb2.Session(node_id=n, client="dev", owner="n1", online=False,
                               persistent=True, session_expiry=600, expires_in_s=500,
                               protocol="mqtt5", subscriptions=1, here=here, queued=queued)
             for n, here, queued in (("n1", "session", 30), ("n2", "replica-queueing", 0),
                                     ("n3", "replica-held", -1))]
    row = render(admin_pb2.SessionsReply(sessions=views), now=0).splitlines()[1].split()
    assert row[-1] == "n1:session(30),n2:replica-queueing,n3:replica-held"


def test_a_drain_line_says_how_many_messages_its_sessions_still_hold() -> None:
    line = drain_line(admin_pb2.DrainProgress(
        node_id="n1", state="draining", phase="moving sessions", seconds=2.0, sessions_owned=3,
        session_messages=120, session_copies=4, messages_queued=5))
    assert line == ("n1: draining (moving sessions) after 2.0s: 0 clients, 3 sessions owned "
                    "(120 messages in them), 4 session copies, 5 messages queued")


def test_a_drain_line_without_sessions_left_names_no_stale_message_count() -> None:
    line = drain_line(admin_pb2.DrainProgress(
        node_id="n1", state="drained", seconds=2.5, session_messages=11))
    assert line == ("n1: drained after 2.5s: 0 clients, 0 sessions owned, 0 session copies, "
                    "0 messages queued")
