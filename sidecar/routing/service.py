"""Cross-node routing of one node (wiring of the hot path, architecture §3).

Connects the routing cores (`LocalInterest`, `RemoteInterest`, `Forwarder`, `Receiver`,
`Pacing`, one `OutboundQueue` per peer) to the adapters (`PeerTransport` for gRPC,
`ForwardClient` for the local Mosquitto, the plugin's deliver command for shared-subscription
deliveries). It moves values between them; the decisions are the cores'. What is left here is
timing: when a flush runs, the spill of messages a peer has not acked after PERSIST_AFTER.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from operator import attrgetter
from pathlib import Path
from typing import Any, Protocol

from paho.mqtt.exception import MQTTException

from sidecar._proto import peer_pb2
from sidecar.admin.trace import TraceRecorder, trace_id
from sidecar.config import TOMBSTONE_GRACE
from sidecar.hlc import HybridClock, MessageId
from sidecar.local.batch import BatchError
from sidecar.local.events import CommandFailed, RetainedSeen
from sidecar.local.forward_shards import ForwardShards
from sidecar.local.pressure import Backpressure, Report, shed_threshold
from sidecar.local.shards import mid_range
from sidecar.message import publish_problem, topic_problem
from sidecar.observability.hops import HopRecorder, hops_folder
from sidecar.observability.latency import LatencyHistogram
from sidecar.peering import envelopes as peer_frames
from sidecar.peering.handshake import (
    DRAIN,
    INTEREST_CHUNKS,
    RECORDS,
    RETAINED,
    SESSION_CUTS,
    SESSION_CUTS_ANYWHERE,
    SESSIONS,
    WILLS,
    Accept,
    Handshake,
    Hello,
)
from sidecar.peering.outbound import OutboundQueue
from sidecar.peering.spill import SqliteSpillStore
from sidecar.peering.tls import PeerTls
from sidecar.peering.transport import FrameTooLarge, PeerTransport
from sidecar.retained.service import ReadRetained, RetainedService
from sidecar.routing.acks import sort_acks
from sidecar.routing.capture_intake import CaptureIntake
from sidecar.routing.catchup_wiring import CatchUpWiring
from sidecar.routing.forwarder import (
    LOCAL,
    AckLocal,
    CutMarker,
    DeliverLocalShared,
    Envelope,
    Forwarder,
    LocalCopy,
    QueueEnvelope,
    SendEnvelope,
)
from sidecar.routing.injection import BatchInjection
from sidecar.routing.interest import (
    LEAVE_STEP,
    InterestAction,
    LocalInterest,
    LocalSubscribe,
    LocalUnsubscribe,
    RemoteInterest,
    RequestSnapshot,
)
from sidecar.routing.interest_store import InterestPersister, open_store
from sidecar.routing.lag import InterestLag
from sidecar.routing.links_wiring import LinkWiring
from sidecar.routing.pacing import BATCH_MESSAGES, DRAIN_RATE, Pacing
from sidecar.routing.receiver import (
    DeliverShared,
    Receiver,
    SendAcks,
)
from sidecar.routing.records import WireRecord, read_records
from sidecar.routing.table import InterestChange, SubscriptionTable

log = logging.getLogger("mqfed.routing")

BATCH_BYTES = 1 << 20
FRAME_OVERHEAD = 16  # bytes a batch frame adds around one envelope (tags and lengths)
TOO_LARGE_LOG_EVERY = 10.0  # seconds between log lines about oversized messages
INTEREST_LINGER = 0.01  # seconds: interest deltas go at most this often, so a burst of
# subscriptions becomes a few large deltas (per-frame costs dominate small ones); a change
# after a quiet moment goes at once
FREEZE_AFTER = 20_000  # interest keys (held here or for peers) changed between gc.freeze()s
PERSIST_AFTER = 0.5  # seconds a QoS >= 1 message may wait for a peer's ack before it is spilled
# (0.05 before: under load many copies waited longer, were written to SQLite and deleted again
# a moment later, costing CPU that made the wait longer still; docs/performance.md section 8)


class PluginCommands(Protocol):
    """The plugin commands routing uses (`sidecar.node.sync.PluginSync` provides them)."""

    async def deliver(self, client: str, env: Envelope) -> None:
        """Deliver to one local client; raises when the plugin refuses or does not answer."""

    def probe_forwarding(self, clients: Sequence[str]) -> None:
        """Send these forwarding connections a probe (sidecar.local.midgaps)."""

    async def probe_with(self, token: bytes, clients: Sequence[str]) -> None:
        """Send every forwarding connection in `clients` a probe carrying `token` (a
        barrier)."""

    def report_pressure(self, report: Report,
                        on_reply: Callable[[dict[str, Any]], None]) -> None:
        """Report the overload state; `on_reply` gets the plugin's answer."""

    async def catchup(self, filters: tuple[tuple[str, int], ...]) -> dict[str, Any]:
        """The plugin's recent publishes these (filter, since ms) missed (its reply's fields);
        raises when the plugin refuses or does not answer."""

    @property
    def connected(self) -> bool:
        """The control link is up."""


class PeerFrames(Protocol):
    """Another replicated part that speaks over the peer streams (sessions, wills)."""

    def on_peer_up(self, peer: str) -> None: ...

    def on_peer_down(self, peer: str) -> None: ...

    def on_frame(self, peer: str, frame: peer_pb2.Frame, inbound: bool) -> None: ...


class RoutingService(CatchUpWiring):
    """Interest exchange, forwarding and re-injection for one node."""

    def __init__(self, *, hello: Hello, listen: str, run_dir: Path, table: SubscriptionTable,
                 make_forward_client: Callable[..., ForwardShards],
                 commands: PluginCommands,
                 read_retained: ReadRetained | None = None,
                 tombstone_grace: float = TOMBSTONE_GRACE, peer_token: str = "",
                 peer_tls: PeerTls | None = None, shed_above: int = 0,
                 check_peer_address: bool = True, max_message_bytes: int = 64 << 20,

                 catchup_window: float = 5.0, catchup_margin: float = 0.05,
                 catchup_bytes: int = 16 << 20, inject_batches: bool = True,
                 send_records: bool = True,
                 capture_socket: Path | None = None) -> None:
        """`capture_socket`: where the plugin hands over captured records (issue 25, slice
        2, `routing.capture`; None: `.fwd`'s MQTT copies only)."""
        self.hello = hello
        self.node_id = hello.node_id
        self.incarnation = hello.incarnation
        self.table = table
        self.spill_dir = run_dir / "spill"
        self.state_path = run_dir / "routing-state.json"  # before: the whole state as JSON
        self.commands = commands
        self.local_interest = LocalInterest()
        self.lag = InterestLag()
        self._interest_changes: list[InterestChange] = []
        self._changed_since_freeze = 0  # interest keys changed since the last gc.freeze()
        self._interest_due = False
        self._interest_sent_at = 0.0
        self._chunked: set[str] = set()  # peers that take chunked snapshots and send acks
        self._removals_due = False  # a step of dropping departed peers' interest is scheduled
        self.remote = RemoteInterest(journal=True)
        self.clock = HybridClock()
        recent = self._init_catch_up(catchup_window, catchup_margin, catchup_bytes)
        self.forwarder = Forwarder(self.node_id, self.incarnation, self.remote, self.clock,
                                   recent)
        self.receiver = Receiver()
        self.queues: dict[str, OutboundQueue] = {}
        self._offered_at: dict[str, dict[int, float]] = {}
        self._qos0: dict[str, list[bytes]] = {}
        self._flush_scheduled = False
        self._ack_timer: asyncio.TimerHandle | None = None
        self.last_copy_at = 0.0  # monotonic time Mosquitto last handed us messages
        self.on_peer_hello: Callable[[Hello], None] = lambda hello: None  # (admin directory)
        # a moving session's cut mode (sessions): whom this node's cut for a client goes to,
        # and the cut's seq once made (docs/architecture.md §5)
        self.cut_target: Callable[[str], str | None] = lambda client: None
        # whether a peer's cut for a client goes to the copy here (sessions' cut_applies)
        self.cut_applies: Callable[[str], bool] = lambda client: True
        self.on_cut: Callable[[str, int], None] = lambda client, seq: None
        self._tasks: list[asyncio.Task] = []
        self._counters = {"qos0_dropped": 0, "queue_refused": 0, "unroutable": 0,
                          "shared_member_gone": 0, "too_large": 0, "cuts": 0,
                          "cuts_not_here": 0, "records_sent": 0, "records_received": 0}
        self._too_large_logged = -TOO_LARGE_LOG_EVERY
        self._invalid_logged = -TOO_LARGE_LOG_EVERY
        self.peer_sent: dict[str, int] = {}  # messages per peer (metrics, admin status)
        self.peer_received: dict[str, int] = {}
        self.hop_latency = LatencyHistogram()  # origin HLC -> received here
        self.tracer = TraceRecorder(self.node_id)
        self.hops: HopRecorder | None = None  # hop records (`trace-hops` in the run dir)
        self._restore()
        self.transport = PeerTransport(Handshake(hello), listen, self, token=peer_token,
                                       tls=peer_tls, check_address=check_peer_address,
                                       max_message_bytes=max_message_bytes)
        self.forward_client = make_forward_client(on_copies=self._on_copies,
                                                  on_published=self._on_published,
                                                  on_connected=self._on_fwd_connected)
        fwd = self.forward_client
        self.send_records = send_records
        self.injection = (BatchInjection(fwd, self._on_published, self._reinject_each,
                                         fwd.max_queued) if inject_batches else None)
        self.backpressure = Backpressure(shed_threshold(fwd.receive_maximum, shed_above))
        self.pacing = Pacing(fwd.max_queued)
        self.sessions: PeerFrames | None = None  # the session registry's frames (node sets)
        self.wills: PeerFrames | None = None  # the will table's frames (node sets)
        self.drain: PeerFrames | None = None  # NodeState frames (node sets)
        self.links: LinkWiring | None = None  # the plugin's links (routing.links; node sets)
        self._barriers = itertools.count(1)
        self.capture = (CaptureIntake(capture_socket, self._on_copies,
                                      self.forwarder.forget_local_acks,
                                      lambda: self.forward_client.confirmations)
                        if capture_socket is not None else None)
        self.retained = RetainedService(self.node_id, self.clock, run_dir, self.transport, fwd,
                                        lambda: self.peers_with(RETAINED), read_retained,
                                        tombstone_grace)

    # ---- lifecycle ---------------------------------------------------------------------
    def _restore(self) -> None:
        """A restarted sidecar's MQTT session still holds the forwarding subscriptions (and
        unacked copies tagged with their identifiers): restore what they mean. The state is
        kept as rows, written per change off the loop (sidecar.routing.interest_store)."""
        store, state = open_store(self.state_path.with_name("routing-state.sqlite"),
                                  self.state_path)
        self.persister = InterestPersister(store)
        if state["sids"]:
            self.remote.restore(state)
            log.info("restored forwarding state", extra={"peers": len(state["peers"]),
                                                         "filters": len(state["sids"])})

    async def start(self, peers: Callable[[], Mapping[str, str]]) -> None:
        """Listen, then dial the membership view `peers()` returns *after* the listener is up
        (the view may change while it starts), then connect the forwarding client."""
        self.spill_dir.mkdir(parents=True, exist_ok=True)
        await self.transport.start()
        self._apply_blocked()
        self.set_peers(peers())  # queues exist before redelivered copies arrive
        self.retained.start()
        await self.forward_client.connect()
        if self.capture is not None:
            await self.capture.start()
        self._tasks.append(asyncio.create_task(self._persist_loop()))
        self._tasks.append(asyncio.create_task(self._faults_loop()))

    async def stop(self) -> None:
        if self._ack_timer is not None:
            self._ack_timer.cancel()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.retained.stop()
        if self.links is not None:
            await self.links.stop()
        if self.capture is not None:
            await self.capture.close()
        if self.hops is not None:
            self.hops.close()
        await self.persister.flush()
        self.persister.close()
        self.forward_client.close()
        await self.transport.stop()
        for queue in self.queues.values():
            queue.on_disconnected()
            queue.store.close()

    async def _faults_loop(self) -> None:
        """Fault injection for tests and drills: `<run_dir>/blocked-peers` lists node ids
        (one per line) this node keeps no stream with, as if the network between them were
        cut. Removing the file heals it."""
        while True:
            await asyncio.sleep(0.2)
            self._apply_blocked()
            self._apply_hops()

    def _apply_hops(self) -> None:
        """`<run_dir>/trace-hops` names a folder: hop records go there (observability.hops)."""
        folder = hops_folder(self.state_path.parent)
        if self.hops is not None and self.hops.directory != folder:
            self.hops.close()
            self.hops = None
        if folder is not None and self.hops is None:
            self.hops = HopRecorder(self.node_id, self.incarnation, folder)
            log.warning("hop records on (fault drill)", extra={"folder": str(folder)})
        if self.hops is not None:
            self.hops.flush()

    def _hop(self, event: str, topic: str, data: bytes, qos: int, peer: str,
             origin: tuple[str, int, int]) -> tuple:
        assert self.hops is not None
        return self.hops.record(event, topic, data, qos, peer, "/".join(map(str, origin)),
                                self.clock.now(int(time.time() * 1000)).pack())

    def _apply_blocked(self) -> None:
        try:
            blocked = frozenset(self.state_path.with_name("blocked-peers").read_text().split())
        except OSError:
            blocked = frozenset()
        if blocked != self.transport.blocked:
            log.warning("blocked peers (fault injection)", extra={"peers": sorted(blocked)})
            self.transport.block(blocked)

    def set_peers(self, peers: Mapping[str, str]) -> None:
        """The membership view: node id -> gRPC address of every other node."""
        peers = {p: a for p, a in peers.items() if p != self.node_id}
        for peer in (set(self.queues) | self.remote.peers()) - set(peers):
            self._run_interest(self.remote.remove_peer(peer, LEAVE_STEP))
            self._schedule_removals()
            self._ack_local(self.forwarder.on_peer_removed(peer))
            self.retained.on_peer_down(peer)
            if self.sessions is not None:
                self.sessions.on_peer_down(peer)
            queue = self.queues.pop(peer, None)
            if queue is not None:
                queue.store.close()
            self._offered_at.pop(peer, None)
            self.pacing.forget(peer)
            self.lag.forget(peer)
            self._chunked.discard(peer)
            self.catchup.forget(peer)
            self._snapshot_since.pop(peer, None)
        for peer in peers:
            if peer not in self.queues:
                store = SqliteSpillStore(self.spill_dir / f"{peer}.sqlite")
                self.queues[peer] = OutboundQueue(store, self.incarnation)
                self._offered_at[peer] = {}
                self.lag.track(peer)
        self.transport.set_peers(peers)
        if self.links is not None:
            self.links.on_view(peers)

    def _schedule_removals(self) -> None:
        """The interest of peers that left goes `LEAVE_STEP` keys per loop turn (100,000 keys
        in one step blocked the loop for seconds)."""
        if self._removals_due or not self.remote.removing:
            return
        self._removals_due = True
        asyncio.get_running_loop().call_soon(self._continue_removals)

    def _continue_removals(self) -> None:
        self._removals_due = False
        self._run_interest(self.remote.continue_removals())
        self._schedule_removals()

    # ---- local interest → peers ----------------------------------------------------------
    def on_interest_changes(self, changes: list[InterestChange]) -> None:
        """Table changes: coalesced until this loop iteration ends, or `INTEREST_LINGER` after
        the last delta went (a burst becomes a few deltas of up to `CHUNK_KEYS` keys), then sent
        to every peer."""
        # $SYS topics describe each broker itself: a $SYS subscriber sees its own node's
        self._interest_changes.extend(c for c in changes if not c.key.filter.startswith("$SYS"))
        if not self._interest_due:
            self._interest_due = True
            wait = self._interest_sent_at + INTEREST_LINGER - time.monotonic()
            loop = asyncio.get_running_loop()
            if wait > 0:
                loop.call_later(wait, self._send_interest)
            else:
                loop.call_soon(self._send_interest)

    def _send_interest(self) -> None:
        self._interest_due = False
        changes, self._interest_changes = self._interest_changes, []
        now = self._interest_sent_at = time.monotonic()
        self._freeze_tables(len(changes))
        for delta in self.local_interest.apply_chunked(changes):
            frame = peer_frames.interest_delta_frame(delta)
            self.lag.on_sent(delta.to_version, now)
            for peer in self.queues:
                self.transport.send(peer, frame)

    def _send_snapshot(self, peer: str) -> None:
        """The whole interest to `peer`: in chunks if it takes them, else one frame."""
        if peer in self._chunked:
            for chunk in self.local_interest.snapshot_chunks():
                self.transport.send(peer, peer_frames.interest_snapshot_frame(chunk))
        else:
            self.transport.send(peer, peer_frames.interest_snapshot_frame(
                self.local_interest.snapshot()))

    # ---- PeerHandler ---------------------------------------------------------------------
    def on_outbound_up(self, peer: str, accept: Accept) -> None:
        log.info("peer stream up", extra={"peer": peer})
        self.on_peer_hello(accept.peer)
        if self.links is not None:
            self.links.on_peer_hello(accept.peer, accept.capabilities)
        if INTEREST_CHUNKS in accept.capabilities:
            self._chunked.add(peer)
        else:
            self._chunked.discard(peer)
        self._note_catch_up(peer, accept)
        self._send_interest()  # what the table changed before goes first: the snapshot has it
        self._send_snapshot(peer)
        if RETAINED in accept.capabilities:  # a peer without a feature never gets its frames
            self.retained.on_peer_up(peer)
        if self.sessions is not None and SESSIONS in accept.capabilities:
            self.sessions.on_peer_up(peer)
        if self.wills is not None and WILLS in accept.capabilities:
            self.wills.on_peer_up(peer)
        if self.drain is not None and DRAIN in accept.capabilities:
            self.drain.on_peer_up(peer)
        queue = self.queues.get(peer)
        if queue is not None:
            queue.on_connected()
            self.pacing.on_reconnected(peer, queue.count(), time.monotonic())  # an outage's
            self._schedule_flush()  # backlog drains paced

    def peers_with(self, capability: str) -> list[str]:
        """The peers routed to whose last handshake settled on `capability` (the others never
        get its frames; `sidecar.peering.capabilities`)."""
        return [p for p in self.queues if capability in (self.transport.capabilities(p) or ())]

    def on_outbound_down(self, peer: str, reason: str) -> None:
        log.info("peer stream down", extra={"peer": peer, "reason": reason})
        self.retained.on_peer_down(peer)
        if self.sessions is not None:
            self.sessions.on_peer_down(peer)
        if self.drain is not None:
            self.drain.on_peer_down(peer)
        queue = self.queues.get(peer)
        if queue is not None:
            queue.on_disconnected()
            self._settle_durable(peer)

    def on_outbound_drained(self, peer: str) -> None:
        self._schedule_flush()  # the next frame: whatever queued while the last was written

    def on_inbound_up(self, peer: str, accept: Accept) -> None:
        self.on_peer_hello(accept.peer)
        if INTEREST_CHUNKS in accept.capabilities:
            self._chunked.add(peer)
        self._note_catch_up(peer, accept)

    def on_inbound_down(self, peer: str, reason: str) -> None:
        self.receiver.on_inbound_down(peer)  # unsent acks: the peer re-sends those messages

    def on_refused(self, peer: str, refuse: peer_pb2.Refuse) -> None:
        log.error("peer refused this node: %s", refuse.message, extra={"peer": peer})

    def on_frame(self, peer: str, frame: peer_pb2.Frame, inbound: bool) -> None:
        kind = frame.WhichOneof("body")
        if kind == "message_batch":
            batch = frame.message_batch
            if batch.envelopes:
                self._on_envelopes(peer, batch.envelopes)
            if batch.records:
                self._on_records(peer, batch.records)
        elif kind == "ack_batch":
            self._on_acks(peer, frame.ack_batch.acks)
        elif kind == "interest_snapshot":
            snapshot = peer_frames.snapshot_from(frame.interest_snapshot)
            fresh = self._catch_up_fresh(peer, snapshot.since, snapshot.chunk, snapshot.last)
            actions = self.remote.apply_snapshot(peer, snapshot)
            self._run_interest(actions, peer if snapshot.last else None,
                               self._catch_up(peer, fresh, actions))
            if self.links is not None:
                self.links.on_interest(peer, self.remote.keys(peer))
        elif kind == "interest_delta":
            delta = peer_frames.delta_from(frame.interest_delta)
            fresh = self._catch_up_fresh(peer, delta.since)
            actions = self.remote.apply_delta(peer, delta)
            self._run_interest(actions, peer, self._catch_up(peer, fresh, actions))
            if self.links is not None:
                self.links.on_interest(peer, self.remote.keys(peer))
        elif kind == "interest_applied":
            self.lag.on_applied(peer, frame.interest_applied.version, time.monotonic())
        elif kind == "interest_request":
            self._send_interest()
            self._send_snapshot(peer)
        elif kind is not None and kind.startswith("retained_"):
            self.retained.on_frame(peer, frame, inbound)
        elif kind is not None and kind.startswith("session_") and self.sessions is not None:
            self.sessions.on_frame(peer, frame, inbound)
        elif kind is not None and kind.startswith("will_") and self.wills is not None:
            self.wills.on_frame(peer, frame, inbound)
        elif kind == "node_state" and self.drain is not None:
            self.drain.on_frame(peer, frame, inbound)

    def on_retained_seen(self, event: RetainedSeen) -> None:
        """A local client's retained publish (plugin event): the retained path takes it."""
        self.retained.on_local(event)

    def _run_interest(self, actions: list[InterestAction], applied: str | None = None,
                      after: Callable[[], None] | None = None) -> None:
        """Persist the change's rows (off the loop), then issue its (un)subscriptions: a crash
        never leaves Mosquitto with identifiers the restarted sidecar does not know. Then tell
        `applied` (the peer whose interest this was) the version now in effect, and run
        `after` (a catch-up's request)."""
        local = [a for a in actions if isinstance(a, (LocalSubscribe, LocalUnsubscribe))]
        for action in actions:
            if isinstance(action, RequestSnapshot):
                self.transport.reply(action.peer, peer_frames.interest_request_frame(
                    action.have_version or 0, action.reason))
        version = self.remote.version(applied) if applied is not None else None

        def then() -> None:
            self._issue(local)
            if version is not None:  # (a peer before 1.1 ignores it)
                self.transport.reply_latest(applied, "interest_applied",
                                            peer_frames.interest_applied_frame(version))
            if after is not None:
                after()

        self.persister.submit(self.remote.take_journal(), then)
        self._freeze_tables(len(actions))

    def _freeze_tables(self, changed: int) -> None:
        """After every `FREEZE_AFTER` interest keys changed, move what the heap holds into the
        permanent generation (`gc.freeze`, as at start-up): the routing tables live on, and a
        full collection walking their million objects paused the loop for 100-400 ms (the tail
        of the interest lag). Cyclic garbage alive at that moment is never collected: rare
        (at most one freeze per 20,000 changes) and small."""
        self._changed_since_freeze += changed
        if self._changed_since_freeze >= FREEZE_AFTER:
            self._changed_since_freeze = 0
            gc.collect(1)  # (the young generations: cheap) so only survivors are frozen
            gc.freeze()

    def _issue(self, actions: list[LocalSubscribe | LocalUnsubscribe]) -> None:
        """(Un)subscribe in order, many filters per packet."""
        i = 0
        while i < len(actions):
            j = i
            if isinstance(actions[i], LocalSubscribe):
                while j < len(actions) and isinstance(actions[j], LocalSubscribe):
                    j += 1
                self.forward_client.subscribe_many([(a.filter, a.subscription_id, a.no_local)
                                                    for a in actions[i:j]])
            else:
                while j < len(actions) and isinstance(actions[j], LocalUnsubscribe):
                    j += 1
                self.forward_client.unsubscribe_many([a.filter for a in actions[i:j]])
            i = j

    # ---- origin side -----------------------------------------------------------------------
    def _on_fwd_connected(self, session_present: bool, shard: int = 0) -> None:
        """A forwarding connection (`shard`, sidecar.local.forward_shards) is up; without its
        session: its copies' acks are void and its subscriptions are made again."""
        if not session_present:
            dropped = self.forwarder.forget_local_acks(mid_range(shard))
            if dropped:
                log.warning("local session lost; pending local acks dropped",
                            extra={"count": dropped, "shard": shard})
            subs = list(self.remote.subscriptions())
            if shard == 0 and len(getattr(self.forward_client, "shards", ())) <= 1:
                self._issue(subs)
            else:
                self.forward_client.subscribe_many([(a.filter, a.subscription_id, a.no_local)
                                                    for a in subs], shard=shard)
            if shard == 0:
                self.retained.on_broker_reset()  # a new Mosquitto: its retained store is empty
                if self.links is not None:
                    self.links.on_plugin_reset()  # nor has its plugin any links

    @property
    def counters(self) -> dict[str, int]:
        """Receive-side and forwarding drop counters (metrics, admin status)."""
        return {**self.receiver.counters, **self._counters}

    @property
    def unsettled(self) -> int:
        """Messages from Mosquitto not yet settled with every target peer."""
        return self.forwarder.pending

    def _on_copies(self, copies: list[LocalCopy | CutMarker]) -> None:
        self.last_copy_at = time.monotonic()
        wall_ms = int(time.time() * 1000)
        down = [p for p in self.queues if not self.transport.connected(p)]
        for copy in copies:
            if isinstance(copy, CutMarker):
                self._cut(copy, wall_ms)
                continue
            actions = self.forwarder.on_copy(copy, wall_ms, down)
            if copy.properties.user:  # the only cost for untraced messages
                self._trace_copy(copy.properties.user, actions)
            if self.hops is not None:
                for a in actions:
                    if isinstance(a, (SendEnvelope, QueueEnvelope)):
                        e = a.envelope
                        self._hop("forwarded", e.topic, e.payload, e.qos, a.peer,
                                  (e.origin_node, e.origin_incarnation, e.origin_seq))
            self._run_forward(actions)
        self._flush()  # now: this is already a batch, and a loop turn costs latency

    def _cut(self, marker: CutMarker, wall_ms: int) -> None:
        """The plugin cut here for a client's move (in order with the copies): the other node
        of the move, if it takes cuts, gets it behind every message forwarded before; a new
        copy's goes to every peer that takes cuts from anywhere too (the client may have
        been on one of them since the record this node knows: each applies it only to a copy
        the client used before, `cut_applies`)."""
        client = marker.client
        peer = self.cut_target(client)
        peers: set[str] = set()
        if peer is not None and peer in self.peers_with(SESSION_CUTS):
            peers.add(peer)
        if peer is not None and marker.connect_ms:
            peers |= set(self.peers_with(SESSION_CUTS_ANYWHERE))
        seq, actions = self.forwarder.cut(client, sorted(peers), wall_ms, marker.connect_ms)
        self._counters["cuts"] += 1
        self._run_forward(actions, hold=False)  # never behind a catch-up: in order
        self.on_cut(client, seq)

    def _trace_copy(self, user: tuple[tuple[str, str], ...], actions) -> None:
        trace = trace_id(user)
        if trace is not None:
            peers = sorted({a.peer for a in actions if isinstance(a, (SendEnvelope,
                                                                      QueueEnvelope))})
            self.tracer.record(trace, "forwarded" if peers else "not_forwarded",
                               time.time() * 1000, ",".join(peers),
                               "" if peers else "no peer has a matching subscription")

    def _run_forward(self, actions, hold: bool = True) -> None:
        now = time.monotonic()
        for action in actions:
            if hold and self.catchup.waiting and self._catch_up_holds(action):
                continue
            if isinstance(action, QueueEnvelope):
                self._queue(action.peer, action.envelope, now)
            elif isinstance(action, SendEnvelope):
                data = peer_frames.queued_form(action.envelope, self.send_records)
                if self._fits(action.peer, action.envelope, len(data)):
                    self._qos0.setdefault(action.peer, []).append(data)
            elif isinstance(action, AckLocal):
                self._ack_local([action])
            elif isinstance(action, DeliverLocalShared):
                asyncio.get_running_loop().create_task(self._deliver_local(action.envelope))

    async def _deliver_local(self, env: Envelope) -> None:
        """A shared pick no peer takes (none holds the group, or every holder rejected it):
        one local member takes it; without one it is counted as unroutable."""
        members = self.shared_members(env.shared_group or "", env.shared_filter)
        if not await self._deliver_to(self.receiver.pick_member(env, members), env):
            self._counters["unroutable"] += 1
        self._ack_local(self.forwarder.on_settled(LOCAL, [env.origin_seq]))

    def _fits(self, peer: str, env: Envelope, size: int) -> bool:
        """Whether an envelope of `size` bytes fits in one peer frame; an oversized one is
        counted, logged (at most every TOO_LARGE_LOG_EVERY s) and never queued."""
        if size + FRAME_OVERHEAD <= self.transport.max_message_bytes:
            return True
        self._counters["too_large"] += 1
        now = time.monotonic()
        if now - self._too_large_logged >= TOO_LARGE_LOG_EVERY:
            self._too_large_logged = now
            log.error("a message is larger than a peer frame may be: it is not forwarded (set"
                      " Mosquitto's message_size_limit below the limit to refuse such"
                      " publishes at the edge)", extra={
                          "peer": peer, "topic": env.topic, "bytes": size,
                          "limit": self.transport.max_message_bytes,
                          "too_large": self._counters["too_large"]})
        return False

    def _queue(self, peer: str, env: Envelope, now: float) -> None:
        queue = self.queues[peer]
        data = peer_frames.queued_form(env, self.send_records)
        if not self._fits(peer, env, len(data)):
            self._run_forward(self.forwarder.on_rejected(peer, env.origin_seq))
            return
        reason = queue.offer(env.origin_seq, data)
        if reason is not None:
            self._counters["queue_refused"] += 1
            log.warning("outbound queue refused a message", extra={"peer": peer,
                                                                   "reason": reason})
            self._run_forward(self.forwarder.on_rejected(peer, env.origin_seq))
        elif not queue.connected:  # went straight to the store: durable
            self._ack_local(self.forwarder.on_settled(peer, [env.origin_seq], acked=False))
        else:
            self._offered_at[peer][env.origin_seq] = now

    def _on_acks(self, peer: str, acks) -> None:
        queue = self.queues.get(peer)
        if queue is None:
            return
        sorted_acks = sort_acks(((a.origin_incarnation, a.origin_seq, a.status) for a in acks),
                                self.incarnation)
        for inc, seqs in sorted_acks.by_incarnation.items():
            queue.on_acked(seqs, inc)
        offered = self._offered_at[peer]
        for seq in sorted_acks.by_incarnation.get(self.incarnation, ()):
            offered.pop(seq, None)
        self._ack_local(self.forwarder.on_settled(peer, sorted_acks.settled))
        for seq in sorted_acks.rejected:
            self._run_forward(self.forwarder.on_rejected(peer, seq))
        self._schedule_flush()

    def _ack_local(self, acks: list[AckLocal]) -> None:
        capture = self.capture
        for ack in acks:
            if capture is not None and capture.is_capture_mid(ack.mid):
                capture.on_settled(ack.mid)  # a captured record: acked to the plugin
            else:
                self.forward_client.ack(ack.mid, ack.qos)

    def _settle_durable(self, peer: str) -> None:
        queue = self.queues[peer]
        offered = self._offered_at[peer]
        durable = [seq for seq in offered if queue.durable(seq)]
        for seq in durable:
            del offered[seq]
        self._ack_local(self.forwarder.on_settled(peer, durable, acked=False))

    async def _persist_loop(self) -> None:
        """Spill what peers have not acked quickly, so a slow peer never holds local acks."""
        while True:
            await asyncio.sleep(PERSIST_AFTER / 2)
            cutoff = time.monotonic() - PERSIST_AFTER
            for peer, offered in self._offered_at.items():
                old = [seq for seq, t in offered.items() if t < cutoff]
                if old:
                    self.queues[peer].persist(through_seq=max(old))
                    self._settle_durable(peer)
            self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        """Send what is due: QoS 0 batches, queued batches, acks."""
        self._flush_scheduled = False
        for peer, envs in self._qos0.items():
            records = self._takes_records(peer)
            for chunk in _chunks(envs, BATCH_BYTES):
                for run in peer_frames.same_form_runs(chunk, bytes):
                    if not self._send(peer, peer_frames.batch_frame(run, records)):
                        self._counters["qos0_dropped"] += len(run)
                    else:
                        self._sent(peer, len(run), records and peer_frames.is_record(run[0]))
        self._qos0.clear()
        now = time.monotonic()
        for peer, queue in self.queues.items():
            if not queue.connected or not self.transport.connected(peer):
                continue
            budget = self._budget(peer, queue, now)
            # A frame is built only when the stream is free: messages arriving during a
            # write join the next frame, so frames grow with the load (fewer, larger writes)
            if self.transport.busy(peer) or self._lingers(peer, queue, now):
                continue
            records = self._takes_records(peer)
            while not self.transport.busy(peer) and budget >= 1:
                batch = queue.next_batch(int(min(BATCH_MESSAGES, budget)), BATCH_BYTES)
                if not batch:
                    break
                budget -= len(batch)
                for run in peer_frames.same_form_runs(batch, attrgetter("data")):
                    frame = peer_frames.batch_frame([m.data for m in run], records)
                    if len(frame) > self.transport.max_message_bytes:  # queued before a limit
                        self._drop_queued(peer, queue, run)
                        continue
                    self._send(peer, frame)
                    self._sent(peer, len(run), records and peer_frames.is_record(run[0].data))
            self.pacing.spent(peer, budget, now)

    def _sent(self, peer: str, count: int, as_records: bool) -> None:
        self.peer_sent[peer] = self.peer_sent.get(peer, 0) + count
        if as_records:
            self._counters["records_sent"] += count

    def _takes_records(self, peer: str) -> bool:
        """Whether `peer` takes plain messages as records (else they go as envelopes)."""
        return self.send_records and RECORDS in (self.transport.capabilities(peer) or ())

    def _send(self, peer: str, frame: bytes) -> bool:
        """Send a frame; one that is too large (a bug: batches are checked) is counted and
        logged, never raised into the flush."""
        try:
            return self.transport.send(peer, frame)
        except FrameTooLarge as exc:
            self._counters["too_large"] += 1
            log.error("a frame was not sent: %s", exc, extra={"peer": peer})
            return False

    def _drop_queued(self, peer: str, queue: OutboundQueue, batch) -> None:
        """Oversized messages already in the queue (spilled by an older version, or queued
        under a larger limit): released from the queue and settled as refused, so they are
        not resent on every reconnect."""
        for m in batch:
            queue.on_acked([m.seq], m.incarnation)
            self._counters["too_large"] += 1
            log.error("a queued message is larger than a peer frame may be: dropped",
                      extra={"peer": peer, "bytes": len(m.data),
                             "limit": self.transport.max_message_bytes})
            if m.incarnation == self.incarnation:
                self._offered_at[peer].pop(m.seq, None)
                self._run_forward(self.forwarder.on_rejected(peer, m.seq))

    def _lingers(self, peer: str, queue: OutboundQueue, now: float) -> bool:
        """Whether `peer`'s next batch waits for company (`Pacing.linger`)."""
        wait = self.pacing.linger(peer, queue.unsent_in_memory(),
                                  self.backpressure.plugin_backlog, now)
        if wait is None:
            return False
        until, new = wait
        if new:
            asyncio.get_running_loop().call_later(until - now, self._schedule_flush)
        return True

    def _budget(self, peer: str, queue: OutboundQueue, now: float) -> float:
        """How many queued messages may go to `peer` now (`Pacing.budget`)."""
        budget = self.pacing.budget(peer, queue.count(), self.backpressure.plugin_backlog, now)
        if budget.replay_started:
            log.warning("a backlog of %d copies waits in Mosquitto (this sidecar stalled?): "
                        "forwarding it paced at %d msgs/s so subscribers on %s keep up",
                        self.backpressure.plugin_backlog, DRAIN_RATE, peer,
                        extra={"peer": peer})
        return budget.messages

    # ---- receiving side ----------------------------------------------------------------
    def _on_envelopes(self, peer: str, envelopes) -> None:
        now = time.monotonic()
        now_ms = time.time() * 1000
        self.peer_received[peer] = self.peer_received.get(peer, 0) + len(envelopes)
        receiver = self.receiver
        batch: list[tuple[int, Envelope]] | None = [] if self.injection is not None else None
        for msg in envelopes:
            mid = MessageId(msg.origin_node, msg.origin_incarnation, msg.origin_seq)
            first, actions = receiver.accept(peer, mid, msg.qos, now)
            if not first:
                self._run_receive(actions)
                continue
            if not msg.cut_client:  # (a cut carries its client's connect time)
                self.hop_latency.observe(now_ms - (msg.hlc >> 16))
            trace = (self._trace_received(peer, ((p.key, p.value) for p in msg.user_properties),
                                          msg.hlc, now_ms) if msg.user_properties else None)
            env = peer_frames.decode_envelope(msg)
            if env.cut_client:  # a moving session's cut: into the plugin in order
                if batch is None:
                    self._run_receive(receiver.refuse(peer, env, now))
                    continue
                if not self.cut_applies(env.cut_client):  # no old copy of it here
                    self._counters["cuts_not_here"] += 1
                    self._run_receive(receiver.settled(peer, env, now))
                    continue
                ticket = self.injection.ticket()
                batch.append((ticket, env))
                receiver.on_reinjecting(ticket, peer, env)
                continue
            problem = publish_problem(env.topic, env.qos, env.properties)
            if problem is not None:
                self._run_receive(receiver.refuse(peer, env, now))
                self._log_invalid(peer, problem, now)
                continue
            members = (self.shared_members(env.shared_group, env.shared_filter)
                       if env.shared_group is not None else [])
            action = receiver.route(peer, env, members)
            if isinstance(action, DeliverShared):
                self._run_receive([action])
                continue
            if batch is not None:
                ticket = self.injection.ticket()
                batch.append((ticket, env))
            else:
                ticket = self.forward_client.publish(env.topic, env.payload, env.qos,
                                                     env.properties)
            receiver.on_reinjecting(ticket, peer, env)
            self._observe(peer, ticket, env, trace)
        if batch:
            self.injection.send(batch)

    def _on_records(self, peer: str, data: bytes) -> None:
        """A peer's plain messages as records (capability `records`): deduplicated, checked
        and handed to the plugin as they came; no envelope is made."""
        now = time.monotonic()
        now_ms = time.time() * 1000
        receiver = self.receiver
        try:
            records = read_records(data)
            if self.injection is None:
                raise BatchError("records, but this node does not take them")
        except BatchError as exc:  # nothing of the frame is acked: a bug of its origin's
            receiver.counters["invalid"] += 1
            self._log_invalid(peer, f"malformed records: {exc}", now)
            return
        self.peer_received[peer] = self.peer_received.get(peer, 0) + len(records)
        self._counters["records_received"] += len(records)
        batch: list[tuple[int, Envelope | WireRecord]] = []
        for rec in records:
            mid = MessageId(rec.origin_node, rec.origin_incarnation, rec.origin_seq)
            first, actions = receiver.accept(peer, mid, rec.qos, now)
            if not first:
                self._run_receive(actions)
                continue
            self.hop_latency.observe(now_ms - (rec.hlc >> 16))
            problem, trace = topic_problem(rec.topic), None
            if rec.props and problem is None:
                try:
                    props = rec.properties
                except BatchError as exc:
                    problem = f"properties: {exc}"
                else:
                    problem = publish_problem(rec.topic, rec.qos, props)
                    if props.user and problem is None:
                        trace = self._trace_received(peer, props.user, rec.hlc, now_ms)
            if problem is not None:
                self._run_receive(receiver.refuse(peer, rec, now))
                self._log_invalid(peer, problem, now)
                continue
            receiver.counters["reinjected"] += 1
            ticket = self.injection.ticket()
            batch.append((ticket, rec))
            receiver.on_reinjecting(ticket, peer, rec)
            self._observe(peer, ticket, rec, trace)
        if batch:
            self.injection.send(batch)

    def _observe(self, peer: str, ticket: int, item: Envelope | WireRecord,
                 trace: str | None) -> None:
        """A re-injection's hop records (`observability.hops`, when on) and its trace (a
        traced message)."""
        if self.hops is not None:
            env = item.envelope() if isinstance(item, WireRecord) else item
            origin = (env.origin_node, env.origin_incarnation, env.origin_seq)
            self._hop("received", env.topic, env.payload, env.qos, peer, origin)
            self.hops.expect_ack(ticket, self._hop("reinjected", env.topic, env.payload,
                                                   env.qos, peer, origin))
        if trace is not None:
            self.tracer.record(trace, "reinjected", time.time() * 1000, peer)
            if item.qos:
                self.tracer.expect_ack(ticket, trace)

    def _reinject_each(self, items: list[tuple[int, Envelope | WireRecord]]) -> None:
        """A batch the plugin did not take: message by message on the forwarding client
        (each under a new ticket; the batch's tickets are then confirmed with them)."""
        for old, item in items:
            env = item.envelope() if isinstance(item, WireRecord) else item
            try:
                ticket = self.forward_client.publish(env.topic, env.payload, env.qos,
                                                     env.properties)
            except (ValueError, MQTTException) as exc:  # paho's checks: no node sends it
                self.receiver.counters["invalid"] += 1
                self._log_invalid(env.origin_node, str(exc), time.monotonic())
                self._on_published([old])  # acknowledged, dropped: it would come back forever
                continue
            self.receiver.retarget(old, ticket)

    def _log_invalid(self, peer: str, problem: str, now: float) -> None:
        """A peer sent a message no node would send (at most one warning per
        TOO_LARGE_LOG_EVERY seconds; counted in the receiver's `invalid`)."""
        if now - self._invalid_logged >= TOO_LARGE_LOG_EVERY:
            self._invalid_logged = now
            log.warning("refused a message from a peer that cannot be published here: %s",
                        problem, extra={"peer": peer,
                                        "invalid": self.receiver.counters["invalid"]})

    def _trace_received(self, peer: str, user: Iterable[tuple[str, str]], hlc: int,
                        now_ms: float) -> str | None:
        trace = trace_id(user)
        if trace is not None:
            self.tracer.record(trace, "received", now_ms, peer,
                               f"{now_ms - (hlc >> 16):.1f} ms after the origin stamped it")
        return trace

    def _on_published(self, tickets: list[int]) -> None:
        if self.hops is not None:
            self.hops.on_acked(tickets, self.clock.now(int(time.time() * 1000)).pack())
        if self.tracer.waiting:
            self.tracer.on_acked(tickets, time.time() * 1000)
        self._run_receive(self.receiver.on_confirmed(self.retained.on_published(tickets),
                                                     time.monotonic()))

    def _run_receive(self, actions) -> None:
        for action in actions:
            if isinstance(action, SendAcks):
                for peer, acks in action.acks.items():
                    self.transport.reply(peer, peer_frames.ack_frame(acks))
            elif isinstance(action, DeliverShared):
                asyncio.get_running_loop().create_task(self._deliver_shared(action))
        due = self.receiver.ack_due
        if due is not None and self._ack_timer is None:
            self._ack_timer = asyncio.get_running_loop().call_at(due, self._on_ack_timer)
        elif due is None and self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None

    def _on_ack_timer(self) -> None:
        self._ack_timer = None
        self._run_receive(self.receiver.on_timer(time.monotonic()))

    async def settle_to(self, peer: str, timeout: float) -> bool:
        """A barrier: returns once every message Mosquitto had routed to the forwarding client
        until now and that goes to `peer` has been acknowledged by `peer` (its broker holds
        it). False if that took longer than `timeout`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        token = f"barrier-{next(self._barriers)}".encode()
        probed = self.forward_client.expect_probe(token)
        # with capture on, the probe is also a marker among the records (the plugin's
        # `deliver` of a token to .fwd): both paths must have handed over what came before
        marked = self.capture.expect_barrier(token) if self.capture is not None else None
        waits = [probed] if marked is None else [probed, marked]
        try:
            await self.commands.probe_with(token, self.forward_client.client_ids)
            await asyncio.wait_for(asyncio.gather(*waits), timeout)
        except Exception as exc:  # the plugin did not answer, or the probe was lost
            for fut in waits:
                fut.cancel()
            log.info("barrier probe failed: %s", exc, extra={"peer": peer})
            return False
        queue = self.queues.get(peer)
        if queue is not None:
            target = queue.last_key
            while (oldest := queue.oldest_key()) is not None and oldest <= target:
                if loop.time() > deadline:
                    return False
                await asyncio.sleep(0.005)
        if self.links is not None:  # and what the plugin's link to `peer` took
            try:
                return await self.links.settled(peer, max(0.0, deadline - loop.time()))
            except Exception as exc:  # the plugin did not answer
                log.info("barrier on a link failed: %s", exc, extra={"peer": peer})
                return False
        return True

    def shared_members(self, group: str, filter: str) -> list[str]:
        """Local clients holding ``$share/<group>/<filter>`` to pick from: the online ones,
        or (none online) the offline persistent ones, whose sessions queue it."""
        verbatim = f"$share/{group}/{filter}"
        holders = [(c, info.online) for c, info in self.table.sessions().items()
                   if verbatim in self.table.subscriptions(c)]
        return [c for c, online in holders if online] or [c for c, _ in holders]

    async def _deliver_to(self, client: str | None, env: Envelope) -> bool:
        """Deliver to one local member of the envelope's shared group."""
        if client is None:
            return False
        try:
            await self.commands.deliver(client, env)
        except CommandFailed as exc:  # the origin is told, and picks again
            if exc.code in ("not_subscribed", "unknown_client"):
                # the member left the group (or its session moved) since it was picked
                self._counters["shared_member_gone"] += 1
                log.debug("shared delivery refused: %s", exc, extra={"client": client})
            else:
                log.warning("shared delivery failed: %s", exc, extra={"client": client})
            return False
        except Exception as exc:  # the plugin did not answer: the origin is told
            log.warning("shared delivery failed: %s", exc, extra={"client": client})
            return False
        return True

    async def _deliver_shared(self, action: DeliverShared) -> None:
        delivered = await self._deliver_to(action.client, action.envelope)
        self._run_receive(self.receiver.on_shared_result(action.peer, action.envelope,
                                                         delivered, time.monotonic()))

    def on_tick(self, now: float) -> None:
        """Every 50 ms: probe the forwarding client when due, and report the overload state
        to the plugin (sidecar.local.pressure)."""
        if self.catchup.waiting:
            self._run_catch_up(self.catchup.on_timer(now))
        due = self.forward_client.due_probes()
        if due:
            self.commands.probe_forwarding(due)
        if not self.commands.connected:
            return
        unacked, taken = self.forward_client.backlog()
        report = self.backpressure.on_tick(unacked, taken, now)
        if report is None:
            return
        bp = self.backpressure
        if report.changed and report.shed_ms:
            log.warning("overload: the forwarding backlog reached %d unacknowledged copies; "
                        "publishers of QoS > 0 messages peers want are disconnected before "
                        "their message is acknowledged until it is below %d", report.unacked,
                        bp.resume_below, extra={"unacked": report.unacked})
        elif report.changed:
            log.warning("overload over: publishers are accepted again",
                        extra={"unacked": report.unacked,
                               "publishers_shed": bp.publishers_shed})
        self.commands.report_pressure(report, lambda fields: (bp.on_reply(
            bool(fields.get("shedding")), int(fields.get("shed_total", 0)),
            int(fields.get("backlog", 0))), self._note_plugin_ring(fields)))

    def interest_status(self) -> dict[str, Any]:
        """Interest sent and received: per peer the lag (seconds since the oldest change it
        has not applied), the deltas it trails by, the keys it holds here; rows not persisted
        yet; recent lag quantiles."""
        now = time.monotonic()
        return {
            "version": self.local_interest.version,
            "keys": len(self.local_interest),
            "persist_pending": self.persister.pending,
            "peers": {p: {"lag_seconds": round(self.lag.lag(p, now), 3),
                          "deltas_pending": self.lag.pending(p),
                          "keys_held": self.remote.key_count(p)}
                      for p in self.queues},
            "lag": self.lag.quantiles(),
        }

    def status(self) -> dict[str, Any]:
        return {
            "incarnation": self.incarnation,
            "peers": self.transport.states(),
            "queues": {p: {"count": q.count(), "in_flight": q.in_flight,
                           "dropped": q.dropped} for p, q in self.queues.items()},
            "forwarded": self.forwarder.forwarded,
            "skipped": self.forwarder.skipped,
            "shared_local": self.forwarder.local_shared,
            "pending_local_acks": self.forwarder.pending,
            "forwarding_subscriptions": self.remote.subscription_count(),
            "interest": self.interest_status(),
            "fwd": self.forward_client.stats(),
            "inject": self.injection.status() if self.injection is not None else None,
            "capture": self.capture.status() if self.capture is not None else None,
            "links": self.links.status() if self.links is not None else None,
            "overload": self.backpressure.status(),
            **self.counters,
            "retained": self.retained.status(),
            "catchup": self.catch_up_status(),
        }


def _chunks(items: list[bytes], max_bytes: int) -> list[list[bytes]]:
    """`items` in order, in runs of at most `max_bytes` (at least one item each)."""
    out: list[list[bytes]] = []
    size = 0
    for item in items:
        if not out or size + len(item) > max_bytes:
            out.append([])
            size = 0
        out[-1].append(item)
        size += len(item)
    return out
