"""This node's own answers to admin queries (adapter: reads the node's cores, no I/O)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sidecar._proto import admin_pb2
from sidecar.admin.directory import Entry
from sidecar.admin.retained import RetainedSource
from sidecar.peering.capabilities import features_off
from sidecar.peering.handshake import PROTOCOL_MAJOR, PROTOCOL_MINOR
from sidecar.topics import matches

if TYPE_CHECKING:
    from sidecar.node.facts import NodeView

__all__ = ["Answers", "node_info"]

DEFAULT_LIMIT = 10_000


def node_info(entry: Entry, self_id: str) -> admin_pb2.NodeInfo:
    r = entry.record
    return admin_pb2.NodeInfo(node_id=r.node_id, state=entry.state, mqtt=r.mqtt, grpc=r.grpc,
                              admin=r.admin, version=r.version, incarnation=r.incarnation,
                              started_at=r.started_at, since=entry.since,
                              self=r.node_id == self_id)


QUEUEING = ("session", "replica-queueing")  # `here` values whose Mosquitto session queues


def _limit(query: admin_pb2.Query) -> int:
    return query.limit or DEFAULT_LIMIT


class Answers:
    """Builds this node's part of every admin reply."""

    def __init__(self, node: NodeView, version: str,
                 retained: Callable[[], RetainedSource]) -> None:
        self.node = node
        self.version = version
        self.retained_source = retained

    @property
    def node_id(self) -> str:
        return self.node.config.node_id

    def status(self) -> admin_pb2.NodeStatus:
        node, cfg = self.node, self.node.config
        routing = node.routing
        stream = node.stream.stats()
        sessions = node.table.sessions_status()
        membership = node.membership
        out = admin_pb2.NodeStatus(
            node_id=cfg.node_id, cluster=cfg.cluster, version=self.version,
            incarnation=routing.incarnation if routing else 0, started_at=node.started_at,
            uptime_s=time.time() - node.started_at, ready=node.ready,
            mqtt=cfg["mqtt"]["listen"], grpc=cfg.advertised("grpc"),
            admin=cfg.advertised("admin"), metrics=cfg["admin"]["metrics"],
            membership=cfg["membership"]["mode"],
            etcd_reachable=bool(membership and membership.reachable),
            etcd_registered=bool(membership and membership.registered),
            plugin_in_sync=bool(stream["in_sync"]), plugin_gaps=stream["gaps"],
            plugin_resyncs=stream["resyncs"], clients_online=sessions["online"],
            clients_offline=sessions["offline"], subscriptions=sessions["subscriptions"],
            protocol=f"{PROTOCOL_MAJOR}.{PROTOCOL_MINOR}",
            drain=node.drainer.core.state if node.drainer else "serving")
        if node.sessions is not None:
            registry = node.sessions.status()
            out.sessions, out.sessions_owned = registry["sessions"], registry["owned"]
        if routing is None:
            return out
        bp = routing.backpressure
        out.shedding = bool(bp.shedding or bp.plugin_shedding)
        out.publishers_shed = bp.publishers_shed
        out.forward_backlog = bp.plugin_backlog
        out.retained = routing.retained.status()["live"]
        out.reinjected = routing.counters["reinjected"]
        draining = node.drainer.draining_peers if node.drainer else set()
        out.forwarded = routing.forwarder.forwarded
        out.received = routing.counters["received"]
        interest = routing.interest_status()["peers"]
        for peer, state in routing.transport.states().items():
            queue = routing.queues.get(peer)
            lag = interest.get(peer, {})
            out.peers.add(peer=peer, outbound=state["outbound"]["state"],
                          inbound=state["inbound"]["state"], reconnects=state["reconnects"],
                          last_error=state["last_error"] or "",
                          queued_messages=queue.count() if queue else 0,
                          queued_bytes=queue.bytes() if queue else 0,
                          messages_sent=routing.peer_sent.get(peer, 0),
                          messages_received=routing.peer_received.get(peer, 0),
                          interest_lag_s=lag.get("lag_seconds", 0.0),
                          interest_pending=lag.get("deltas_pending", 0),
                          interest_keys=lag.get("keys_held", 0),
                          protocol=state.get("protocol") or "",
                          features_off=features_off(frozenset(state.get("capabilities") or ()))
                          if state.get("protocol") else [],
                          draining=peer in draining)
        return out

    def routes(self, query: admin_pb2.Query) -> list[admin_pb2.Route]:
        """Where a message published here goes, and because of which filter."""
        topic = query.topic  # validated by the server
        me = self.node_id
        rows: list[admin_pb2.Route] = []
        for key, count in sorted(self.node.table.interest().items(),
                                 key=lambda kv: (kv[0].filter, kv[0].group or "")):
            if not topic or matches(key.filter, topic):
                rows.append(admin_pb2.Route(from_node=me, to_node=me, filter=key.filter,
                                            group=key.group or "", subscribers=count))
        routing = self.node.routing
        if routing is not None:
            for peer in sorted(routing.remote.peers()):
                for key in sorted(routing.remote.keys(peer),
                                  key=lambda k: (k.filter, k.group or "")):
                    if not topic or matches(key.filter, topic):
                        rows.append(admin_pb2.Route(from_node=me, to_node=peer,
                                                    filter=key.filter, group=key.group or ""))
        return rows[:_limit(query)]

    def subscriptions(self, query: admin_pb2.Query) -> list[admin_pb2.Subscription]:
        table = self.node.table
        rows = []
        for client, info in sorted(table.sessions().items()):
            if query.client and client != query.client:
                continue
            for filt, qos in sorted(table.subscriptions(client).items()):
                rows.append(admin_pb2.Subscription(node_id=self.node_id, client=client,
                                                   filter=filt, qos=qos, online=info.online))
        return rows[:_limit(query)]

    def clients(self, query: admin_pb2.Query) -> list[admin_pb2.Client]:
        table = self.node.table
        rows = []
        for client, info in sorted(table.sessions().items()):
            if query.client and client != query.client:
                continue
            expiry = -1 if info.session_expiry is None else info.session_expiry
            rows.append(admin_pb2.Client(
                node_id=self.node_id, client=client, online=info.online,
                persistent=info.persistent, clean_start=info.clean_start, session_expiry=expiry,
                username=info.username or "", protocol=info.protocol,
                subscriptions=len(table.subscriptions(client))))
        return rows[:_limit(query)]

    async def sessions(self, query: admin_pb2.Query) -> list[admin_pb2.Session]:
        service = self.node.sessions
        if service is None:
            return []
        rows = self._sessions(service, query)
        offline = [r.client for r in rows if r.here in QUEUEING]
        counts = await service.queued(offline) if offline else {}
        for r in rows:
            r.queued = -1 if counts is None or r.here not in QUEUEING else counts.get(r.client, 0)
        return rows

    def _sessions(self, service: Any, query: admin_pb2.Query) -> list[admin_pb2.Session]:
        rows = []
        for r in sorted(service.sessions(query.client or None), key=lambda r: r["client"]):
            rows.append(admin_pb2.Session(
                node_id=self.node_id, client=r["client"], owner=r["owner"], online=r["online"],
                persistent=r["persistent"],
                session_expiry=-1 if r["expiry"] is None else r["expiry"],
                expires_in_s=-1 if r["expires_in_s"] is None else r["expires_in_s"],
                protocol=r["protocol"], subscriptions=len(r["subscriptions"]),
                here=r["here"] or "", replicas=r["replicas"]))
        return rows[:_limit(query)]

    def retained(self, query: admin_pb2.Query) -> admin_pb2.RetainedReply:
        source = self.retained_source()
        items = source.retained(query.prefix, _limit(query))
        reply = admin_pb2.RetainedReply(answered_by=self.node_id)
        reply.sources[self.node_id] = source.source
        reply.entries.extend(admin_pb2.RetainedEntry(
            node_id=self.node_id, topic=i.topic, payload_bytes=i.payload_bytes, qos=i.qos,
            origin_node=i.origin_node, hlc=i.hlc) for i in items)
        return reply
