"""`WillService`: the will table wired to I/O (adapter).

Feeds the `WillTable` core the plugin's connect/disconnect events and snapshots, the records
peers send, the membership view and the state of the peer streams (`Liveness`), and carries out
its actions: records to SQLite and to every peer, and wills published on the local Mosquitto
(through the control link, so Mosquitto delivers them to local subscribers and the forwarding
client forwards them to every node that wants them; a retained one is also handed to the
retained replication, as a client's retained publish is). A draining node hands the wills its
Mosquitto still holds to the others (`handover`) before it leaves.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from sidecar._proto import peer_pb2
from sidecar.hlc import HybridClock
from sidecar.local.events import Connect, Disconnect, RetainedSeen, Snapshot, Will
from sidecar.local.forward_client import to_paho_properties
from sidecar.local.protocol import DEFAULT_SIDECAR_ID, SIDECAR_USERNAME
from sidecar.membership.view import Change
from sidecar.peering.transport import FrameTooLarge
from sidecar.wills import wire
from sidecar.wills.liveness import Confirmed, Liveness, Returned
from sidecar.wills.record import ARMED, WillMessage, WillRecord
from sidecar.wills.sqlite import SqliteWillStore
from sidecar.wills.table import (
    Cancel,
    Connections,
    Fire,
    Forget,
    Notice,
    Persist,
    Store,
    WillTable,
)

log = logging.getLogger("mqfed.wills")

TICK = 0.2
SEND_DELAY = 0.005  # changes within this go as one frame
PUBLISH_TIMEOUT = 5.0
HANDOVER_TIMEOUT = 3.0
FIRING_WAIT = 3.5  # seconds a drain waits for delayed wills due about now to be sent here
DISCONNECTS_WAIT = 1.0  # at a handover: the kicked clients' disconnect events, at most


def _wall_ms() -> int:
    return int(time.time() * 1000)


def will_message(will: Will) -> WillMessage:
    return WillMessage(will.topic, will.payload, will.qos, will.retain, will.delay,
                       will.properties)


class WillService:
    """Wills of one node; the node hands it plugin events and membership changes,
    `RoutingService` peer frames."""

    def __init__(self, node_id: str, run_dir: Path, grace: float, link: Any, transport: Any,
                 peers: Callable[[], Iterable[str]], connections: Connections,
                 members: Callable[[], Mapping[str, int]],
                 on_retained: Callable[[RetainedSeen], None],
                 cancel: Callable[[str], Awaitable[None]] | None = None) -> None:
        """`cancel(client)`: end the client's state in the local Mosquitto without its
        pending will (a shadow's clean start; `Cancel`)."""
        self.node_id = node_id
        self.grace = grace
        self.link = link  # LocalLink: publish, connected
        self.transport = transport
        self.peers = peers
        self.members = members
        self.on_retained = on_retained
        self.cancel = cancel
        self.store = SqliteWillStore(run_dir / "wills.sqlite")
        self.liveness = Liveness(node_id, int(grace * 1000))
        self.table = WillTable(node_id, self.liveness, connections, HybridClock(),
                               ready_ms=_wall_ms() + int(grace * 1000))
        self.table.load(self.store.load())
        self._capable: set[str] = set()  # peers that answer handovers
        self._outbox: dict[str, WillRecord] = {}
        self._shadows: set[str] = set()
        self._acks: dict[tuple[str, int], asyncio.Future] = {}
        self._exchanges = itertools.count(1)
        self._view: dict[str, int] | None = None
        self._tasks: set[asyncio.Task] = set()
        self._ticker: asyncio.Task | None = None
        self._stopped = False
        self.counters = {"frames_out": 0, "bad_records": 0}

    # ---- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        self._ticker = asyncio.get_running_loop().create_task(self._tick_loop())

    async def stop(self) -> None:
        self._flush()
        self._stopped = True
        tasks = [t for t in (self._ticker, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.store.close()

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(TICK)
            try:
                self.tick(_wall_ms())
            except Exception:  # never let one bad tick end the wills of this node
                log.exception("wills tick failed")

    def tick(self, now_ms: int) -> None:
        view = dict(self.members())
        if view != self._view:
            self._view = view
            self._liveness_events(self.liveness.on_view(view, now_ms))
        owners = self.table.owners
        for node in self.liveness.watched(owners):
            up = self.transport.connected(node) or self.transport.connected(node, inbound=True)
            self.liveness.on_stream(node, up, now_ms)
        self._liveness_events(self.liveness.tick(now_ms, owners))
        self._run(self.table.on_tick(now_ms))

    # ---- inputs: the plugin --------------------------------------------------------------
    def on_event(self, event: object) -> None:
        """One applied plugin event (the session registry has seen it first)."""
        client = getattr(event, "client", None)
        if client is None or client.startswith(DEFAULT_SIDECAR_ID):
            return
        now = _wall_ms()
        if isinstance(event, Connect):
            if event.username == SIDECAR_USERNAME:  # a shadow: the sidecar acting as client
                self._shadows.add(client)
                return
            self._shadows.discard(client)
            will = event.will
            self._run(self.table.on_connect(
                client, self.table.connections.latest_connect(client),
                will_message(will) if isinstance(will, Will) else None, will is not None,
                event.session_expiry, event.epoch, now))
        elif isinstance(event, Disconnect):
            if client in self._shadows:
                self._shadows.discard(client)
            elif not event.taken_over:
                self._run(self.table.on_disconnect(client, event.will, event.session_expiry,
                                                   now))

    def on_snapshot(self, snapshot: Snapshot) -> None:
        online: dict[str, tuple[WillMessage | None, bool]] = {}
        for c in snapshot.clients:
            if c.online and c.username != SIDECAR_USERNAME \
                    and not c.client.startswith(DEFAULT_SIDECAR_ID):
                will = c.will
                online[c.client] = (will_message(will) if isinstance(will, Will) else None,
                                    will is not None)
        self._run(self.table.on_local_snapshot(snapshot.epoch, online, _wall_ms()))

    # ---- inputs: membership and peers ----------------------------------------------------
    def on_membership(self, changes: Iterable[Change]) -> None:
        for change in changes:
            if change.kind == "left":
                self.liveness.on_left(change.node_id)

    def on_peer_up(self, peer: str) -> None:
        """`peer`'s stream came up and it speaks the will frames: it gets every record."""
        self._capable.add(peer)
        for data in wire.records_frames(self.table.snapshot(), snapshot=True):
            self._send(peer, data)

    def on_frame(self, peer: str, frame: peer_pb2.Frame, inbound: bool) -> None:
        kind = frame.WhichOneof("body")
        if kind == "will_records":
            msg = frame.will_records
            records = []
            for m in msg.records:
                try:
                    records.append(wire.record_from_proto(m))
                except ValueError as exc:
                    self.counters["bad_records"] += 1
                    log.warning("skipping a peer's bad will record: %s", exc,
                                extra={"peer": peer})
            self._run(self.table.on_remote(records, _wall_ms()))
            if msg.exchange:
                self._send(peer, wire.ack_frame(msg.exchange), reply=inbound)
        elif kind == "will_records_ack":
            fut = self._acks.pop((peer, frame.will_records_ack.exchange), None)
            if fut is not None and not fut.done():
                fut.set_result(True)

    # ---- drain ---------------------------------------------------------------------------
    async def handover(self, timeout: float = HANDOVER_TIMEOUT) -> int:
        """This node drains and its Mosquitto stops: hand the wills it holds (delayed ones of
        the kicked clients, armed ones of any client still connected) to the other nodes, and
        wait until every peer that speaks the will frames confirmed them. Returns how many."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + timeout
        while loop.time() < started + DISCONNECTS_WAIT and self._armed_here():
            await asyncio.sleep(0.05)  # the kicked clients' disconnect events
        firing_until = loop.time() + FIRING_WAIT
        while loop.time() < firing_until and self.table.firing_here(_wall_ms()):
            await asyncio.sleep(0.05)  # a will due now is sent by this node's Mosquitto
        deadline = max(deadline, loop.time() + timeout)
        records = self.table.handover(_wall_ms())
        if not records:
            return 0
        self.store.save(records)
        self._flush()
        waits = []
        for peer in [p for p in self.peers() if p in self._capable]:
            exchange = next(self._exchanges)
            fut = loop.create_future()
            self._acks[(peer, exchange)] = fut
            sent = [self._send(peer, data)
                    for data in wire.records_frames(records, exchange=exchange)]
            if all(sent):
                waits.append(fut)
            else:
                self._acks.pop((peer, exchange), None)
        done: set = set()
        if waits:
            done, _ = await asyncio.wait(waits, timeout=max(0.0, deadline - loop.time()))
        log.info("handed this node's wills over", extra={
            "wills": len(records), "peers": len(waits), "confirmed": len(done)})
        if waits and not done:
            log.warning("no peer confirmed the wills handed over; they may be lost",
                        extra={"wills": len(records)})
        return len(records)

    def _armed_here(self) -> bool:
        mine = self.table.by_owner.get(self.node_id, ())
        return any(self.table.records[c].state == ARMED for c in mine)

    # ---- actions -------------------------------------------------------------------------
    def _run(self, actions: list) -> None:
        for action in actions:
            if isinstance(action, Store):
                self._publish_soon(action.record)
            elif isinstance(action, Persist):
                self.store.save(action.records)
            elif isinstance(action, Fire):
                self._spawn(self._fire(action.record))
            elif isinstance(action, Cancel):
                if self.cancel is not None:
                    self._spawn(self._cancel(action.client))
            elif isinstance(action, Forget):
                self.store.forget(action.clients)
            elif isinstance(action, Notice):
                log.warning("a peer published the will of a client still connected here: "
                            "this node was taken for dead (cut off from etcd and its peers)",
                            extra={"client": action.client, **dict(action.detail)})
            else:  # pragma: no cover - a new action type must be wired here
                raise TypeError(f"unhandled action {action!r}")

    def _liveness_events(self, events: list) -> None:
        for event in events:
            if isinstance(event, Confirmed):
                d = event.death
                log.warning("node confirmed dead: its lease expired and its streams have been "
                            "down for the grace; one survivor publishes its clients' wills",
                            extra={"peer": d.node, "incarnation": d.incarnation,
                                   "down_s": round((d.confirmed_ms - d.since_ms) / 1000, 1),
                                   "wills": len(self.table.by_owner.get(d.node, ()))})
            elif isinstance(event, Returned) and event.false:
                log.warning("a node confirmed dead came back with the same incarnation: it "
                            "was cut off, not dead; wills of its clients may have been "
                            "published while they were connected",
                            extra={"peer": event.death.node, "incarnation": event.incarnation})
            elif isinstance(event, Returned):
                log.info("a node confirmed dead came back", extra={
                    "peer": event.death.node, "incarnation": event.incarnation})

    def _publish_soon(self, record: WillRecord) -> None:
        first = not self._outbox
        self._outbox[record.client] = record
        if first:
            asyncio.get_running_loop().call_later(SEND_DELAY, self._flush)

    def _flush(self) -> None:
        if not self._outbox or self._stopped:
            return
        records, self._outbox = list(self._outbox.values()), {}
        self.store.save(records)
        frames = list(wire.records_frames(records))
        for peer in self.peers():
            for data in frames:
                self._send(peer, data)

    def _send(self, peer: str, data: bytes, reply: bool = False) -> bool:
        try:
            sent = self.transport.reply(peer, data) if reply else self.transport.send(peer, data)
        except FrameTooLarge as exc:  # one will larger than a peer frame may be
            log.warning("a will record is too large to replicate: %s", exc, extra={"peer": peer})
            return False
        if sent:
            self.counters["frames_out"] += 1
        return bool(sent)

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _fire(self, record: WillRecord) -> None:
        will = record.will
        assert will is not None
        ok = False
        try:
            if not self.link.connected:
                raise ConnectionError("the local link is down")
            info = self.link.publish(will.topic, will.payload, will.qos, will.retain,
                                     to_paho_properties(will.properties))
            ok = await self._published(info)
        except Exception as exc:
            log.warning("publishing a will for another node failed; retrying: %s", exc,
                        extra={"client": record.client, "owner": record.owner})
        if ok and will.retain:
            self.on_retained(RetainedSeen("", 0, _wall_ms(), record.client, will.topic,
                                          will.payload, will.qos, will.properties))
        if ok:
            log.info("published a will on behalf of its node", extra={
                "client": record.client, "owner": record.owner, "topic": will.topic,
                "reason": record.orphaned or "dead_node"})
        self._run(self.table.on_fired(record.client, record.connect_hlc, ok, _wall_ms()))

    async def _cancel(self, client: str) -> None:
        try:
            assert self.cancel is not None
            await self.cancel(client)
        except Exception as exc:  # noqa: BLE001 - its Mosquitto then sends it (as before)
            log.warning("cancelling the delayed will of a client that connected again "
                        "elsewhere failed; this node's Mosquitto may still send it: %s", exc,
                        extra={"client": client})
            return
        log.info("cancelled the delayed will of a client that connected again elsewhere",
                 extra={"client": client})

    @staticmethod
    async def _published(info: Any) -> bool:
        if getattr(info, "rc", 0) != 0:
            return False
        deadline = time.monotonic() + PUBLISH_TIMEOUT
        while not info.is_published():
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    # ---- views ---------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        table = self.table
        pending = sum(len(v) for v in table.by_owner.values()) + len(table.orphans)
        return {"records": len(table.records), "pending": pending,
                "orphaned": len(table.orphans),
                "dead": sorted(self.liveness.dead), "grace_s": self.grace,
                **{f"deaths_{k}": v for k, v in self.liveness.counters.items()},
                **table.counters, **self.counters}
