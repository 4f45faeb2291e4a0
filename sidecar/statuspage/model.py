"""The status page's data (sans-IO): a cluster-wide `Status` reply (the one `mqfed ctl
status` shows) and a `Routes` reply as plain JSON-able dicts, with message rates."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

from sidecar._proto import admin_pb2
from sidecar.admin.render import duration, etcd_state

__all__ = ["counters", "node_state", "routes_data", "status_data"]

Rates = Mapping[Hashable, float | None]


def node_state(info: admin_pb2.NodeInfo, status: admin_pb2.NodeStatus | None,
               error: str = "") -> tuple[str, str]:
    """(state, why): ready, starting, draining, drained, down or left."""
    if info.state == "left":
        return "left", "left the cluster gracefully"
    if info.state == "crashed":
        return "down", "crashed: its membership key expired"
    if status is None:
        return "down", f"no answer: {error}" if error else "no answer"
    if status.drain in ("draining", "drained"):
        return status.drain, "clients are moved to the other nodes"
    if not status.ready:
        return "starting", "its plugin is not in sync yet"
    return "ready", ""


def counters(reply: admin_pb2.StatusReply) -> dict[Hashable, float]:
    """The message counters whose rates the page shows: per node ("out": local publishes
    forwarded to peers, "in": messages received from peers, "delivered": of those, published
    to local subscribers) and per node pair ("sent", FROM, TO)."""
    out: dict[Hashable, float] = {}
    for s in reply.statuses:
        out[("out", s.node_id)] = s.forwarded
        out[("in", s.node_id)] = s.received
        out[("delivered", s.node_id)] = s.reinjected
        for p in s.peers:
            out[("sent", s.node_id, p.peer)] = p.messages_sent
    return out


def _link_state(p: admin_pb2.PeerLink) -> str:
    ups = (p.outbound == "up") + (p.inbound == "up")
    return "up" if ups == 2 else "down" if ups == 0 else "partial"


def status_data(reply: admin_pb2.StatusReply, rates: Rates) -> dict[str, Any]:
    """Nodes, peer streams (as each node sees them), cluster totals, nodes that did not
    answer; `rates` by the keys of `counters` (None: not known yet)."""
    by_id = {s.node_id: s for s in reply.statuses}
    errors = {m.node_id: m.error for m in reply.missing}
    nodes = []
    for info in reply.nodes:
        s = by_id.get(info.node_id)
        state, why = node_state(info, s, errors.get(info.node_id, ""))
        row: dict[str, Any] = {"id": info.node_id, "state": state, "why": why,
                               "self": info.self, "version": info.version,
                               "mqtt": info.mqtt, "admin": info.admin}
        if s is not None:
            row.update(
                version=s.version, mqtt=s.mqtt, admin=s.admin, uptime=duration(s.uptime_s),
                uptime_s=s.uptime_s, ready=s.ready, drain=s.drain, etcd=etcd_state(s),
                clients_online=s.clients_online, clients_offline=s.clients_offline,
                subscriptions=s.subscriptions, sessions=s.sessions,
                sessions_owned=s.sessions_owned, retained=s.retained, shedding=s.shedding,
                publishers_shed=s.publishers_shed, backlog=s.forward_backlog,
                forwarded=s.forwarded, received=s.received, delivered=s.reinjected,
                rate_out=rates.get(("out", s.node_id)), rate_in=rates.get(("in", s.node_id)),
                rate_delivered=rates.get(("delivered", s.node_id)))
        nodes.append(row)
    links = [{"from": s.node_id, "to": p.peer, "state": _link_state(p), "outbound": p.outbound,
              "inbound": p.inbound, "queued": p.queued_messages, "queued_bytes": p.queued_bytes,
              "reconnects": p.reconnects, "sent": p.messages_sent,
              "received": p.messages_received, "rate": rates.get(("sent", s.node_id, p.peer)),
              "draining": p.draining,
              "last_error": p.last_error if p.outbound != "up" else ""}
             for s in reply.statuses for p in s.peers]
    return {"cluster": reply.cluster, "answered_by": reply.answered_by, "nodes": nodes,
            "links": links, "totals": _totals(nodes),
            "missing": [{"node": m.node_id, "address": m.address, "error": m.error}
                        for m in reply.missing]}


def _sum(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _totals(nodes: list[dict[str, Any]]) -> dict[str, Any]:
    answered = [n for n in nodes if "ready" in n]
    return {
        "nodes": len(nodes), "ready": sum(n["state"] == "ready" for n in nodes),
        "down": sum(n["state"] == "down" for n in nodes),
        "clients": sum(n["clients_online"] for n in answered),
        # each node holds the whole replicated index and its view of the session registry
        "retained": max((n["retained"] for n in answered), default=0),
        "sessions": max((n["sessions"] for n in answered), default=0),
        "rate_out": _sum([n["rate_out"] for n in answered]),
        "rate_in": _sum([n["rate_in"] for n in answered]),
        "shedding": [n["id"] for n in answered if n["shedding"]],
    }


def routes_data(topic: str, reply: admin_pb2.RoutesReply) -> dict[str, Any]:
    """Where a message on `topic` goes from each node, and the nodes that deliver it."""
    routes = [{"from": r.from_node, "to": r.to_node, "filter": r.filter, "group": r.group,
               "subscribers": r.subscribers if r.from_node == r.to_node else None}
              for r in reply.routes]
    return {"topic": topic, "answered_by": reply.answered_by, "routes": routes,
            "delivered_by": sorted({r["to"] for r in routes}),
            "missing": [{"node": m.node_id, "address": m.address, "error": m.error}
                        for m in reply.missing]}
