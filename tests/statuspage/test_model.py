"""The status page's data and HTML from admin replies: node states, the peer stream matrix,
rates, totals, routes; the node table needs no script."""

from __future__ import annotations

import re

from sidecar._proto import admin_pb2
from sidecar.statuspage.html import links_html, nodes_html, page, routes_html, summary_html
from sidecar.statuspage.model import counters, routes_data, status_data
from sidecar.statuspage.pages import TEMPLATE


def link(peer: str, out: str = "up", inbound: str = "up", sent: int = 0) -> admin_pb2.PeerLink:
    return admin_pb2.PeerLink(peer=peer, outbound=out, inbound=inbound, messages_sent=sent,
                              queued_messages=3 if out != "up" else 0, reconnects=2,
                              last_error="connection refused" if out != "up" else "")


def reply() -> admin_pb2.StatusReply:
    """n1 ready and shedding, n2 draining, n3 not answering, n4 crashed, n5 left."""
    r = admin_pb2.StatusReply(cluster="c<1>", answered_by="n1")
    for node, state, answered in (("n1", "up", True), ("n2", "up", True), ("n3", "up", False),
                                  ("n4", "crashed", False), ("n5", "left", False)):
        r.nodes.add(node_id=node, state=state, answered=answered, self=node == "n1",
                    mqtt=f"127.0.0.1:188{node[1]}", version="0.1.0")
    r.statuses.add(node_id="n1", ready=True, drain="serving", version="0.1.0", uptime_s=75,
                   clients_online=4, clients_offline=1, sessions=9, sessions_owned=5,
                   retained=12, shedding=True, publishers_shed=7, forwarded=1000, received=10,
                   reinjected=10, membership="etcd", etcd_reachable=True, etcd_registered=True,
                   peers=[link("n2", sent=900), link("n3", "backoff", "down")])
    r.statuses.add(node_id="n2", ready=True, drain="draining", uptime_s=3, retained=11,
                   sessions=8, clients_online=2, membership="static",
                   peers=[link("n1"), link("n3", "up", "down")])
    r.missing.add(node_id="n3", address="127.0.0.1:7103", error="unreachable (UNAVAILABLE)")
    return r


def test_states_totals_and_rates() -> None:
    r = reply()
    keys = counters(r)
    assert keys[("out", "n1")] == 1000 and keys[("sent", "n1", "n2")] == 900
    rates = {("out", "n1"): 12.5, ("sent", "n1", "n2"): 12.0, ("out", "n2"): 0.0}
    data = status_data(r, rates)
    states = {n["id"]: (n["state"], n["why"]) for n in data["nodes"]}
    assert states["n1"] == ("ready", "")
    assert states["n2"][0] == "draining"
    assert states["n3"] == ("down", "no answer: unreachable (UNAVAILABLE)")
    assert states["n4"][0] == "down" and "crashed" in states["n4"][1]
    assert states["n5"][0] == "left"
    n1 = data["nodes"][0]
    assert (n1["rate_out"], n1["rate_in"], n1["etcd"], n1["uptime"]) == (12.5, None, "ok", "75s")
    assert data["totals"] == {"nodes": 5, "ready": 1, "down": 2, "clients": 6, "retained": 12,
                              "sessions": 9, "rate_out": 12.5, "rate_in": None,
                              "shedding": ["n1"]}
    pairs = {(x["from"], x["to"]): (x["state"], x["rate"], x["last_error"])
             for x in data["links"]}
    assert pairs == {("n1", "n2"): ("up", 12.0, ""),
                     ("n1", "n3"): ("down", None, "connection refused"),
                     ("n2", "n1"): ("up", None, ""), ("n2", "n3"): ("partial", None, "")}


def test_node_table_html() -> None:
    data = status_data(reply(), {("out", "n1"): 12.5})
    html = nodes_html(data["nodes"])
    rows = re.findall(r'<tr class="state-(\w+)" data-node="(\w+)">', html)
    assert rows == [("ready", "n1"), ("draining", "n2"), ("down", "n3"), ("down", "n4"),
                    ("left", "n5")]
    assert 'data-rate="out" data-total="1000"' in html
    assert "SHEDDING (7 shed)" in html and "12.5" in html and "4 / 1" in html
    assert "no answer: unreachable (UNAVAILABLE)" in html
    assert "<script" not in html


def test_matrix_summary_and_escaping() -> None:
    data = status_data(reply(), {})
    matrix = links_html(data["nodes"], data["links"])
    assert 'class="link link-down" data-from="n1" data-to="n3" data-sent="0" ' \
        'title="connection refused"' \
        in matrix
    assert matrix.count("no answer") == 2  # the rows of n3 and n4
    assert "to n5" not in matrix and "<th>n5</th>" not in matrix  # it left
    summary = summary_html(data)
    assert "partial answer" in summary and "127.0.0.1:7103" in summary
    assert "1 of 5" in summary and ">n1<" in summary
    full = page(TEMPLATE, data["cluster"], "n1", {"nodes": nodes_html(data["nodes"])},
                "a/<b>", True)
    assert "c&lt;1&gt;" in full and 'value="a/&lt;b&gt;"' in full and "c<1>" not in full
    assert 'data-node="n1"' in full and "{{" not in full


def test_routes() -> None:
    r = admin_pb2.RoutesReply(answered_by="n1", routes=[
        admin_pb2.Route(from_node="n1", to_node="n2", filter="a/+"),
        admin_pb2.Route(from_node="n2", to_node="n2", filter="a/+", subscribers=2),
        admin_pb2.Route(from_node="n3", to_node="n2", filter="a/#", group="g")])
    data = routes_data("a/b", r)
    assert data["delivered_by"] == ["n2"]
    assert [x["subscribers"] for x in data["routes"]] == [None, 2, None]
    html = routes_html(data)
    assert '<b id="delivered-by">n2</b>' in html and html.count("<tr data-from") == 3
    empty = routes_html(routes_data("x", admin_pb2.RoutesReply()))
    assert "no node" in empty and "no route" in empty
