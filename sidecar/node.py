"""One mqfed node: Mosquitto with the plugin, the local link, and the cores (wiring).

This is the only module that knows every part. It builds them from the config, feeds plugin
events through the event stream into the subscription table, carries out the actions the
cores return, and publishes the node's status file (`<run_dir>/state.json`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import importlib.metadata
import json
import logging
import os
import pwd
import secrets
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from sidecar.admin.service import AdminService
from sidecar.broker import conf as broker_conf
from sidecar.broker.process import MosquittoProcess
from sidecar.cluster_routing import ClusterRouting
from sidecar.config import NodeConfig, is_loopback
from sidecar.drain import drain
from sidecar.local.events import CommandFailed, Event, ProtocolError, RetainedSeen, Snapshot
from sidecar.local.forward_client import PROBE_TOPIC, ForwardClient
from sidecar.local.link import LinkError, LocalLink
from sidecar.local.pressure import Report
from sidecar.local.protocol import DEFAULT_SIDECAR_ID
from sidecar.local.stream import (
    Apply,
    EventStream,
    LoadSnapshot,
    RequestResume,
    RequestSnapshot,
    SendAck,
)
from sidecar.membership.etcd import EtcdMembership
from sidecar.peering.handshake import Hello
from sidecar.peering.tls import PeerTls, TlsConfigError, load_peer_tls
from sidecar.peering.transport import PeerTransportError
from sidecar.retained.service import link_reader
from sidecar.routing.forwarder import Envelope
from sidecar.routing.table import InterestChange, SubscriptionTable
from sidecar.tokens import AuthError, read_token

log = logging.getLogger("mqfed.node")

REPO_ROOT = Path(__file__).resolve().parent.parent
PLUGIN_CANDIDATES = (
    REPO_ROOT / "deploy" / "mosquitto-plugin" / "build" / "mqfed_plugin.so",
    Path("/usr/lib/mqfed/mqfed_plugin.so"),
)


STATUS_DETAIL_LIMIT = 1000
CRASHED_PEER_RETENTION = 600.0
"""Seconds a peer whose etcd key expired (a crash, not a graceful leave) stays in routing:
its interest is kept and its messages queue (bounded, spilled to disk) until it comes back."""
try:
    VERSION = importlib.metadata.version("mqfed")
except importlib.metadata.PackageNotFoundError:  # running from a source tree
    VERSION = "0.0.0+source"


class NodeError(RuntimeError):
    """The node cannot start; the message says what to do."""


def find_plugin(configured: str) -> Path:
    """The plugin shared object to load, or a NodeError saying how to build it."""
    candidates = (Path(configured),) if configured else PLUGIN_CANDIDATES
    for path in candidates:
        if path.is_file():
            return path
    raise NodeError(f"mqfed plugin not found at {', '.join(map(str, candidates))}: "
                    "build it with `make install` (or `make -C deploy/mosquitto-plugin`) "
                    "or set mqtt.plugin")


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    tmp.replace(path)


SOCKET_PATH_MAX = 100  # sun_path is 108 bytes; keep a margin
SOCKET_FALLBACK_ROOT = Path("/tmp/mqfed-sockets")


def _mosquitto_user() -> pwd.struct_passwd | None:
    """The user Mosquitto drops to when started as root (None when not root)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("mosquitto")
    except KeyError:
        return None


def _others_can_traverse(path: Path) -> bool:
    return all(p.stat().st_mode & 0o001 for p in [path, *path.parents] if p.exists())


class NodeLayout:
    """Where a node keeps its files inside its run dir.

    The private socket lives in `<run_dir>/mosquitto/` unless that path is too long for a unix
    socket or (as root) not reachable by the `mosquitto` user Mosquitto drops to; then it lives
    in a folder under /tmp/mqfed-sockets/ named by a hash of the run dir (stable across
    restarts, so a restarted sidecar finds its Mosquitto).
    """

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.conf_path = run_dir / "mosquitto.conf"
        self.secret_path = run_dir / "secret"
        self.state_path = run_dir / "state.json"
        self.socket_dir = run_dir / "mosquitto"
        user = _mosquitto_user()
        reachable = user is None or _others_can_traverse(run_dir)
        if not reachable or len(str(self.socket_dir / "mosquitto.sock")) > SOCKET_PATH_MAX:
            digest = hashlib.sha256(str(run_dir).encode()).hexdigest()[:16]
            self.socket_dir = SOCKET_FALLBACK_ROOT / digest
        self.socket_path = self.socket_dir / "mosquitto.sock"

    def prepare_socket_dir(self) -> None:
        """Create the socket's folder, writable by the user Mosquitto drops to."""
        if self.socket_dir.parent == SOCKET_FALLBACK_ROOT:
            SOCKET_FALLBACK_ROOT.mkdir(mode=0o711, exist_ok=True)
        self.socket_dir.mkdir(exist_ok=True)
        user = _mosquitto_user()
        if user is not None:  # Mosquitto drops to this user before binding the socket
            os.chown(self.socket_dir, user.pw_uid, user.pw_gid)
            self.socket_dir.chmod(0o750)

    def prepare(self) -> str:
        """Create the run dir; return the node's secret, created on first start."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if not self.secret_path.exists():
            fd = os.open(self.secret_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(24))
        return self.secret_path.read_text().strip()

    def next_incarnation(self) -> tuple[int, int | None]:
        """(a number that grows with every start of this node's sidecar, the previous one).
        Peers use it to tell a restarted sidecar from a stale one; etcd registration uses the
        previous one to replace this node's own key after a crash."""
        path = self.run_dir / "incarnation"
        try:
            previous: int | None = int(path.read_text())
        except (OSError, ValueError):
            previous = None
        value = max((previous or 0) + 1, int(time.time() * 1000))
        path.write_text(f"{value}\n")
        return value, previous

    def remove_fallback_socket_dir(self) -> None:
        """Remove the /tmp socket folder (if used) after Mosquitto stopped."""
        if self.socket_dir.parent == SOCKET_FALLBACK_ROOT:
            shutil.rmtree(self.socket_dir, ignore_errors=True)


def user_settings(config: NodeConfig) -> broker_conf.UserSettings | None:
    """The user's own Mosquitto settings (`mqtt.include`), or None without any."""
    include = config["mqtt"]["include"]
    return broker_conf.read_user_settings(Path(include)) if include else None


def max_queued_messages(config: NodeConfig) -> int:
    """Mosquitto's `max_queued_messages` on this node: the user's, else mqfed's default."""
    user = user_settings(config)
    return user.max_queued if user is not None else broker_conf.DEFAULT_MAX_QUEUED


def render_mosquitto_conf(config: NodeConfig, layout: NodeLayout, secret: str) -> str:
    """The Mosquitto config text for this node (see sidecar.broker.conf)."""
    mqtt = config["mqtt"]
    include = Path(mqtt["include"]) if mqtt["include"] else None
    user = user_settings(config)
    return broker_conf.render(broker_conf.BrokerConfig(
        node_id=config.node_id, plugin_path=find_plugin(mqtt["plugin"]),
        socket_path=layout.socket_path, secret=secret, listen=mqtt["listen"], user=user,
        include_path=include, external_auth=mqtt["external_auth"],
        external_acl=mqtt["external_acl"], fwd_backlog_max=config["overload"]["backlog_max"],
    ))


class Node:
    """A running node; `run()` until `stop()`."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.layout = NodeLayout(config.run_dir)
        self.stream = EventStream()
        self.table = SubscriptionTable()
        self.broker: MosquittoProcess | None = None
        self.link: LocalLink | None = None
        self.routing: ClusterRouting | None = None
        self.peer_token = ""  # read at start (grpc.token / grpc.token_file)
        self.peer_tls: PeerTls | None = None  # read at start (grpc.tls_*)
        self.membership: EtcdMembership | None = None
        self._peers: dict[str, str] = {}
        self._view_peers: dict[str, str] = {}
        self._crashed: dict[str, tuple[str, float]] = {}  # peer -> grpc address, since
        self.ready = False
        self.started_at = time.time()
        self.interest_changes = 0
        self.protocol_error: ProtocolError | None = None
        self._stop = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._state_dirty = True
        self._snapshot_failures = 0
        self.admin = AdminService(self, VERSION, CRASHED_PEER_RETENTION)

    @property
    def stopping(self) -> bool:
        """A graceful stop has begun (`NodeView`)."""
        return self._stop.is_set()

    @property
    def peers(self) -> dict[str, str]:
        """The peers this node routes to, node id -> gRPC address (`NodeView`)."""
        return dict(self._peers)

    # ---- cores → actions ---------------------------------------------------------------
    def _on_events(self, events: list[Event]) -> None:
        now = time.monotonic()
        for event in events:
            self._run_actions(self.stream.on_event(event, now))

    def _on_interest(self, changes: list[InterestChange]) -> None:
        if changes:
            if self.routing is not None:
                self.routing.on_interest_changes(changes)
            self.interest_changes += len(changes)
            self._state_dirty = True
            log.debug("interest changed", extra={"changes": len(changes)})

    def _run_actions(self, actions: list) -> None:
        for action in actions:
            if isinstance(action, Apply):
                self._state_dirty = True
                self._on_interest(self.table.apply(action.event))
                if isinstance(action.event, RetainedSeen) and self.routing is not None:
                    self.routing.on_retained_seen(action.event)
            elif isinstance(action, LoadSnapshot):
                self._on_interest(self.table.load_snapshot(action.snapshot))
            elif isinstance(action, SendAck):
                assert self.link is not None
                self.link.send("ack", seq=action.seq, epoch=self.stream.epoch)
            elif isinstance(action, RequestSnapshot):
                self._spawn(self._take_snapshot())
            elif isinstance(action, RequestResume):
                self._spawn(self._resume(action.from_seq))
            else:  # pragma: no cover - a new action type must be wired here
                raise TypeError(f"unhandled action {action!r}")

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _take_snapshot(self) -> None:
        assert self.link is not None
        try:
            snapshot: Snapshot = await self.link.snapshot()
        except (LinkError, ProtocolError) as exc:
            self._snapshot_failures += 1
            log.warning("snapshot failed, asking again", extra={
                "error": str(exc), "failures": self._snapshot_failures})
            await asyncio.sleep(min(0.2 * self._snapshot_failures, 2.0))
            self._run_actions(self.stream.on_snapshot_failed())
            return
        self._snapshot_failures = 0
        self._run_actions(self.stream.on_snapshot(snapshot))
        self._state_dirty = True

    async def _resume(self, from_seq: int) -> None:
        assert self.link is not None
        try:
            reply = await self.link.request("resume", from_seq=from_seq, epoch=self.stream.epoch)
        except (ProtocolError, LinkError) as exc:
            log.info("resume refused, re-syncing from a snapshot", extra={"error": str(exc)})
            self._run_actions(self.stream.on_resume_failed())
            return
        self._run_actions(self.stream.on_resumed(reply.fields.get("epoch", "")))

    def _on_protocol_error(self, exc: ProtocolError) -> None:
        log.error("plugin protocol error: %s", exc)
        self.protocol_error = exc
        self._stop.set()

    # ---- lifecycle ---------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        cfg = self.config
        return {
            "node": cfg.node_id,
            "cluster": cfg.cluster,
            "pid": os.getpid(),
            "mosquitto_pid": self.broker.pid if self.broker else None,
            "ready": self.ready,
            "started_at": self.started_at,
            "mqtt": cfg["mqtt"]["listen"],
            "grpc": cfg["grpc"]["listen"],
            "admin": cfg["admin"]["listen"],
            "metrics": cfg["admin"]["metrics"],
            "peers": self._peers,
            "socket": str(self.layout.socket_path),
            "stream": self.stream.stats(),
            "broker_restarts": self.broker.restarts if self.broker else 0,
            "session_counts": self.table.sessions_status(),
            "routing": self.routing.status() if self.routing else None,
            **self._detail(),
        }

    def _detail(self, limit: int = STATUS_DETAIL_LIMIT) -> dict[str, Any]:
        """Per-filter and per-session detail for small nodes (debugging and tests)."""
        interest = self.table.interest()
        sessions = self.table.sessions()
        if len(interest) > limit or len(sessions) > limit:
            return {"detail": f"omitted: more than {limit} filters or sessions"}
        return {
            "interest": sorted(([k.group, k.filter, n] for k, n in interest.items()),
                               key=lambda row: (row[0] or "", row[1])),
            "sessions": {client: {"online": info.online, "persistent": info.persistent,
                                  "subscriptions": self.table.subscriptions(client)}
                         for client, info in sessions.items()},
        }

    def _publish_status(self) -> None:
        _write_json(self.layout.state_path, self.status())
        self._state_dirty = False

    async def _ticker(self) -> None:
        last_write = 0.0
        while True:
            await asyncio.sleep(0.05)
            now = time.monotonic()
            self._run_actions(self.stream.on_tick(now))
            if self._crashed:
                self._apply_peers()
            if self.routing is not None and self.routing.fwd.wants_probe():
                self._spawn(self._probe_forwarding())
            if self.routing is not None and self.link is not None and self.link.connected:
                report = self.routing.pressure_report(now)
                if report is not None:
                    self._spawn(self._report_pressure(report))
            if self.stream.in_sync and not self.ready:
                self.ready = True
                self._state_dirty = True
                log.info("node ready", extra={"mqtt": self.config["mqtt"]["listen"]})
            if (self._state_dirty and now - last_write > 0.2) or now - last_write > 0.5:
                last_write = now
                self._publish_status()

    async def _probe_forwarding(self) -> None:
        """A targeted probe to the forwarding client shows copies Mosquitto dropped at the
        tail of a burst (sidecar.local.midgaps)."""
        assert self.link is not None
        try:
            await self.link.request("deliver", client=DEFAULT_SIDECAR_ID + ".fwd",
                                    topic=PROBE_TOPIC, payload="", qos=1)
        except (LinkError, CommandFailed) as exc:
            log.debug("forwarding probe failed", extra={"error": str(exc)})

    async def _report_pressure(self, report: Report) -> None:
        """Tell the plugin our backlog and whether to shed publishers (sidecar.local.pressure)."""
        assert self.link is not None and self.routing is not None
        bp = self.routing.backpressure
        if report.changed and report.shed_ms:
            log.warning("overload: the forwarding backlog reached %d unacknowledged copies; "
                        "publishers of QoS > 0 messages peers want are disconnected before "
                        "their message is acknowledged until it is below %d", report.unacked,
                        bp.resume_below, extra={"unacked": report.unacked})
        elif report.changed:
            log.warning("overload over: publishers are accepted again",
                        extra={"unacked": report.unacked,
                               "publishers_shed": bp.publishers_shed})
        try:
            reply = await self.link.request("pressure", unacked=report.unacked,
                                            taken=report.taken, shed_ms=report.shed_ms)
        except (LinkError, CommandFailed) as exc:
            log.debug("overload report failed", extra={"error": str(exc)})
            return
        bp.on_reply(bool(reply.fields.get("shedding")), int(reply.fields.get("shed_total", 0)),
                    int(reply.fields.get("backlog", 0)))

    async def _drain(self) -> None:
        """Graceful leave: clients disconnected cleanly, their last messages forwarded. Only
        when we stop Mosquitto too: a sidecar alone restarting keeps every client."""
        if self.broker is None or self.link is None or not self.link.connected:
            return
        online = [c for c, info in self.table.sessions().items()
                  if info.online and not c.startswith(DEFAULT_SIDECAR_ID)]
        await drain(self.link, online, self.routing)

    async def _on_broker_restart(self) -> None:
        log.warning("mosquitto restarted; the link re-syncs from a new snapshot")
        self._state_dirty = True

    def stop(self) -> None:
        self._stop.set()

    def _on_peers(self, peers: dict[str, str]) -> None:
        """The membership view changed (etcd watch): dial joiners, drop leavers."""
        self._view_peers = dict(peers)
        self._apply_peers()

    def _on_membership_events(self, changes) -> None:
        """A crashed peer (key expired, no graceful leave) stays routed for a while. Only
        remembered here: the view change that always follows (`_on_peers`) applies it."""
        now = time.monotonic()
        self.admin.on_membership(changes)
        for change in changes:
            if change.kind == "crashed":
                self._crashed[change.node_id] = (change.record.grpc, now)
                log.warning("peer crashed; keeping its interest and queue",
                            extra={"peer": change.node_id,
                                   "retention_s": CRASHED_PEER_RETENTION})
            elif change.kind == "left":  # graceful: drop it now
                self._crashed.pop(change.node_id, None)

    def _apply_peers(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for peer in [p for p in self._crashed if p in self._view_peers]:
            del self._crashed[peer]  # it is back (a join reaches the view after its event)
        for peer in [p for p, (_, since) in self._crashed.items()
                     if now - since > CRASHED_PEER_RETENTION]:
            log.warning("crashed peer did not return; dropping it", extra={"peer": peer})
            del self._crashed[peer]
        peers = {p: addr for p, (addr, _) in self._crashed.items()}
        peers.update(self._view_peers)
        if peers != self._peers:
            self._peers = peers
            if self.routing is not None:
                self.routing.set_peers(peers)
            self._state_dirty = True

    async def _join(self, incarnation: int, previous: int | None) -> None:
        """Register in etcd (refused if another live node has our id) and watch the others."""
        cfg = self.config
        record = self.admin.record(incarnation)
        self.membership = EtcdMembership(cfg["membership"]["etcd"], cfg.cluster, record,
                                         cfg["membership"]["lease_ttl"],
                                         on_change=self._on_peers,
                                         on_events=self._on_membership_events,
                                         supersedes=previous)
        await self.membership.start()

    def _peer_token(self) -> str:
        """The shared peer token ("" for none: then, without mutual TLS either, say that anyone
        reaching the port may join, unless it is loopback only)."""
        grpc_cfg = self.config["grpc"]
        token = grpc_cfg["token"] or (read_token(grpc_cfg["token_file"], "peer token")
                                      if grpc_cfg["token_file"] else "")
        if not token and self.peer_tls is None and not is_loopback(grpc_cfg["listen"]):
            log.warning("the peer port accepts any sidecar that can reach it: set grpc.token "
                        "or grpc.token_file (the same secret on every node), or grpc.tls_*",
                        extra={"listen": grpc_cfg["listen"]})
        return token

    def _static_peers(self) -> dict[str, str]:
        peers: dict[str, str] = {}
        if self.config["membership"]["mode"] == "static":
            for entry in self.config["membership"]["peers"]:
                node, _, address = entry.partition("@")
                peers[node] = address
        return peers

    def _build_routing(self, secret: str, incarnation: int) -> ClusterRouting:
        cfg = self.config
        hello = Hello(cfg.cluster, cfg.node_id, incarnation,
                      grpc_address=cfg.advertised("grpc"), mqtt_address=cfg["mqtt"]["listen"],
                      admin_address=cfg.advertised("admin"))
        socket_path = self.layout.socket_path
        max_queued = max_queued_messages(cfg)
        window = broker_conf.forward_receive_maximum(max_queued)

        def forward_client(**callbacks) -> ForwardClient:
            return ForwardClient(socket_path, secret, DEFAULT_SIDECAR_ID + ".fwd",
                                 receive_maximum=window, max_queued=max_queued, **callbacks)

        return ClusterRouting(hello=hello, listen=cfg["grpc"]["listen"],
                              run_dir=self.layout.run_dir, table=self.table,
                              forward_client=forward_client, deliver=self._deliver,
                              read_retained=link_reader(self.link),
                              tombstone_grace=cfg["retained"]["tombstone_grace"],
                              peer_token=self.peer_token, peer_tls=self.peer_tls,
                              shed_above=cfg["overload"]["shed_above"])

    async def _deliver(self, client: str, env: Envelope) -> None:
        """Deliver one message to one local client through the plugin (shared subscriptions)."""
        assert self.link is not None
        await self.link.request("deliver", client=client, topic=env.topic, payload=env.payload,
                                qos=env.qos, properties=env.properties,
                                subscription=f"$share/{env.shared_group}/{env.shared_filter}")

    async def _connect(self, secret: str, incarnation: int) -> Snapshot:
        """Link to the plugin, then start routing (after Mosquitto is up); returns the
        plugin's first snapshot."""
        cfg = self.config
        self.link = LocalLink(
            self.layout.socket_path, secret, on_events=self._on_events,
            on_reconnect=lambda: self._run_actions(self.stream.on_link_reconnected()),
            on_protocol_error=self._on_protocol_error,
        )
        await self.link.connect(cfg["mqtt"]["link_timeout"])
        # a first snapshot proves the plugin answers (a missing plugin fails loudly here)
        snapshot = await self.link.snapshot(timeout=cfg["mqtt"]["link_timeout"])
        self.routing = self._build_routing(secret, incarnation)
        self.routing.on_peer_hello = self.admin.on_peer_hello
        try:
            await self.routing.start(lambda: self._peers)  # the view as it is then
        except PeerTransportError as exc:
            raise NodeError(str(exc)) from None
        return snapshot

    async def _abandon_start(self) -> None:
        """Start-up failed after Mosquitto was up: undo what started, and stop the Mosquitto
        this process spawned (one it adopted keeps serving its clients until we return)."""
        if self.routing is not None:
            with contextlib.suppress(Exception):
                await self.routing.stop()
        if self.link is not None:
            self.link.close()
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
            self._peers = self._static_peers()
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
            self.layout.conf_path.write_text(render_mosquitto_conf(cfg, self.layout, secret))
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
        self.stream.start()
        self._run_actions(self.stream.on_snapshot(snapshot))
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
            for task in background + list(self._tasks):
                task.cancel()
            await asyncio.gather(*background, *self._tasks, return_exceptions=True)
            self.ready = False
            await self.admin.stop()
            if self.routing is not None:
                await self.routing.stop()
            self.link.close()
            if self.broker is not None:
                await self.broker.stop()
                self.layout.remove_fallback_socket_dir()
            self._publish_status()
        return 3 if self.protocol_error else 0


async def run_node(config: NodeConfig) -> int:
    """Run one node until SIGTERM/SIGINT."""
    node = Node(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, node.stop)
    return await node.run()
