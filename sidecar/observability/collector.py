"""Prometheus metrics read at scrape time from the counters the node's parts already keep
(adapter; nothing on the hot path). Registered on a private registry per node."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from sidecar.node.facts import NodeView

__all__ = ["NodeCollector"]

OUTBOUND_STATES = ("up", "connecting", "backoff", "refused", "idle")


def _gauge(name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"mqfed_{name}", doc, labels=labels)


def _counter(name: str, doc: str, labels: list[str] | None = None) -> CounterMetricFamily:
    return CounterMetricFamily(f"mqfed_{name}", doc, labels=labels)


class NodeCollector(Collector):
    """Every mqfed metric of one node."""

    def __init__(self, node: NodeView, version: str) -> None:
        self.node = node
        self.version = version

    def collect(self) -> Iterator[Metric]:
        node = self.node
        info = _gauge("node_info", "This node (value 1).", ["node", "cluster", "version"])
        info.add_metric([node.config.node_id, node.config.cluster, self.version], 1)
        yield info
        yield GaugeMetricFamily("mqfed_ready", "1 once the node serves (plugin in sync).",
                                value=1 if node.ready else 0)
        yield from self._plugin()
        yield from self._sessions()
        yield from self._membership()
        if node.routing is not None:
            yield from self._routing()
        if node.sessions is not None:
            yield from self._cluster_sessions()
        if node.wills is not None:
            yield from self._wills()
        if node.drainer is not None:
            yield from self._drain()

    def _plugin(self) -> Iterator[Metric]:
        s = self.node.stream.stats()
        yield GaugeMetricFamily("mqfed_plugin_in_sync", "1 while the event stream is in sync.",
                                value=1 if s["in_sync"] else 0)
        yield CounterMetricFamily("mqfed_plugin_events_applied", "Plugin events applied.",
                                  value=s["applied"])
        yield CounterMetricFamily("mqfed_plugin_event_gaps", "Gaps seen in the plugin's "
                                  "event sequence.", value=s["gaps"])
        yield CounterMetricFamily("mqfed_plugin_resyncs", "Snapshots requested (re-syncs).",
                                  value=s["resyncs"])
        yield CounterMetricFamily("mqfed_plugin_duplicate_events", "Plugin events dropped as "
                                  "already applied.", value=s["duplicates"])
        broker = self.node.broker
        yield CounterMetricFamily("mqfed_broker_restarts", "Mosquitto restarts by the sidecar.",
                                  value=broker.restarts if broker else 0)

    def _sessions(self) -> Iterator[Metric]:
        s = self.node.table.sessions_status()
        clients = _gauge("clients", "Client sessions on this node.", ["state"])
        clients.add_metric(["online"], s["online"])
        clients.add_metric(["offline"], s["offline"])
        yield clients
        yield GaugeMetricFamily("mqfed_subscriptions", "Subscriptions on this node.",
                                value=s["subscriptions"])
        yield GaugeMetricFamily("mqfed_interest_filters", "Distinct filters with local "
                                "subscribers.", value=s["interest"])

    def _cluster_sessions(self) -> Iterator[Metric]:
        service = self.node.sessions
        assert service is not None
        st = service.status()
        g = _gauge("sessions", "Sessions in the cluster's registry, as this node sees them.",
                   ["state"])
        g.add_metric(["online"], st["online"])
        g.add_metric(["offline"], st["sessions"] - st["online"])
        g.add_metric(["owned_here"], st["owned"])
        yield g
        yield CounterMetricFamily("mqfed_session_moves", "Sessions resumed here that another "
                                  "node held.", value=st["moves"])
        moved = CounterMetricFamily("mqfed_session_ordered_moves", "Moves whose client got the "
                                    "queue it left behind before what reached it here "
                                    "meanwhile (outcome: in order; in order after the client "
                                    "moved on before that queue came, this copy then handed "
                                    "on with it; the wait for that queue timed out; the "
                                    "client started clean elsewhere first).",
                                    labels=["outcome"])
        moved.add_metric(["in_order"], st.get("ordered_moves", 0))
        moved.add_metric(["chained"], st.get("order_chained", 0))
        moved.add_metric(["timed_out"], st.get("order_timeouts", 0))
        moved.add_metric(["moved_on"], st.get("order_moved_on", 0))
        yield moved
        waits = _counter("session_settle_waits", "Connects kept out here (closed without a "
                         "CONNACK, the client retries) while the node the client had just "
                         "moved to was still taking its old queue (outcome: the move settled "
                         "first; the wait's bound passed and the move chained).", ["outcome"])
        waits.add_metric(["settled"], st.get("settle_waited", 0)
                         - st.get("settle_waits_expired", 0))
        waits.add_metric(["expired"], st.get("settle_waits_expired", 0))
        yield waits
        claims = _counter("session_claims", "Claims of a client whose session another node "
                          "owns, made here before admitting it (outcome: every peer granted "
                          "it; a peer refused it or an earlier claim won; it lapsed, granted "
                          "or not, before the client came).", ["outcome"])
        claims.add_metric(["won"], st.get("claims_won", 0))
        claims.add_metric(["lost"], st.get("claims_lost", 0))
        claims.add_metric(["lapsed"], st.get("claims_lapsed", 0))
        yield claims
        granted = _counter("session_claims_answered", "Other nodes' claims answered here "
                           "(granted: the client is kept out here while it is in force).",
                           ["answer"])
        granted.add_metric(["granted"], st.get("claims_granted", 0))
        granted.add_metric(["refused"], st.get("claims_refused", 0))
        yield granted
        yield CounterMetricFamily("mqfed_session_takeovers", "Local connections closed because "
                                  "their client id connected on another node.",
                                  value=st["takeovers"])
        moved = _counter("session_queued_messages", "Messages a moving session had queued "
                         "on its old node, handed over to its new one, by outcome.", ["outcome"])
        moved.add_metric(["sent"], st["backlog_sent"])
        moved.add_metric(["received"], st["backlog_received"])
        moved.add_metric(["failed"], st["backlog_failed"])
        yield moved
        unreleased = _counter("session_unreleased_messages", "QoS 2 messages a moving client "
                              "had acknowledged (PUBREC) but not seen released, sent again "
                              "on its new node under the same packet id, by outcome.",
                              ["outcome"])
        for outcome in ("sent", "received", "refused"):
            unreleased.add_metric([outcome], st[f"unreleased_{outcome}"])
        yield unreleased
        if st.get("queued_here") is not None:
            yield GaugeMetricFamily("mqfed_session_queued_here", "QoS > 0 messages this "
                                    "node's Mosquitto queued for offline sessions (the "
                                    "plugin's count of what it routed to them).",
                                    value=st["queued_here"])
        yield CounterMetricFamily("mqfed_session_records_refused", "Session records from peers "
                                  "dropped because no Mosquitto could hold them (invalid client "
                                  "id, filter, owner or protocol).", value=st["records_refused"])
        ops = _counter("session_operations", "Shadow operations on this node's Mosquitto.",
                       ["operation"])
        for op in ("materialized", "drained", "discarded", "failures"):
            ops.add_metric([op], st[op])
        yield ops
        buckets, total = service.handover_histogram()
        yield HistogramMetricFamily("mqfed_session_handover_seconds", "Time to make a moving "
                                    "session on this node (the client waits that long, plus "
                                    "its reconnect delay).", buckets=buckets, sum_value=total)

    def _drain(self) -> Iterator[Metric]:
        """The drain (`mqfed ctl drain`) and what mixed versions cost (issue 20)."""
        assert self.node.drainer is not None
        p = self.node.drainer.progress()
        state = _gauge("drain", "1 for this node's drain state (serving, draining, drained).",
                       ["state"])
        for name in ("serving", "draining", "drained"):
            state.add_metric([name], 1 if p.state == name else 0)
        yield state
        yield GaugeMetricFamily("mqfed_drain_sessions_owned", "Sessions this draining node "
                                "still owns.", value=p.sessions_owned if p.state != "serving"
                                else 0)
        routing = self.node.routing
        if routing is None:
            return
        withheld = _counter("peer_frames_withheld", "Frames not sent to a peer that cannot "
                            "read them (an older version without the capability).",
                            ["peer", "capability"])
        for peer, st in routing.transport.states().items():
            for cap, n in (st.get("withheld") or {}).items():
                withheld.add_metric([peer, cap], n)
        yield withheld

    def _wills(self) -> Iterator[Metric]:
        assert self.node.wills is not None
        st = self.node.wills.status()
        g = _gauge("wills", "Will records in the cluster's table, as this node sees them.",
                   ["state"])
        g.add_metric(["pending"], st["pending"])
        g.add_metric(["orphaned"], st["orphaned"])
        g.add_metric(["all"], st["records"])
        yield g
        pub = _counter("wills_published", "Wills this node published on behalf of another "
                       "node (dead_node: confirmed dead; leaving: handed over at a drain; "
                       "lost: its Mosquitto restarted).", ["reason"])
        for reason in ("dead_node", "leaving", "lost"):
            pub.add_metric([reason], st[f"published_{reason}"])
        yield pub
        yield CounterMetricFamily("mqfed_wills_skipped", "Wills of another node not published "
                                  "because the client connected again meanwhile.",
                                  value=st["skipped_reconnected"])
        yield CounterMetricFamily("mqfed_will_publish_failures", "Attempts to publish a will "
                                  "on behalf of another node that failed (retried).",
                                  value=st["publish_failures"])
        yield CounterMetricFamily("mqfed_node_deaths_confirmed", "Peers this node confirmed "
                                  "dead (lease expired, streams down for wills.grace).",
                                  value=st["deaths_confirmed"])
        yield CounterMetricFamily("mqfed_will_false_death", "Peers confirmed dead that came "
                                  "back with the same incarnation (cut off, not dead).",
                                  value=st["deaths_false"])
        yield CounterMetricFamily("mqfed_wills_published_while_online", "This node's clients "
                                  "whose will a peer published while they were connected here "
                                  "(this node was taken for dead).",
                                  value=st["published_while_online"])

    def _membership(self) -> Iterator[Metric]:
        m = self.node.membership
        mode = self.node.config["membership"]["mode"]
        yield GaugeMetricFamily("mqfed_etcd_reachable", "1 while etcd answers (etcd mode).",
                                value=1 if m is not None and m.reachable else 0)
        yield GaugeMetricFamily("mqfed_etcd_registered", "1 while this node's key is in etcd "
                                "under a live lease.", value=1 if m is not None and m.registered
                                else 0)
        members = len(m.view.members()) if m is not None else 1 + len(self.node.peers)
        g = _gauge("members", "Cluster members this node sees (itself included).", ["mode"])
        g.add_metric([mode], members)
        yield g

    def _routing(self) -> Iterator[Metric]:
        r = self.node.routing
        assert r is not None
        sent = _counter("peer_messages_sent", "Messages sent to a peer (resends included).",
                        ["peer"])
        received = _counter("peer_messages_received", "Messages received from a peer.",
                            ["peer"])
        frames = _counter("peer_frames", "Stream frames.", ["peer", "stream", "direction"])
        nbytes = _counter("peer_bytes", "Stream bytes.", ["peer", "stream", "direction"])
        up = _gauge("peer_stream_up", "1 while the stream is up.", ["peer", "stream"])
        state = _gauge("peer_stream_state", "1 for the outbound stream's current state.",
                       ["peer", "state"])
        reconnects = _counter("peer_stream_reconnects", "Outbound stream re-establishments.",
                              ["peer"])
        qdepth = _gauge("queue_messages", "QoS >= 1 messages queued for a peer (memory + "
                        "spilled).", ["peer"])
        qbytes = _gauge("queue_bytes", "Bytes queued for a peer.", ["peer"])
        qflight = _gauge("queue_in_flight", "Messages sent to a peer, not acked yet.", ["peer"])
        spilled = _gauge("queue_spilled_messages", "Messages queued for a peer that are in its "
                         "spill file (not acked within 0.5 s, or the peer is down).", ["peer"])
        spilled_bytes = _gauge("queue_spilled_bytes", "Bytes in a peer's spill file.", ["peer"])
        sframes = _gauge("stream_queued_frames", "Frames waiting to be written.", ["peer"])
        dropped = _counter("dropped", "Messages dropped, by reason.", ["reason"])
        for peer, st in r.transport.states().items():
            sent.add_metric([peer], r.peer_sent.get(peer, 0))
            received.add_metric([peer], r.peer_received.get(peer, 0))
            reconnects.add_metric([peer], st["reconnects"])
            for name in OUTBOUND_STATES:
                state.add_metric([peer, name], 1 if st["outbound"]["state"] == name else 0)
            for stream in ("outbound", "inbound"):
                s = st[stream]
                up.add_metric([peer, stream], 1 if s["state"] == "up" else 0)
                frames.add_metric([peer, stream, "in"], s["frames_in"])
                frames.add_metric([peer, stream, "out"], s["frames_out"])
                nbytes.add_metric([peer, stream, "in"], s["bytes_in"])
                nbytes.add_metric([peer, stream, "out"], s["bytes_out"])
            sframes.add_metric([peer], st["outbound"]["queued"])
        queue_drops: dict[str, int] = {}
        for peer, q in r.queues.items():
            qdepth.add_metric([peer], q.count())
            qbytes.add_metric([peer], q.bytes())
            qflight.add_metric([peer], q.in_flight)
            spilled.add_metric([peer], q.spilled())
            spilled_bytes.add_metric([peer], q.spilled_bytes())
            for reason, n in q.dropped.items():
                queue_drops[reason] = queue_drops.get(reason, 0) + n
        c = r.counters
        fwd = r.forward_client.stats()
        for reason, n in (("qos0_stream_down", c["qos0_dropped"]),
                          ("unroutable", c["unroutable"]),
                          ("too_large", c["too_large"]),
                          ("shared_no_member", c["shared_dropped"]),
                          ("mosquitto_overflow", fwd["lost"]),
                          *((f"queue_{k}", v) for k, v in sorted(queue_drops.items()))):
            dropped.add_metric([reason], n)
        yield from (sent, received, frames, nbytes, up, state, reconnects, qdepth, qbytes, qflight,
                    spilled, spilled_bytes, sframes, dropped)
        yield CounterMetricFamily("mqfed_shared_repicked", "Shared deliveries from peers whose "
                                  "member had left the group here: the origin picks again.",
                                  value=c["shared_repicked"])
        yield CounterMetricFamily("mqfed_forwarded", "Local publishes forwarded to at least "
                                  "one peer.", value=r.forwarder.forwarded)
        yield CounterMetricFamily("mqfed_forward_resent", "Copies Mosquitto discarded for the "
                                  "forwarding client (its packet limit) and resent after a "
                                  "reconnect.", value=fwd["dropped_by_mosquitto"])
        yield CounterMetricFamily("mqfed_forward_recoveries", "Forwarding client reconnects "
                                  "to get discarded copies resent.", value=fwd["recoveries"])
        yield GaugeMetricFamily("mqfed_forward_unacked", "Copies taken from Mosquitto, not "
                                "acknowledged to it yet.", value=fwd["unacked"])
        bp = r.backpressure
        yield GaugeMetricFamily("mqfed_overload_shedding", "1 while publishers of QoS > 0 "
                                "messages peers want are disconnected before their ack "
                                "(overload).", value=int(bp.shedding or bp.plugin_shedding))
        yield GaugeMetricFamily("mqfed_forward_backlog", "Copies Mosquitto holds for the "
                                "forwarding client, taken or not (the plugin's estimate; "
                                "publishers are shed at overload.backlog_max).",
                                value=bp.plugin_backlog)
        yield CounterMetricFamily("mqfed_publishers_shed", "Publishers disconnected before "
                                  "their message was acknowledged, because of overload.",
                                  value=bp.publishers_shed)
        yield CounterMetricFamily("mqfed_received", "Messages received from peers.",
                                  value=c["received"])
        yield CounterMetricFamily("mqfed_deduplicated", "Received messages dropped as "
                                  "duplicates.", value=c["duplicates"])
        yield CounterMetricFamily("mqfed_reinjected", "Received messages published locally.",
                                  value=c["reinjected"])
        refused = _counter("reinject_refused", "Publishes Mosquitto refused from the forwarding "
                           "client (each attempt; they are retried, never confirmed).",
                           ["reason"])
        for reason, n in sorted(r.forward_client.refused_by_reason().items()):
            refused.add_metric([reason], n)
        yield refused
        window = fwd["reinject"]
        yield GaugeMetricFamily("mqfed_reinject_held", "Messages held behind a refused one "
                                "(retried with backoff).", value=window["held"])
        yield GaugeMetricFamily("mqfed_reinject_in_flight", "Publishes in flight to Mosquitto "
                                "(at most its Receive Maximum).", value=window["in_flight"])
        yield CounterMetricFamily("mqfed_forward_subscribe_refused", "Forwarding "
                                  "subscriptions Mosquitto refused (retried).",
                                  value=fwd["subscribe_refused"])
        yield CounterMetricFamily("mqfed_shared_delivered", "Shared-subscription deliveries to "
                                  "a local member.", value=c["shared_delivered"])
        yield GaugeMetricFamily("mqfed_pending_local_acks", "Local QoS >= 1 copies waiting for "
                                "peers.", value=r.forwarder.pending)
        yield CounterMetricFamily("mqfed_trace_hops", "Hops recorded for traced messages.",
                                  value=r.tracer.recorded)
        ret = r.retained.status()
        entries = _gauge("retained_entries", "Retained index entries by kind.", ["kind"])
        for kind in ("live", "tombstones", "expired"):
            entries.add_metric([kind], ret[kind])
        yield entries
        yield CounterMetricFamily("mqfed_retained_purged", "Tombstones and expired retained "
                                  "messages forgotten after retained.tombstone_grace.",
                                  value=ret["purged"])
        yield from self._interest()
        yield from self._catch_up()
        h = r.hop_latency
        buckets = [("+Inf" if b == float("inf") else repr(b / 1000), n)
                   for b, n in h.cumulative()]
        yield HistogramMetricFamily(
            "mqfed_forward_hop_latency_seconds", "From the origin's HLC stamp to receipt here "
            "(includes clock skew between nodes).", buckets=buckets, sum_value=h.sum_ms / 1000)

    def _catch_up(self) -> Iterator[Metric]:
        """Catch-up of peers' new subscriptions (architecture §3, "Catch-up")."""
        r = self.node.routing
        assert r is not None
        st = r.catch_up_status()
        replayed = _counter("catchup_replayed", "Messages sent to a peer for its new "
                            "subscription, published here between its subscribe time (minus "
                            "catchup.margin) and this node learning of it, by where they were "
                            "found: the plugin's ring (no forwarding subscription took them) or "
                            "the sidecar's (they went to other peers).", ["source"])
        replayed.add_metric(["plugin"], st["replayed_plugin"])
        replayed.add_metric(["sidecar"], st["replayed_recent"])
        yield replayed
        yield CounterMetricFamily("mqfed_catchup_requests", "Catch-up requests (a peer's new "
                                  "interest, up to 1,000 filters each).", value=st["requests"])
        yield CounterMetricFamily("mqfed_catchup_incomplete", "Catch-ups whose window reached "
                                  "past what the plugin's ring still held (raise "
                                  "catchup.window or catchup.max_bytes).",
                                  value=st["incomplete"])
        yield CounterMetricFamily("mqfed_catchup_failed", "Catch-ups the plugin did not answer "
                                  "in time (what they held went on without them).",
                                  value=st["failed"])
        yield CounterMetricFamily("mqfed_catchup_late", "Peers' new interest keys that arrived "
                                  "more than catchup.window after their subscription (no "
                                  "catch-up: raise the window, or see the interest lag).",
                                  value=st["too_old"])
        yield CounterMetricFamily("mqfed_catchup_clock_ahead", "Peers' subscribe times ahead "
                                  "of this node's clock by more than catchup.margin (clock "
                                  "skew beyond the margin: messages may be missed).",
                                  value=st["ahead"])
        entries = _gauge("catchup_ring_entries", "Recent publishes kept for catch-up: in the "
                         "plugin (every local publish) and in the sidecar (forwarded copies).",
                         ["ring"])
        nbytes = _gauge("catchup_ring_bytes", "Bytes of the catch-up rings.", ["ring"])
        entries.add_metric(["plugin"], st["plugin_entries"])
        entries.add_metric(["sidecar"], st["recent_entries"])
        nbytes.add_metric(["plugin"], st["plugin_bytes"])
        nbytes.add_metric(["sidecar"], st["recent_bytes"])
        yield entries
        yield nbytes
        yield GaugeMetricFamily("mqfed_catchup_held", "Messages for peers held until their "
                                "catch-up is sent.", value=st["held"])

    def _interest(self) -> Iterator[Metric]:
        """Interest lag per peer (docs/operations.md: alert above 5 s for a minute)."""
        r = self.node.routing
        assert r is not None
        st = r.interest_status()
        lag = _gauge("interest_lag_seconds", "Age of the oldest interest change of this node "
                     "that the peer has not put into effect yet (0: current).", ["peer"])
        pending = _gauge("interest_deltas_pending", "Interest deltas this node sent that the "
                         "peer has not put into effect yet.", ["peer"])
        held = _gauge("interest_keys_held", "Interest keys (filters) a peer holds, as known "
                      "here.", ["peer"])
        for peer, p in st["peers"].items():
            lag.add_metric([peer], p["lag_seconds"])
            pending.add_metric([peer], p["deltas_pending"])
            held.add_metric([peer], p["keys_held"])
        yield lag
        yield pending
        yield held
        yield GaugeMetricFamily("mqfed_interest_keys", "This node's interest keys.",
                                value=st["keys"])
        yield GaugeMetricFamily("mqfed_interest_persist_pending", "Forwarding-state rows not "
                                "written to disk yet.", value=st["persist_pending"])
        yield GaugeMetricFamily("mqfed_forwarding_subscriptions", "Forwarding subscriptions "
                                "this node's sidecar holds on its Mosquitto.",
                                value=r.remote.subscription_count())
        h = r.lag.histogram
        buckets = [("+Inf" if b == float("inf") else repr(b / 1000), n)
                   for b, n in h.cumulative()]
        yield HistogramMetricFamily(
            "mqfed_interest_apply_seconds", "From an interest change here to a peer putting it "
            "into effect (one observation per delta and peer).", buckets=buckets,
            sum_value=h.sum_ms / 1000)
