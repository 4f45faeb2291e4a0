"""One mqfed node: Mosquitto with the plugin, the local link, and the cores (wiring).

This is the only module that knows every part: it builds them from the config, starts and
stops them in order, and publishes the node's status file (`<run_dir>/state.json`). The
plugin's events and commands are `sidecar.node.sync`; which peers are routed to is
`sidecar.membership.routed`; files and the Mosquitto config are `sidecar.node.layout`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib.metadata
import logging
import os
import signal
import time
from typing import Any

from sidecar.admin.service import AdminService
from sidecar.broker import conf as broker_conf
from sidecar.broker.process import MosquittoProcess
from sidecar.config import NodeConfig, is_loopback, replica_count
from sidecar.drain import drain
from sidecar.drain.service import DrainService
from sidecar.journal.service import JournalService
from sidecar.local.event_stream import EventStream
from sidecar.local.events import Event, ProtocolError, RetainedSeen, Snapshot
from sidecar.local.forward_shards import ForwardShards
from sidecar.local.link import LocalLink
from sidecar.local.protocol import DEFAULT_SIDECAR_ID, sidecar_client_id
from sidecar.membership.etcd import EtcdMembership
from sidecar.membership.etcd_access import EtcdAccessError, load_etcd_access
from sidecar.membership.routed import CRASHED_RETENTION, RoutedPeers, static_peers
from sidecar.node.layout import NodeError, NodeLayout, max_queued_messages, render_mosquitto_conf
from sidecar.node.status import StatusWriter, node_status
from sidecar.node.sync import PluginSync
from sidecar.peering.handshake import (
    CAPABILITIES,
    LINKS,
    RECORDS,
    SESSION_CUTS,
    SESSION_CUTS_ANYWHERE,
    SESSIONS,
    WILLS,
    Hello,
)
from sidecar.peering.tls import PeerTls, TlsConfigError, load_peer_tls
from sidecar.peering.transport import PeerTransportError
from sidecar.retained.service import link_reader
from sidecar.routing.links_wiring import LinkWiring, link_secret
from sidecar.routing.service import RoutingService
from sidecar.routing.table import InterestChange, SubscriptionTable
from sidecar.sessions.service import SessionService
from sidecar.tokens import AuthError, check_not_default, configured_token
from sidecar.wills.service import WillService

log = logging.getLogger("mqfed.node")




try:
    VERSION = importlib.metadata.version("mqfed")
except importlib.metadata.PackageNotFoundError:  # running from a source tree
    VERSION = "0.0.0+source"


class Node:
    """A running node; `run()` until `stop()`."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.layout = NodeLayout(config.run_dir)
        self._status_file = StatusWriter(self.layout.state_path)
        self.sync = PluginSync(self.layout.socket_path, on_interest=self._on_interest,
                               on_retained=self._on_retained, on_changed=self._changed,
                               on_fatal=self._on_protocol_error,
                               on_event=self._on_client_event, on_snapshot=self._on_snapshot)
        self.sessions: SessionService | None = None
        self.wills: WillService | None = None
        self.drainer: DrainService | None = None  # `mqfed ctl drain` (issue 20)
        self._members: dict[str, int] = {}  # the last membership view, for the wills
        self.broker: MosquittoProcess | None = None
        self.routing: RoutingService | None = None
        self.journal: JournalService | None = None  # the plugin's journal (mqtt.journal)
        self.peer_token = ""  # read at start (grpc.token / grpc.token_file)
        self.peer_tls: PeerTls | None = None  # read at start (grpc.tls_*)
        self.membership: EtcdMembership | None = None
        self.routed = RoutedPeers()
        self.ready = False
        self.started_at = time.time()
        self.interest_changes = 0
        self.protocol_error: ProtocolError | None = None
        self._stop = asyncio.Event()
        self._state_dirty = True
        self.admin = AdminService(self, VERSION, CRASHED_RETENTION)

    @property
    def stopping(self) -> bool:
        """A graceful stop has begun (`NodeView`)."""
        return self._stop.is_set()

    @property
    def peers(self) -> dict[str, str]:
        """The peers this node routes to, node id -> gRPC address (`NodeView`)."""
        return dict(self.routed.routed)

    @property
    def stream(self) -> EventStream:
        return self.sync.stream

    @property
    def table(self) -> SubscriptionTable:
        return self.sync.table

    @property
    def link(self) -> LocalLink | None:
        return self.sync.link

    # ---- plugin sync → routing -----------------------------------------------------------
    def _changed(self) -> None:
        self._state_dirty = True

    def _on_interest(self, changes: list[InterestChange]) -> None:
        if self.routing is not None:
            self.routing.on_interest_changes(changes)
        self.interest_changes += len(changes)
        self._state_dirty = True
        log.debug("interest changed", extra={"changes": len(changes)})

    def _on_retained(self, event: RetainedSeen) -> None:
        if self.routing is not None:
            self.routing.on_retained_seen(event)

    def _on_client_event(self, event: Event) -> None:
        if self.sessions is not None:
            self.sessions.on_event(event)
        if self.wills is not None:  # after the sessions: it reads their connect times
            self.wills.on_event(event)

    def _on_snapshot(self, snapshot: Snapshot) -> None:
        if self.drainer is not None:  # a restarted Mosquitto admits everyone again
            self.drainer.on_resync()
        if self.sessions is not None:
            self.sessions.on_snapshot(snapshot)
        if self.wills is not None:
            self.wills.on_snapshot(snapshot)

    def _on_protocol_error(self, exc: ProtocolError) -> None:
        log.error("plugin protocol error: %s", exc)
        self.protocol_error = exc
        self._stop.set()

    # ---- lifecycle ---------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """The node's status (`<run_dir>/state.json`)."""
        return node_status(self, self.layout.socket_path)

    def _publish_status(self) -> None:
        self._status_file.submit(self.status())  # (the file system calls off the loop)
        self._state_dirty = False

    async def _ticker(self) -> None:
        last_write = 0.0
        while True:
            await asyncio.sleep(0.05)
            now = time.monotonic()
            self.sync.tick(now)
            if self.routed.retaining:
                self._apply_peers(*self.routed.refresh(now))
            if self.routing is not None:
                self.routing.on_tick(now)
            if self.journal is not None:
                self.journal.tick()
            if self.stream.in_sync and not self.ready:
                self.ready = True
                self._state_dirty = True
                log.info("node ready", extra={"mqtt": self.config["mqtt"]["listen"]})
            if (self._state_dirty and now - last_write > 0.2) or now - last_write > 0.5:
                last_write = now
                self._publish_status()

    async def _drain(self) -> None:
        """Graceful leave: drained (`drain.on_stop`), then clients disconnected cleanly, their
        last messages forwarded. Only when we stop Mosquitto too: a sidecar alone restarting
        keeps every client."""
        if self.broker is None or self.link is None or not self.link.connected:
            return
        if self.drainer is not None:  # first as `mqfed ctl drain`: sessions move too
            await self.drainer.before_stop(self.config["drain"]["on_stop"])
        online = [c for c, info in self.table.sessions().items()
                  if info.online and not c.startswith(DEFAULT_SIDECAR_ID)]
        await drain(self.link, online, self.routing)
        if self.wills is not None:  # the delayed wills Mosquitto would take down with it
            await self.wills.handover()

    async def _on_broker_restart(self) -> None:
        log.warning("mosquitto restarted; the link re-syncs from a new snapshot")
        self._state_dirty = True

    def stop(self) -> None:
        self._stop.set()

    def _on_peers(self, peers: dict[str, str]) -> None:
        """The membership view changed (etcd watch): dial joiners, drop leavers."""
        self._apply_peers(*self.routed.on_view(peers, time.monotonic()))

    def _on_membership_events(self, changes) -> None:
        """A crashed peer (key expired, no graceful leave) stays routed for a while."""
        self.admin.on_membership(changes)
        if self.wills is not None:
            self.wills.on_membership(changes)
        for peer in self.routed.on_events(changes, time.monotonic()):
            log.warning("peer crashed; keeping its interest and queue",
                        extra={"peer": peer, "retention_s": self.routed.retention})

    def _apply_peers(self, changed: bool, dropped: list[str]) -> None:
        for peer in dropped:
            log.warning("crashed peer did not return; dropping it", extra={"peer": peer})
        if changed:
            if self.routing is not None:
                self.routing.set_peers(self.routed.routed)
            self._state_dirty = True

    async def _join(self, incarnation: int, previous: int | None) -> None:
        """Register in etcd (refused if another live node has our id) and watch the others."""
        cfg = self.config
        record = self.admin.record(incarnation)
        try:
            access = load_etcd_access(cfg["membership"])
        except EtcdAccessError as exc:
            raise NodeError(str(exc)) from None
        if not access.tls and not all(is_loopback(e.split("://", 1)[-1])
                                      for e in cfg["membership"]["etcd"]):
            log.warning("etcd is reached in plaintext: whoever can reach it, or the network"
                        " between, can read and change the cluster's membership; set"
                        " membership.etcd_ca (and etcd_cert/etcd_key or etcd_user); see"
                        " docs/security.md", extra={"etcd": ",".join(cfg["membership"]["etcd"])})
        self.membership = EtcdMembership(cfg["membership"]["etcd"], cfg.cluster, record,
                                         cfg["membership"]["lease_ttl"],
                                         on_change=self._on_peers,
                                         on_events=self._on_membership_events,
                                         supersedes=previous, access=access)
        await self.membership.start()

    def _peer_token(self) -> str:
        """The shared peer token ("" for none: then, without mutual TLS either, say that anyone
        reaching the port may join, unless it is loopback only)."""
        grpc_cfg = self.config["grpc"]
        token = configured_token(grpc_cfg, "peer token")
        check_not_default(token, "peer token", os.environ)
        if not token and self.peer_tls is None and not is_loopback(grpc_cfg["listen"]):
            log.warning("the peer port accepts any sidecar that can reach it: set grpc.token "
                        "or grpc.token_file (the same secret on every node), or grpc.tls_*",
                        extra={"listen": grpc_cfg["listen"]})
        return token

    def _static_peers(self) -> dict[str, str]:
        if self.config["membership"]["mode"] != "static":
            return {}
        return static_peers(self.config["membership"]["peers"])

    def _build_routing(self, secret: str, incarnation: int) -> RoutingService:
        cfg = self.config
        # cuts need the identities batches give injected messages; records go to the plugin
        # as batches
        capabilities = CAPABILITIES if cfg["routing"]["inject_batches"] \
            else CAPABILITIES - {SESSION_CUTS, SESSION_CUTS_ANYWHERE, RECORDS}
        hello = Hello(cfg.cluster, cfg.node_id, incarnation,
                      grpc_address=cfg.advertised("grpc"), mqtt_address=cfg["mqtt"]["listen"],
                      admin_address=cfg.advertised("admin"),
                      capabilities=capabilities | ({LINKS} if cfg["routing"]["links"]
                                                   else frozenset()))
        socket_path = self.layout.socket_path
        max_queued = max_queued_messages(cfg)
        window = broker_conf.forward_receive_maximum(max_queued)

        def forward_client(**callbacks) -> ForwardShards:
            return ForwardShards(socket_path, secret, sidecar_client_id(secret),
                                 cfg["routing"]["forward_shards"], receive_maximum=window,
                                 max_queued=max_queued,
                                 layout_file=self.layout.run_dir / "forward-shards", **callbacks)

        return RoutingService(hello=hello, listen=cfg["grpc"]["listen"],
                              run_dir=self.layout.run_dir, table=self.table,
                              make_forward_client=forward_client, commands=self.sync,
                              read_retained=link_reader(self.link),
                              tombstone_grace=cfg["retained"]["tombstone_grace"],
                              peer_token=self.peer_token, peer_tls=self.peer_tls,
                              shed_above=cfg["overload"]["shed_above"],
                              # a static peer list may name us differently, and no outsider
                              # can write it: only etcd records must name our own address
                              check_peer_address=cfg["membership"]["mode"] == "etcd",
                              max_message_bytes=cfg["grpc"]["max_message_bytes"],
                              catchup_window=cfg["catchup"]["window"],
                              catchup_margin=cfg["catchup"]["margin"],
                              catchup_bytes=cfg["catchup"]["max_bytes"],
                              inject_batches=cfg["routing"]["inject_batches"],
                              send_records=cfg["routing"]["records"],
                              capture_socket=(self.layout.capture_socket
                                              if cfg["routing"]["capture"] else None))

    async def _connect(self, secret: str, incarnation: int) -> Snapshot:
        """Link to the plugin, then start routing (after Mosquitto is up); returns the
        plugin's first snapshot."""
        snapshot = await self.sync.connect(secret, self.config["mqtt"]["link_timeout"])
        self.routing = self._build_routing(secret, incarnation)
        self.routing.on_peer_hello = self.admin.on_peer_hello
        if self.config["routing"]["links"]:
            assert self.link is not None
            self.routing.links = LinkWiring(self.config.node_id,
                                            link_secret(self.peer_token), self.link.request)
            self.routing.links.start()
        routing = self.routing
        link = self.link
        assert link is not None
        self.sessions = SessionService(
            self.config.node_id, incarnation, self.layout.run_dir, self.layout.socket_path,
            secret, link.request, routing.transport, lambda: routing.peers_with(SESSIONS),
            routing.settle_to, replicas=replica_count(self.config["sessions"]["replicas"]),
            down_grace=self.config["sessions"]["down_grace"])
        routing.sessions = self.sessions
        # a moving session's cut mode (docs/architecture.md §5): needs injection by batches
        self.sessions.cuts_on = self.config["routing"]["inject_batches"]
        routing.cut_target = self.sessions.cuts.target
        routing.on_cut = self.sessions.cuts.on_cut
        routing.cut_applies = self.sessions.cut_applies
        self.wills = self._build_wills(routing, incarnation)
        routing.wills = self.wills
        self.drainer = DrainService(self.config.node_id, link.request, self.table, routing,
                                    self.sessions, self.wills)
        routing.drain = self.drainer
        if self.config["mqtt"]["journal"]:  # before the forwarding client connects
            self.journal = JournalService(self.layout.socket_dir, link, routing.forward_client)
        try:
            await self.routing.start(lambda: self.routed.routed)  # the view as it is then
        except PeerTransportError as exc:
            raise NodeError(str(exc)) from None
        self.sessions.start()
        self.wills.start()
        self.drainer.start_ticking()
        return snapshot

    def _build_wills(self, routing: RoutingService, incarnation: int) -> WillService:
        assert self.link is not None and self.sessions is not None
        return WillService(
            self.config.node_id, self.layout.run_dir, self.config["wills"]["grace"], self.link,
            routing.transport, lambda: routing.peers_with(WILLS), self.sessions.registry,
            lambda: self._membership_view(incarnation), routing.on_retained_seen,
            self.sessions.shadows.discard)

    def _membership_view(self, incarnation: int) -> dict[str, int]:
        """Node id -> incarnation of every member, this node included (the last view known
        once the node has left etcd). Static peers are always members."""
        if self.membership is not None:
            self._members = {n: r.incarnation
                             for n, r in self.membership.view.members().items()}
        elif self.config["membership"]["mode"] == "static":
            self._members = {p: 0 for p in self.routed.routed}
            self._members[self.config.node_id] = incarnation
        return self._members

    async def _abandon_start(self) -> None:
        """Start-up failed after Mosquitto was up: undo what started, and stop the Mosquitto
        this process spawned (one it adopted keeps serving its clients until we return)."""
        if self.drainer is not None:
            with contextlib.suppress(Exception):
                await self.drainer.close()
        if self.sessions is not None:
            with contextlib.suppress(Exception):
                await self.sessions.stop()
        if self.wills is not None:
            with contextlib.suppress(Exception):
                await self.wills.stop()
        if self.routing is not None:
            with contextlib.suppress(Exception):
                await self.routing.stop()
        self.sync.close()
        with contextlib.suppress(Exception):
            await self.admin.stop()
        if self.broker is not None and not self.broker.adopted:
            await self.broker.stop()
            self.layout.remove_fallback_socket_dir()

    async def run(self) -> int:
        """Start everything, serve until `stop()`, then shut down. Returns an exit code."""
        secret = self.layout.prepare()
        cfg = self.config
        incarnation, previous = self.layout.next_incarnation()
        try:
            self.admin.prepare(incarnation, self._static_peers())
            self.peer_tls = load_peer_tls(cfg["grpc"])
            self.peer_token = self._peer_token()
        except (AuthError, TlsConfigError) as exc:
            raise NodeError(str(exc)) from None
        if cfg["membership"]["mode"] == "etcd":
            # before Mosquitto: a duplicate id starts nothing
            await self._join(incarnation, previous)
        else:
            self.routed.on_view(self._static_peers(), time.monotonic())
        try:
            return await self._serve(secret, incarnation)
        finally:
            if self.membership is not None:
                await self.membership.stop()

    async def _serve(self, secret: str, incarnation: int) -> int:
        cfg = self.config
        # before Mosquitto: a taken port starts nothing; probes answer "not ready" meanwhile
        await self.admin.start()
        if cfg["mqtt"]["manage"]:
            self.layout.conf_path.write_text(render_mosquitto_conf(
                cfg, self.layout, secret,
                link_secret(self.peer_token) if cfg["routing"]["links"] else ""))
            self.layout.conf_path.chmod(0o600)
            self.layout.prepare_socket_dir()
            self.broker = MosquittoProcess(cfg["mqtt"]["mosquitto"], self.layout.conf_path,
                                           self.layout.socket_path, self.layout.run_dir)
            await self.broker.start()
        try:
            snapshot = await self._connect(secret, incarnation)
        except BaseException:
            await self._abandon_start()
            raise
        self.sync.start(snapshot)
        background = [asyncio.create_task(self._ticker())]
        gc.freeze()  # what start-up built lives on: later full collections skip it
        if self.broker is not None:
            background.append(asyncio.create_task(
                self.broker.supervise(self._on_broker_restart)))
        try:
            await self._stop.wait()
            if self.protocol_error is None:
                await self._drain()
        finally:
            if self.membership is not None:  # then leave: peers drop us at once
                await self.membership.stop()
                self.membership = None
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            await self.sync.stop()
            self.ready = False
            await self.admin.stop()
            if self.drainer is not None:
                await self.drainer.close()
            if self.sessions is not None:
                await self.sessions.stop()
            if self.wills is not None:
                await self.wills.stop()
            if self.journal is not None:
                await self.journal.stop()
            if self.routing is not None:
                await self.routing.stop()
            self.sync.close()
            if self.broker is not None:
                await self.broker.stop()
                self.layout.remove_fallback_socket_dir()
            self._status_file.close(self.status())
        return 3 if self.protocol_error else 0


async def run_node(config: NodeConfig) -> int:
    """Run one node until SIGTERM/SIGINT."""
    node = Node(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, node.stop)
    return await node.run()
