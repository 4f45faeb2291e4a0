"""Human output of `mqfed ctl` (sans-IO): admin replies as aligned text tables."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from sidecar._proto import admin_pb2
from sidecar.peering.capabilities import MISSING_MEANS

__all__ = ["drain_line", "duration", "etcd_state", "missing_line", "render", "table"]


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], empty: str = "(none)") -> str:
    """Left-aligned columns separated by two spaces; `empty` when there are no rows."""
    if not rows:
        return empty
    cells = [[str(c) for c in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
             for r in cells]
    return "\n".join(lines)


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def duration(seconds: float) -> str:
    """Seconds as 42s, 17m or 3h05m."""
    seconds = int(max(seconds, 0))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def etcd_state(s: admin_pb2.NodeStatus) -> str:
    """How a node sees etcd: ok, unregistered, unreachable, or static (no etcd)."""
    if s.membership != "etcd":
        return "static"
    return ("ok" if s.etcd_reachable and s.etcd_registered else
            "unregistered" if s.etcd_reachable else "unreachable")


def missing_line(missing: Sequence[admin_pb2.Missing]) -> str:
    """The partial-answer notice naming the nodes that did not answer."""
    parts = [f"{m.node_id} ({m.address or 'no admin address'}: {m.error})" for m in missing]
    return "partial answer: no answer from " + "; ".join(parts)


def _status(r: admin_pb2.StatusReply, now: float) -> str:
    by_id = {s.node_id: s for s in r.statuses}
    rows = []
    for n in r.nodes:
        s = by_id.get(n.node_id)
        state = n.state if n.answered or n.state != "up" else "unreachable"
        if s is None:
            since = f"since {duration(now - n.since)}" if n.state != "up" else ""
            rows.append([n.node_id, state, "-", n.version, n.incarnation, since, "-", "-",
                         n.mqtt, n.admin])
            continue
        etcd = etcd_state(s)
        ready = _yes(s.ready) if s.drain in ("", "serving") else s.drain
        rows.append([n.node_id, state, ready, s.version, s.incarnation,
                     duration(s.uptime_s), etcd, f"{s.clients_online}/{s.clients_offline}",
                     s.mqtt, s.admin])
    nodes = table(["NODE", "STATE", "READY", "VERSION", "INCARNATION", "UPTIME", "ETCD",
                   "CLIENTS", "MQTT", "ADMIN"], rows)
    links = [[s.node_id, p.peer, p.outbound, p.inbound, p.reconnects, p.queued_messages,
              p.messages_sent, p.messages_received,
              p.last_error[:60] if p.outbound != "up" else ""]
             for s in r.statuses for p in s.peers]
    streams = table(["FROM", "TO", "OUT", "IN", "RECONNECTS", "QUEUED", "SENT", "RECEIVED",
                     "LAST ERROR"], links)
    interest = table(["FROM", "TO", "INTEREST LAG", "DELTAS PENDING", "TO'S FILTERS KNOWN"],
                     [[s.node_id, p.peer, f"{p.interest_lag_s:.2f}s", p.interest_pending,
                       p.interest_keys] for s in r.statuses for p in s.peers])
    plugin = table(["NODE", "PLUGIN IN SYNC", "EVENT GAPS", "RESYNCS", "FORWARDED",
                    "RECEIVED"],
                   [[s.node_id, _yes(s.plugin_in_sync), s.plugin_gaps, s.plugin_resyncs,
                     s.forwarded, s.received] for s in r.statuses])
    return (f"cluster {r.cluster} (answered by {r.answered_by})\n\n{nodes}\n\n"
            f"peer streams (as each node sees them)\n{streams}\n\n"
            f"interest (how far each peer's routing trails FROM's subscriptions; alert above "
            f"5 s)\n{interest}\n\n{plugin}{_mixed(r)}")


def _mixed(r: admin_pb2.StatusReply) -> str:
    """Pairs of nodes of different versions: which features are off between them and what
    that means, as each node of protocol 1.3 or later sees its peers."""
    rows = []
    for s in r.statuses:
        for p in s.peers:
            for feature in p.features_off:
                rows.append([s.node_id, p.peer, p.protocol, feature,
                             MISSING_MEANS.get(feature, "")])
    if not rows:
        return ""
    return ("\n\nmixed versions: features off between these nodes (until every node runs "
            "the same version)\n"
            + table(["NODE", "PEER", "PEER PROTOCOL", "OFF", "MEANING"], rows))


def _nodes(r: admin_pb2.NodesReply, now: float) -> str:
    return table(["NODE", "STATE", "SINCE", "VERSION", "INCARNATION", "MQTT", "GRPC", "ADMIN"],
                 [[n.node_id + (" *" if n.self else ""), n.state,
                   duration(now - n.since) if n.since else "", n.version, n.incarnation,
                   n.mqtt, n.grpc, n.admin] for n in r.nodes])


def _routes(r: admin_pb2.RoutesReply, now: float) -> str:
    return table(["FROM", "TO", "FILTER", "SHARE GROUP", "LOCAL SUBSCRIBERS"],
                 [[x.from_node, x.to_node, x.filter, x.group,
                   x.subscribers if x.from_node == x.to_node else ""] for x in r.routes],
                 empty="(no route: no node has a matching subscription)")


def _subscriptions(r: admin_pb2.SubscriptionsReply, now: float) -> str:
    return table(["NODE", "CLIENT", "FILTER", "QOS", "ONLINE"],
                 [[s.node_id, s.client, s.filter, s.qos, _yes(s.online)]
                  for s in r.subscriptions])


def _clients(r: admin_pb2.ClientsReply, now: float) -> str:
    return table(["NODE", "CLIENT", "ONLINE", "PERSISTENT", "EXPIRY", "PROTOCOL", "USERNAME",
                  "SUBSCRIPTIONS"],
                 [[c.node_id, c.client, _yes(c.online), _yes(c.persistent),
                   "?" if c.session_expiry < 0 else c.session_expiry, c.protocol, c.username,
                   c.subscriptions] for c in r.clients])


def _sessions(r: admin_pb2.SessionsReply, now: float) -> str:
    """One row per client id (the owner's view), with the nodes that hold a copy of it."""
    by_client: dict[str, list[admin_pb2.Session]] = {}
    for s in r.sessions:
        by_client.setdefault(s.client, []).append(s)
    rows = []
    for client, views in sorted(by_client.items()):
        best = next((v for v in views if v.node_id == v.owner), views[0])
        held = ",".join(sorted(f"{v.node_id}:{v.here}" + (f"({v.queued})" if v.queued > 0 else "")
                               for v in views if v.here)) or "-"
        expiry = "?" if best.session_expiry < 0 else best.session_expiry
        left = "-" if best.expires_in_s < 0 else best.expires_in_s
        replicas = ",".join(best.replicas) or "-"
        rows.append([client, best.owner, replicas, _yes(best.online), _yes(best.persistent),
                     expiry, left, best.protocol, best.subscriptions, held])
    return table(["CLIENT", "OWNER", "REPLICAS", "ONLINE", "PERSISTENT", "EXPIRY", "EXPIRES IN",
                  "PROTOCOL", "SUBSCRIPTIONS", "HELD ON"], rows)


def _retained(r: admin_pb2.RetainedReply, now: float) -> str:
    rows = table(["TOPIC", "BYTES", "QOS", "ORIGIN", "NODE"],
                 [[e.topic, e.payload_bytes, e.qos, e.origin_node, e.node_id]
                  for e in r.entries])
    sources = "\n".join(f"source on {node}: {src}" for node, src in sorted(r.sources.items()))
    return f"{rows}\n{sources}" if sources else rows


def _trace(r: admin_pb2.TraceReply, now: float) -> str:
    start = r.hops[0].at_ms if r.hops else 0.0
    rows = [[f"+{h.at_ms - start:.1f}", h.node_id, h.event, h.peer, h.detail] for h in r.hops]
    head = f"trace {r.trace_id}: topic {r.topic!r} published on {r.origin}"
    return head + "\n" + table(["MS", "NODE", "EVENT", "PEER(S)", "DETAIL"], rows)


def drain_line(p: admin_pb2.DrainProgress) -> str:
    """One line of a drain's progress."""
    if p.state == "serving":
        return f"{p.node_id}: serving (not draining)"
    phase = f" ({p.phase})" if p.phase and p.phase != p.state else ""
    # the plugin's count is refreshed every 2 s: with no session left it is only stale
    held = f" ({p.session_messages} messages in them)" if p.sessions_owned else ""
    line = (f"{p.node_id}: {p.state}{phase} after {p.seconds:.1f}s: {p.clients} clients, "
            f"{p.sessions_owned} sessions owned{held}, "
            f"{p.session_copies} session copies, {p.messages_queued} messages queued")
    if p.messages_queued_down:
        line += f", {p.messages_queued_down} for peers that are down"
    return line + (f"; {p.note}" if p.note else "")


def _drain(r: admin_pb2.DrainReply, now: float) -> str:
    return drain_line(r.progress)


_RENDER = {admin_pb2.StatusReply: _status, admin_pb2.DrainReply: _drain,
           admin_pb2.NodesReply: _nodes,
           admin_pb2.RoutesReply: _routes, admin_pb2.SubscriptionsReply: _subscriptions,
           admin_pb2.ClientsReply: _clients, admin_pb2.RetainedReply: _retained,
           admin_pb2.SessionsReply: _sessions,
           admin_pb2.TraceReply: _trace}


def render(reply: Any, now: float | None = None) -> str:
    """The reply as text (without the partial-answer notice)."""
    return _RENDER[type(reply)](reply, time.time() if now is None else now)
