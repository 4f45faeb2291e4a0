"""`DrainService`: a node's drain wired to I/O (adapter for `sidecar.drain.progress`).

Reads the facts the core needs from the node's parts every `TICK`, and carries out its actions:
the plugin's `admission` command (per-client `deny` in mode `retry` with a Mosquitto whose
plugin lacks it), kicks, the session registry's hand-off, and NodeState frames telling the
peers that this node drains (capability `drain`). It also keeps the session registry's set of
nodes that take no replica nor hand-off: draining peers, peers of a version without replicas,
and this node while it drains.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

from sidecar._proto import peer_pb2
from sidecar.drain.progress import (
    Announce,
    CloseAdmission,
    Drain,
    Facts,
    HandOff,
    KickAll,
    OpenAdmission,
    Progress,
)
from sidecar.local.events import CommandFailed
from sidecar.local.protocol import DEFAULT_SIDECAR_ID, SIDECAR_USERNAME
from sidecar.peering.handshake import SESSION_REPLICAS
from sidecar.routing.table import SubscriptionTable

__all__ = ["DrainService"]

log = logging.getLogger("mqfed.drain")

TICK = 0.25  # while draining (facts cost O(clients + sessions)); serving: peers only
QUIET = 0.3  # seconds without a copy from Mosquitto: its queue for the sidecar is empty
KICK_CONCURRENCY = 64
Request = Callable[..., Awaitable[Any]]


class Routing(Protocol):
    """What the drain reads of `RoutingService`."""

    transport: Any
    queues: dict[str, Any]
    last_copy_at: float

    @property
    def unsettled(self) -> int: ...

    def peers_with(self, capability: str) -> list[str]: ...


class Sessions(Protocol):
    """What the drain uses of `SessionService`."""

    def set_unavailable(self, nodes: frozenset[str]) -> None: ...

    def hand_off_all(self) -> None: ...

    def drain_progress(self) -> dict[str, int]: ...


class Wills(Protocol):
    """What the drain uses of `WillService`."""

    async def handover(self) -> int: ...


class DrainService:
    """The drain of one node; `start()`/`stop()` from the admin API, frames from routing."""

    def __init__(self, node_id: str, request: Request, table: SubscriptionTable,
                 routing: Routing, sessions: Sessions | None,
                 wills: Wills | None = None) -> None:
        self.node_id = node_id
        self.request = request  # the plugin's commands (LocalLink.request)
        self.table = table
        self.routing = routing
        self.sessions = sessions
        self.wills = wills
        self.core = Drain()
        self.draining_peers: set[str] = set()
        self._denied: set[str] = set()  # per-client denies (a plugin without `admission`)
        self._per_client = False
        self._task: asyncio.Task | None = None
        self._ops: set[asyncio.Task] = set()
        self._kicking: asyncio.Task | None = None  # one round of kicks at a time
        self._handing: asyncio.Task | None = None  # one hand-off round at a time
        self._unavailable: frozenset[str] | None = None

    # ---- lifecycle -------------------------------------------------------------------------
    def start_ticking(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._ticker())

    async def close(self) -> None:
        tasks = [t for t in (self._task, *self._ops) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(TICK)
            try:
                self.tick()
            except Exception:  # one bad tick must not end the drain
                log.exception("drain tick failed")

    def tick(self) -> None:
        self._refresh_unavailable()
        if self.core.draining:
            self._run(self.core.on_tick(self.facts(), time.monotonic()))

    # ---- the operator ------------------------------------------------------------------------
    @property
    def draining(self) -> bool:
        return self.core.draining

    def start(self) -> Progress:
        """Drain this node (idempotent); the progress so far."""
        actions = self.core.start(time.monotonic(), time.time())
        if actions:
            log.warning("draining: admission closed, clients are disconnected, sessions move "
                        "to other nodes")
        self._run(actions)
        self.tick()
        return self.progress()

    def stop(self) -> Progress:
        """Undrain (idempotent): admit clients again."""
        actions = self.core.stop()
        if actions:
            log.warning("undrained: admitting clients again")
        self._run(actions)
        self._refresh_unavailable()
        return self.progress()

    def progress(self) -> Progress:
        return self.core.progress(time.monotonic())

    def serving_peers(self) -> list[str]:
        """Peers with a stream up that are not draining: where clients and sessions can go."""
        transport = self.routing.transport
        return [p for p in self.routing.queues
                if transport.connected(p) and p not in self.draining_peers]

    async def before_stop(self, timeout: float) -> bool:
        """SIGTERM: drain as `mqfed ctl drain` does, for at most `timeout` seconds and only
        while another node serves (a whole cluster stopping has nowhere to move anything);
        True once drained. The caller then leaves as before (what is left is kicked)."""
        if timeout <= 0 or self.core.state == "drained":
            return self.core.state == "drained"
        if not self.serving_peers():
            log.info("stopping without a drain: no other node serves")
            return False
        self.start()
        deadline = time.monotonic() + timeout
        while self.core.state != "drained":
            if time.monotonic() > deadline:
                log.warning("stopping before the drain ended (drain.on_stop is %.0f s); what "
                            "is left is disconnected", timeout,
                            extra={"progress": self.progress().as_dict()})
                return False
            if not self.serving_peers():
                log.info("stopping before the drain ended: no other node serves any more")
                return False
            await asyncio.sleep(TICK)
        log.info("drained before stopping",
                 extra={"seconds": self.progress().seconds})
        return True

    def on_resync(self) -> None:
        """The plugin link re-synced: a restarted Mosquitto admits everyone (closed again
        while draining); a Mosquitto adopted from a sidecar that was draining still refuses
        everyone (opened again while serving)."""
        if self.core.draining:
            self._run(self.core.on_resync())
        else:
            self._spawn(self._admit_all())

    async def _admit_all(self) -> None:
        with contextlib.suppress(Exception):  # an older plugin has no admission: nothing to do
            await self.request("admission", open=True)

    # ---- peers (routing.PeerFrames) --------------------------------------------------------
    def on_peer_up(self, peer: str) -> None:
        self._send(peer, self.core.draining)

    def on_peer_down(self, peer: str) -> None:
        """Kept: the peer says again when its stream comes back (a new process: not
        draining)."""

    def on_frame(self, peer: str, frame: peer_pb2.Frame, inbound: bool) -> None:
        if frame.WhichOneof("body") != "node_state":
            return
        if frame.node_state.draining:
            if peer not in self.draining_peers:
                log.info("peer drains", extra={"peer": peer})
            self.draining_peers.add(peer)
        else:
            self.draining_peers.discard(peer)
        self._refresh_unavailable()

    # ---- facts -------------------------------------------------------------------------------
    def clients(self) -> list[str]:
        """Client connections here: not the sidecar's own, not its shadows."""
        return [c for c, info in self.table.sessions().items()
                if info.online and info.username != SIDECAR_USERNAME
                and not c.startswith(DEFAULT_SIDECAR_ID)]

    def facts(self) -> Facts:
        routing = self.routing
        transport = routing.transport
        queued = queued_down = 0
        up = 0
        for peer, queue in routing.queues.items():
            if transport.connected(peer):
                up += 1
                queued += queue.count()
            else:
                queued_down += queue.count()
        sessions = self.sessions.drain_progress() if self.sessions is not None else {}
        return Facts(clients=len(self.clients()),
                     sessions_owned=sessions.get("sessions_owned", 0),
                     session_copies=sessions.get("session_copies", 0),
                     session_ops=sessions.get("session_ops", 0),
                     records_unsent=sessions.get("session_records_unsent", 0),
                     session_messages=sessions.get("session_messages", 0),
                     unsettled=routing.unsettled, queued=queued, queued_down=queued_down,
                     quiet=time.monotonic() - routing.last_copy_at >= QUIET, peers_up=up)

    def _refresh_unavailable(self) -> None:
        """Nodes that take no replica and no hand-off: draining ones, peers without replicas
        (an older version), this node while it drains."""
        if self.sessions is None:
            return
        capable = set(self.routing.peers_with(SESSION_REPLICAS))
        older = {p for p in self.routing.queues if p not in capable
                 and self.routing.transport.capabilities(p) is not None}
        nodes = frozenset(self.draining_peers | older
                          | ({self.node_id} if self.core.draining else set()))
        if nodes != self._unavailable:
            self._unavailable = nodes
            self.sessions.set_unavailable(nodes)

    # ---- actions -----------------------------------------------------------------------------
    def _run(self, actions: Iterable[object]) -> None:
        for action in actions:
            if isinstance(action, CloseAdmission):
                self._spawn(self._admission(False))
            elif isinstance(action, OpenAdmission):
                self._spawn(self._admission(True))
            elif isinstance(action, Announce):
                for peer in self.routing.queues:
                    self._send(peer, action.draining)
            elif isinstance(action, KickAll):
                if self._kicking is None or self._kicking.done():
                    self._kicking = self._spawn(self._kick_all(self.clients()))
            elif isinstance(action, HandOff):
                if self._handing is None or self._handing.done():
                    self._handing = self._spawn(self._hand_off())
            else:  # pragma: no cover - a new action type must be wired here
                raise TypeError(f"unhandled action {action!r}")

    def _send(self, peer: str, draining: bool) -> None:
        frame = peer_pb2.Frame(node_state=peer_pb2.NodeState(draining=draining))
        self.routing.transport.send(peer, frame)  # withheld for a peer without `drain`

    def _spawn(self, coro: Awaitable[None]) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._ops.add(task)
        task.add_done_callback(self._ops.discard)
        return task

    async def _admission(self, open_: bool) -> None:
        try:
            await self.request("admission", open=open_)
            self._per_client = False
        except CommandFailed as exc:
            if exc.code != "unknown_command":
                log.warning("the plugin refused admission: %s", exc)
                return
            self._per_client = True  # an older plugin: deny each client kicked instead
            log.warning("the plugin has no admission command (an older build): each kicked "
                        "client is denied here, new client ids may still connect")
            if open_:
                for client in list(self._denied):
                    with contextlib.suppress(Exception):
                        await self.request("admit", client=client)
                self._denied.clear()
        except Exception as exc:  # the link is down: it re-syncs, then on_resync
            log.warning("admission command failed: %s", exc)

    async def _hand_off(self) -> None:
        """Give the sessions of clients that did not come back to other nodes, their delayed
        wills first: the shadow that moves a session resumes it here, and Mosquitto cancels
        the pending will of a session resumed; a peer publishes it when it is due."""
        if self.wills is not None:
            try:
                await self.wills.handover()
            except Exception as exc:  # the sessions move anyway; the wills stay here
                log.warning("handing the delayed wills over failed: %s", exc)
        if self.sessions is not None:
            self.sessions.hand_off_all()

    async def _kick_all(self, clients: list[str]) -> None:
        gate = asyncio.Semaphore(KICK_CONCURRENCY)

        async def one(client: str) -> None:
            async with gate:
                try:
                    if self._per_client:
                        await self.request("deny", client=client, mode="retry")
                        self._denied.add(client)
                    await self.request("kick", client=client, with_will=True)
                except CommandFailed:
                    pass  # it left on its own meanwhile
                except Exception as exc:
                    log.info("kick failed", extra={"client": client, "error": str(exc)})

        await asyncio.gather(*(one(c) for c in clients))
