"""The node's admin side (wiring): admin gRPC server, metrics/health listener (with the
status page), the cluster directory and the retained source. `node.py` creates one and calls
it at a few points."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import TYPE_CHECKING

from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import CollectorRegistry

from sidecar.admin.answers import Answers
from sidecar.admin.auth import AuthPolicy
from sidecar.admin.directory import Directory
from sidecar.admin.retained import IndexSource, NoRetainedIndex, RetainedSource
from sidecar.admin.server import AdminServer
from sidecar.membership.view import Change, NodeRecord
from sidecar.observability.collector import NodeCollector
from sidecar.observability.health import HealthFacts
from sidecar.observability.http import MetricsServer
from sidecar.peering.handshake import Hello
from sidecar.statuspage.access import page_access
from sidecar.statuspage.pages import StatusPage
from sidecar.tokens import check_not_default, configured_token

if TYPE_CHECKING:
    from sidecar.node.facts import NodeView

__all__ = ["AdminService"]


class AdminService:
    """Admin API + metrics of one node."""

    def __init__(self, node: NodeView, version: str, crashed_retention: float) -> None:
        self.node = node
        self.version = version
        self.crashed_retention = crashed_retention
        self.retained: RetainedSource | None = None  # set by whoever owns a retained index
        self.directory: Directory | None = None
        self.policy = AuthPolicy(None)
        self.token: str | None = None
        self.grpc: AdminServer | None = None
        self.http: MetricsServer | None = None
        self._lag = 0.0
        self._lag_task: asyncio.Task | None = None

    def record(self, incarnation: int) -> NodeRecord:
        """This node's membership record (what etcd holds), with the admin address."""
        cfg = self.node.config
        return NodeRecord(cfg.node_id, cfg.advertised("grpc"), cfg["mqtt"]["listen"],
                          self.version, incarnation, self.node.started_at,
                          admin=cfg.advertised("admin"))

    def prepare(self, incarnation: int, static_peers: dict[str, str]) -> None:
        """Before membership starts: the directory, seeded with the static peers if any."""
        self.policy, self.token = self._policy()  # a bad token file fails the start here
        self.directory = Directory(self.record(incarnation), self.crashed_retention)
        self.directory.add_static(static_peers, time.time())

    def on_peer_hello(self, hello: Hello) -> None:
        """A peer's stream came up: its handshake tells its admin address (all static
        membership has of it)."""
        if self.directory is not None:
            self.directory.learn_admin(hello.node_id, hello.admin_address)

    def on_membership(self, changes: list[Change]) -> None:
        if self.directory is not None:
            self.directory.on_events(changes, time.time(), time.monotonic())

    def _policy(self) -> tuple[AuthPolicy, str | None]:
        admin = self.node.config["admin"]
        token = configured_token(admin, "admin token") or None
        check_not_default(token, "admin token", os.environ)
        return AuthPolicy(token, admin["dev_mode"]), token

    async def start(self) -> None:
        """Both listeners; calls needing routing answer UNAVAILABLE until it exists."""
        await self._start_http()
        try:
            await self._start_grpc()
        except BaseException:
            await self.stop()
            raise

    async def _start_http(self) -> None:
        self._lag_task = asyncio.create_task(self._measure_lag())
        listen = self.node.config["admin"]["metrics"]
        if not listen:
            return
        registry = CollectorRegistry(auto_describe=False)
        registry.register(NodeCollector(self.node, self.version))
        # CPU, memory and file descriptors: process_* (this sidecar) and
        # mqfed_mosquitto_process_* (its Mosquitto; none while it is not running)
        ProcessCollector(registry=registry)
        ProcessCollector("mqfed_mosquitto", self._mosquitto_pid, registry=registry)
        cfg = self.node.config
        access = page_access(self.token, listen, cfg["admin"]["status_page_open_on_loopback"])
        pages = StatusPage(lambda: self.grpc, access, cfg.node_id, cfg.cluster)
        self.http = MetricsServer(listen, registry, self._facts, pages)
        await self.http.start()

    def _mosquitto_pid(self) -> str:
        broker = self.node.broker
        return str(broker.pid) if broker is not None and broker.pid else "-"  # "-": no such pid

    async def _start_grpc(self) -> None:
        assert self.directory is not None, "prepare() first"
        self.grpc = AdminServer(self.node, self.node.config["admin"]["listen"], self.policy,
                                self.directory, Answers(self.node, self.version,
                                                        self._retained_source),
                                self.token, tls=self.node.peer_tls
                                if self.node.config["admin"]["tls"] else None)
        await self.grpc.start()

    async def stop(self) -> None:
        if self.grpc is not None:
            await self.grpc.stop()
        if self.http is not None:
            await self.http.stop()
        if self._lag_task is not None:
            self._lag_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._lag_task

    def _retained_source(self) -> RetainedSource:
        if self.retained is not None:
            return self.retained
        index = getattr(getattr(self.node.routing, "retained", None), "index", None)
        return IndexSource(index) if index is not None else NoRetainedIndex()

    def _facts(self) -> HealthFacts:
        node = self.node
        return HealthFacts(node.config.node_id, node.ready, node.stopping, self._lag,
                           str(node.protocol_error) if node.protocol_error else None,
                           draining=bool(node.drainer and node.drainer.draining))

    async def _measure_lag(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(0.5)
            self._lag = max(0.0, loop.time() - before - 0.5)
