"""`SessionService`: the session registry wired to I/O (adapter).

Feeds the registry core the plugin's client events and the records peers send; carries out its
actions: records to the store and to every peer, kicks and the deny list through the plugin,
shadow connections (make, drain, delete a session), and session backlogs between nodes. The
operations of one client id run one after another, in the order the core asked for them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from sidecar._proto import peer_pb2
from sidecar.hlc import HybridClock
from sidecar.local.events import (
    CommandFailed,
    Connect,
    ConnectRejected,
    Disconnect,
    SessionExpired,
    Snapshot,
    Subscribe,
    Unsubscribe,
    deliver_item,
)
from sidecar.local.protocol import DEFAULT_SIDECAR_ID
from sidecar.peering.handshake import SESSION_CLAIMS, SESSION_CUTS, SESSION_ORDER
from sidecar.peering.transport import FrameTooLarge
from sidecar.routing.forwarder import Envelope
from sidecar.routing.records import origin_of
from sidecar.sessions import wire
from sidecar.sessions.claims import CLAIM_MS
from sidecar.sessions.cuts import MoveCuts, OldCopyCuts
from sidecar.sessions.record import SessionRecord, replica_subscriptions
from sidecar.sessions.registry import (
    Admit,
    Claim,
    Claimed,
    Deny,
    Discard,
    Drain,
    Forget,
    Hold,
    Kick,
    Materialize,
    Publish,
    Resubscribe,
    SessionRegistry,
)
from sidecar.sessions.shadow import Queued, ShadowError, Shadows
from sidecar.sessions.sqlite import SqliteSessionStore
from sidecar.sessions.unreleased import (
    Unreleased,
    from_plugin,
    problem,
    to_plugin,
)

log = logging.getLogger("mqfed.sessions")

BACKLOG_TIMEOUT = 10.0  # seconds for a peer to take a moving session's queue, plus:
BACKLOG_TIMEOUT_PER_MESSAGE = 0.002  # for each message in it (10,000: 30 s in all)
BACKLOG_FRAME_BYTES = 8 << 20  # payload bytes of a moving queue per SessionBacklog frame
BACKLOG_FRAME_MESSAGES = 10_000  # and messages
DELIVER_BATCH = 500  # messages of a moving session's queue per plugin command
DELIVER_BATCH_BYTES = 1 << 20  # and about this many payload bytes
DELIVER_BATCH_TIMEOUT = 10.0
SYNC_TIMEOUT = 30.0
"""How long a peer whose stream is up has to confirm a barrier (a loaded peer is waited for;
a peer whose stream goes down is passed over at once: what it routed here before it went
down reaches a session that no longer queues, the limit docs/architecture.md §5 names)."""
HANDOFF_SETTLE_WAIT = 5.0
"""How long a hand-off's target waits, before it answers the old owner's barrier, for what
the hand-off's record started on that client here (the copy's hold off, or its making)."""
HANDOVER_RETARGETS = 3  # a drained queue refused by a node its client left goes to the newer
HANDOVER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
TICK = 0.5
BACKGROUND_SHADOWS = 8
"""Shadow operations no client waits for (making and deleting replicas, deleting copies) run at
most this many at a time, so a joining node or a burst of new sessions leaves the loop and
the plugin link to the connects, deny lists and moves that clients wait for."""
DETAIL_LIMIT = 1000
QUEUED_EVERY = 2.0  # seconds between counts of the messages queued in offline sessions
REFUSED_LOG_EVERY = 60.0  # seconds between warnings about refused peer records
Request = Callable[..., Awaitable[Any]]


def _wall_ms() -> int:
    return int(time.time() * 1000)


def _described(action: object) -> dict[str, Any]:
    """An action's fields for a debug line (records by client, subscriptions by count)."""
    out: dict[str, Any] = {"action": type(action).__name__}
    for field in dataclasses.fields(action):  # type: ignore[arg-type]
        value = getattr(action, field.name)
        if isinstance(value, SessionRecord):
            out.update(client=value.client, owner=value.owner, online=value.online)
        elif isinstance(value, (list, tuple, dict, frozenset, set)):
            out[field.name] = len(value)
        else:
            out[field.name] = value
    return out


def _batches(envs: list[Any], count: int = 0, size_limit: int = 0) -> Iterator[list[Any]]:
    """`envs` in order, at most `count` messages or about `size_limit` bytes each (defaults:
    DELIVER_BATCH, DELIVER_BATCH_BYTES); one message above the size goes alone."""
    count, size_limit = count or DELIVER_BATCH, size_limit or DELIVER_BATCH_BYTES
    batch: list[Envelope] = []
    size = 0
    for env in envs:
        if batch and (len(batch) >= count or size + len(env.payload) > size_limit):
            yield batch
            batch, size = [], 0
        batch.append(env)
        size += len(env.payload) + len(env.topic)
    if batch:
        yield batch


def _record_fields(peer: str, record: SessionRecord) -> dict[str, Any]:
    """A peer's record for a debug line."""
    return {"peer": peer, "client": record.client, "owner": record.owner,
            "online": record.online, "deleted": record.deleted,
            "connect_hlc": record.connect_hlc}


class SessionService:
    """Sessions of one node; the node hands it plugin events, `RoutingService` peer frames."""

    def __init__(self, node_id: str, incarnation: int, run_dir: Path, socket_path: Path,
                 secret: str, request: Request, transport: Any,
                 peers: Callable[[], Iterable[str]],
                 barrier: Callable[[str, float], Awaitable[bool]],
                 replicas: int = 1, down_grace: float = 1.0) -> None:
        self.node_id = node_id
        self.incarnation = incarnation
        self.request = request  # the plugin's commands (LocalLink.request)
        self.transport = transport
        self.peers = peers
        self.barrier = barrier  # RoutingService.settle_to
        self._syncs: dict[tuple[str, int], asyncio.Future] = {}
        self._unpublished: dict[str, SessionRecord] = {}  # client -> record to send soon
        self._stopped = False
        self._counts: tuple[float, dict[str, int]] = (-1e9, {})
        self.store = SqliteSessionStore(run_dir / "sessions.sqlite")
        self.clock = HybridClock()
        self.registry = SessionRegistry(node_id, self.clock, replicas=replicas,
                                        grace_ms=int(down_grace * 1000),
                                        started_ms=_wall_ms())
        self._up: set[str] = set()
        for record in self.store.load():
            self.registry.records[record.client] = record
        self.shadows = Shadows(socket_path, secret, self._deliver_marker, self._deliver_again,
                              self._set_options)
        self._chains: dict[str, asyncio.Task] = {}
        self._background = asyncio.Semaphore(BACKGROUND_SHADOWS)
        self._others: set[asyncio.Task] = set()
        self._exchanges = itertools.count(1)
        self._backlog_acks: dict[tuple[str, int], asyncio.Future] = {}
        self._seq = itertools.count(1)
        self._task: asyncio.Task | None = None
        self._handover = [0] * (len(HANDOVER_BUCKETS) + 1)  # per bucket, then beyond
        self._handover_sum = 0.0
        self.counters = {"backlog_sent": 0, "backlog_received": 0, "backlog_failed": 0,
                         "commands_failed": 0, "frames_out": 0,
                         "sync_timeouts": 0, "frames_too_large": 0, "records_refused": 0,
                         "backlog_frames": 0, "backlog_refused": 0, "unreleased_sent": 0,
                         "unreleased_received": 0, "unreleased_refused": 0,
                         "drains_abandoned": 0, "discards_abandoned": 0,
                         "handovers_retargeted": 0}
        self._refused_logged = float("-inf")
        self.queued_here: int | None = None  # messages in offline sessions here (plugin)
        self.cuts = MoveCuts()  # a moving session's cut mode (wired to routing by the node)
        self.cuts_on = False  # this node injects peers' messages as batches (node sets)
        self._counting = False

    # ---- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._ticker())

    async def stop(self) -> None:
        for client in list(self._unpublished):
            self._publish(client)  # stored at least (the streams may be gone)
        self._stopped = True
        tasks = [t for t in (self._task, *self._chains.values(), *self._others)
                 if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.store.close()

    async def _ticker(self) -> None:
        last_count = float("-inf")
        while True:
            await asyncio.sleep(TICK)
            self._run(self.registry.on_tick(_wall_ms()))
            if time.monotonic() - last_count >= QUEUED_EVERY and not self._counting:
                last_count = time.monotonic()
                self._counting = True
                self._spawn(self._count_queued())

    async def _count_queued(self) -> None:
        """Refresh `queued_here` (the plugin's total for this node's offline sessions)."""
        try:
            reply = await self.request("queued", timeout=2.0, clients=[])
            total = reply.fields.get("total")
            self.queued_here = int(total) if isinstance(total, (int, float)) else None
        except Exception as exc:  # noqa: BLE001 - an older plugin, or the link is down
            log.debug("counting queued messages failed: %s", exc)
            self.queued_here = None
        finally:
            self._counting = False

    # ---- inputs: the plugin ----------------------------------------------------------------
    def on_event(self, event: object) -> None:
        """One applied plugin event (any type; the client events matter here)."""
        now = _wall_ms()
        reg = self.registry
        client = getattr(event, "client", None)
        if client is not None and client.startswith(DEFAULT_SIDECAR_ID):
            return
        if client is not None and log.isEnabledFor(logging.DEBUG):
            log.debug("client event", extra={"client": client, "event": type(event).__name__})
        if isinstance(event, Connect):
            self._run(reg.on_connect(event.client, event.username, event.protocol,
                                     event.clean_start, event.session_expiry,
                                     event.session_present, now,
                                     event.accepted_ms or event.t_ms))
        elif isinstance(event, Subscribe):
            self._run(reg.on_subscribe(event.client, event.filter, event.qos, now,
                                       event.options, event.subscription_id))
        elif isinstance(event, Unsubscribe):
            self._run(reg.on_unsubscribe(event.client, event.filter, now))
        elif isinstance(event, Disconnect):
            self._run(reg.on_disconnect(event.client, event.taken_over, event.session_kept,
                                        event.session_expiry, now, event.t_ms))
        elif isinstance(event, SessionExpired):
            self._run(reg.on_session_expired(event.client, now))
        elif isinstance(event, ConnectRejected):
            self._run(reg.on_connect_rejected(event.client, event.reason, now))

    def on_snapshot(self, snapshot: Snapshot) -> None:
        """The plugin's snapshot after a (re)sync: what the local Mosquitto holds."""
        online = {c.client: (c.username, c.protocol, c.clean_start, c.session_expiry)
                  for c in snapshot.clients
                  if c.online and not c.client.startswith(DEFAULT_SIDECAR_ID)}
        sessions = {c.client for c in snapshot.clients
                    if not c.online and not c.client.startswith(DEFAULT_SIDECAR_ID)}
        self._run(self.registry.on_local_snapshot(online, sessions, _wall_ms()))
        self._spawn(self._open_gate(list(self._chains.values())))

    async def _open_gate(self, pending: list[asyncio.Task]) -> None:
        """Once the deny list and this node's own sessions are in place, let connects that
        resume a session in (the plugin's gate, closed at every Mosquitto start)."""
        await asyncio.gather(*pending, return_exceptions=True)
        await self._command("open_sessions")

    # ---- inputs: peers -------------------------------------------------------------------
    def on_peer_up(self, peer: str) -> None:
        for data in wire.records_frames(self.registry.snapshot(), snapshot=True):
            self._send(peer, data)
        self._up.add(peer)
        self._run(self.registry.on_peers(self._up, _wall_ms(), self._up_with(SESSION_ORDER),
                                         self._up_with(SESSION_CLAIMS)))

    def _up_with(self, capability: str) -> set[str]:
        return {p for p in self._up if capability in (self.transport.capabilities(p) or ())}

    def on_peer_down(self, peer: str) -> None:
        """`peer`'s stream went down (or it left): replicas of its sessions may take over."""
        if peer in self._up:
            self._up.discard(peer)
            self._run(self.registry.on_peers(self._up, _wall_ms()))

    def on_frame(self, peer: str, frame: peer_pb2.Frame, inbound: bool) -> None:
        kind = frame.WhichOneof("body")
        if kind == "session_records":
            records = []
            for m in frame.session_records.records:
                problem = wire.record_problem(m)
                if problem is None:
                    records.append(wire.record_from_proto(m))
                else:
                    self._refuse_record(peer, m.client, problem)
            if log.isEnabledFor(logging.DEBUG):
                for r in records:
                    log.debug("record from a peer", extra=_record_fields(peer, r))
            self._run(self.registry.on_remote(records, _wall_ms()))
        elif kind == "session_backlog":
            msg = frame.session_backlog
            if self.registry.takes_backlog(msg.client):
                self._chain(msg.client, self._receive_backlog(peer, msg, inbound))
            else:  # refused at once, never behind an operation here: a drain of this client
                # here waits for another node's answer, which may wait for this one's
                self._spawn(self._receive_backlog(peer, msg, inbound))
        elif kind == "session_sync":
            msg = frame.session_sync
            self._spawn(self._answer_sync(peer, msg.client, msg.exchange, inbound))
        elif kind == "session_synced":
            msg = frame.session_synced
            fut = self._syncs.pop((peer, msg.exchange), None)
            if fut is not None and not fut.done():
                fut.set_result(msg.ok)
        elif kind == "session_claim":
            msg = frame.session_claim
            self._run(self.registry.on_claim(msg.client, peer, msg.hlc, msg.lasts_ms,
                                             msg.withdrawn, _wall_ms(), msg.renews))
        elif kind == "session_claimed":
            msg = frame.session_claimed
            self._run(self.registry.on_claimed(msg.client, peer, msg.hlc, msg.granted,
                                               _wall_ms()))
        elif kind == "session_backlog_ack":
            msg = frame.session_backlog_ack
            fut = self._backlog_acks.pop((msg.client, msg.exchange), None)
            if fut is not None and not fut.done():
                fut.set_result(msg.ok)

    def _refuse_record(self, peer: str, client: str, problem: str) -> None:
        """A peer's record no Mosquitto can hold is dropped, counted, and logged now and then
        (a peer that keeps sending it must not flood the log)."""
        self.counters["records_refused"] += 1
        now = time.monotonic()
        if now - self._refused_logged >= REFUSED_LOG_EVERY:
            self._refused_logged = now
            log.warning("a peer sent a session record no Mosquitto can hold (dropped; check "
                        "that peer's version and its clients)",
                        extra={"peer": peer, "client": client[:128], "problem": problem,
                               "refused_so_far": self.counters["records_refused"]})

    # ---- actions -------------------------------------------------------------------------
    def _run(self, actions: list) -> None:
        publish = []
        answers: list[Claimed] = []  # sent after every record (below)
        denies: list[str] = []  # nothing pending for them: one command for all, at the end
        batched: set[str] = set()
        for action in actions:
            if not isinstance(action, Publish) and log.isEnabledFor(logging.DEBUG):
                log.debug("session action", extra=_described(action))
            client = getattr(action, "client", None) or getattr(
                getattr(action, "record", None), "client", None)
            if client in batched and not isinstance(action, Publish):
                self._deny_all(denies)  # its later operation goes after the deny
                denies, batched = [], set()
            if isinstance(action, Publish):
                publish.append(action.record)
            elif isinstance(action, Deny) and action.client not in self._chains:
                denies.append(action.client)
                batched.add(action.client)
            elif isinstance(action, Kick):
                self._chain(action.client, self._command(
                    "kick", client=action.client, with_will=action.with_will))
            elif isinstance(action, Deny):
                self._chain(action.client, self._command("deny", client=action.client,
                                                         mode="session"))
            elif isinstance(action, Admit):
                self._chain(action.client, self._command("admit", client=action.client))
            elif isinstance(action, Hold):
                extra: dict[str, Any] = {"ring": True} if action.ring else {}
                if action.live:
                    extra["live"] = True
                    if self._cuts_with(action.source):  # arms with its cut (cuts.py)
                        extra["cut"] = True
                        self.cuts.arriving[action.client] = action.source
                if action.since_ms is not None:
                    extra["since_ms"] = action.since_ms
                if not action.on and action.since_ms is None:
                    extra.update(self.cuts.release(action.client))
                self._chain(action.client, self._command("hold", client=action.client,
                                                         on=action.on, **extra))
            elif isinstance(action, Materialize):
                self._chain(action.record.client, self._materialize(action))
            elif isinstance(action, Resubscribe):
                self._chain(action.client, self._resubscribe(action))
            elif isinstance(action, Drain):
                self._chain(action.client, self._drain(action))
            elif isinstance(action, Discard):
                self._chain(action.client, self._discard(action))
            elif isinstance(action, Forget):
                self.store.forget(action.clients)
            elif isinstance(action, Claim):
                data = wire.claim_frame(action.client, action.hlc, CLAIM_MS, action.withdrawn,
                                        action.renews)
                for peer in action.peers:
                    self._send(peer, data)
            elif isinstance(action, Claimed):
                answers.append(action)
            else:  # pragma: no cover - a new action type must be wired here
                raise TypeError(f"unhandled action {action!r}")
        for record in publish:
            self._publish_soon(record)
        self._deny_all(denies)
        for answer in answers:
            # on the stream the records go on, after this node's record of the client: the
            # claimant knows every connect before it admits (claims.py)
            if answer.client in self._unpublished:
                self._publish(answer.client)
            data = wire.claimed_frame(answer.client, answer.hlc, answer.granted)
            if not self._send(answer.peer, data):  # (only its stream to us is up)
                self._send(answer.peer, data, reply=True)

    def _deny_all(self, clients: list[str]) -> None:
        if len(clients) == 1:
            self._chain(clients[0], self._command("deny", client=clients[0], mode="session"))
        elif clients:
            self._chain_all(clients, self._command("deny", clients=clients, mode="session"))

    def _publish_soon(self, record: SessionRecord) -> None:
        """Store and send `record` shortly: a client's changes within the delay go as one
        record (the latest). The delay grows with its subscriptions (2 ms, and 1 ms per 20
        more, at most 1 s), so a client subscribing to thousands of filters costs a few
        whole-record sends, not one per filter."""
        first = record.client not in self._unpublished
        self._unpublished[record.client] = record
        if first:
            delay = min(1.0, 0.002 + len(record.subscriptions) / 20_000)
            asyncio.get_running_loop().call_later(delay, self._publish, record.client)

    def _publish(self, client: str) -> None:
        record = self._unpublished.pop(client, None)
        if record is None or self._stopped:
            return
        self.store.save([record])
        frames = list(wire.records_frames([record]))
        for peer in self.peers():
            for data in frames:
                self._send(peer, data)

    def _send(self, peer: str, data: bytes, reply: bool = False) -> bool:
        try:
            sent = self.transport.reply(peer, data) if reply else self.transport.send(peer, data)
        except FrameTooLarge as exc:  # e.g. a backlog holding a message above the limit
            self.counters["frames_too_large"] += 1
            log.error("a session frame was not sent: %s", exc, extra={"peer": peer})
            return False
        if sent:
            self.counters["frames_out"] += 1
        return bool(sent)

    def _chain_all(self, clients: list[str], coro: Awaitable[None]) -> None:
        """Run `coro` (an operation on every one of `clients`, none of which has one pending)
        and have their later operations wait for it."""
        task = asyncio.get_running_loop().create_task(coro)
        for client in clients:
            self._chains[client] = task
            task.add_done_callback(lambda t, c=client: self._chains.get(c) is t
                                   and self._chains.pop(c, None))

    def _chain(self, client: str, coro: Awaitable[None]) -> None:
        """Run `coro` after every earlier operation of `client`."""
        before = self._chains.get(client)

        async def run() -> None:
            if before is not None:
                await asyncio.gather(before, return_exceptions=True)
            await coro

        task = asyncio.get_running_loop().create_task(run())
        self._chains[client] = task
        task.add_done_callback(lambda t: self._chains.get(client) is t
                               and self._chains.pop(client, None))

    async def _command(self, cmd: str, **fields: Any) -> None:
        try:
            await self.request(cmd, **fields)
        except Exception as exc:  # the plugin refused, or the link is down (it re-syncs)
            self.counters["commands_failed"] += 1
            log.info("session command failed", extra={"cmd": cmd, "error": str(exc),
                                                      "client": fields.get("client")})

    async def _materialize(self, action: Materialize) -> None:
        record = action.record
        started = time.monotonic()
        try:
            # a replica never expires by itself: the registry deletes it at the session's
            # cluster-wide expiry (its own clock would start at its making)
            if action.replica:
                async with self._background:
                    await self.shadows.materialize(
                        record.client, replica_subscriptions(record.subscriptions), None)
            else:
                await self.shadows.materialize(record.client, record.subscriptions,
                                               record.expiry)
        except Exception as exc:
            log.warning("making a session here failed: %s", exc,
                        extra={"client": record.client})
            self._run(self.registry.on_materialized(record.client, False, _wall_ms()))
            return
        if not action.replica:  # a client is waiting for this one
            took = time.monotonic() - started
            self._handover_sum += took
            self._handover[next((i for i, le in enumerate(HANDOVER_BUCKETS) if took <= le),
                                len(HANDOVER_BUCKETS))] += 1
        self._run(self.registry.on_materialized(record.client, True, _wall_ms()))

    async def _resubscribe(self, action: Resubscribe) -> None:
        try:
            async with self._background:
                await self.shadows.update(action.client, action.add, action.remove)
        except Exception as exc:
            log.warning("changing the subscriptions of a copy here failed: %s", exc,
                        extra={"client": action.client})
            self._run(self.registry.on_materialized(action.client, False, _wall_ms()))
            return
        self._run(self.registry.on_materialized(action.client, True, _wall_ms()))

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._others.add(task)
        task.add_done_callback(self._others.discard)

    async def _answer_sync(self, peer: str, client: str, exchange: int, inbound: bool) -> None:
        record = self.registry.records.get(client)
        if record is not None and record.handed_off and record.owner == self.node_id:
            # the copy here queues once what the hand-off's record started is done (its hold
            # goes off, or it is made): only then may the old owner ask the other peers
            pending = self._chains.get(client)
            if pending is not None:
                await asyncio.wait({pending}, timeout=HANDOFF_SETTLE_WAIT)
        ok = await self.barrier(peer, SYNC_TIMEOUT)
        self._send(peer, wire.synced_frame(client, exchange, ok), reply=inbound)

    async def _sync(self, client: str, first: str | None = None) -> None:
        """Every peer's barrier: what each routed here until now is in our Mosquitto.
        `first` (a peer) is asked alone before the others."""
        peers = list(self.peers())
        if first in peers:
            peers.remove(first)
            await self._sync_with(client, [first])
        await self._sync_with(client, peers)

    async def _sync_with(self, client: str, peers: list[str]) -> None:
        loop = asyncio.get_running_loop()
        waits = []
        for peer in peers:
            exchange = next(self._exchanges)
            fut = loop.create_future()
            if self._send(peer, wire.sync_frame(client, exchange)):
                self._syncs[(peer, exchange)] = fut
                waits.append((peer, exchange, fut))
        for peer, exchange, fut in waits:
            deadline = loop.time() + SYNC_TIMEOUT + 1.0
            ok = False
            try:
                while not ok:
                    try:
                        ok = await asyncio.wait_for(asyncio.shield(fut), 0.5)
                        break
                    except TimeoutError:
                        if peer not in self._up or loop.time() > deadline:
                            break
            finally:
                self._syncs.pop((peer, exchange), None)
            if not ok:
                self.counters["sync_timeouts"] += 1
                log.warning("a peer did not confirm the barrier for a moving session (its "
                            "stream went down, or it is slower than %.0f s); going on",
                            SYNC_TIMEOUT, extra={"peer": peer, "client": client})

    def _cuts_with(self, peer: str) -> bool:
        """Whether a move between this node and `peer` runs in cut mode (cuts.py)."""
        return self.cuts_on and SESSION_CUTS in (self.transport.capabilities(peer) or ())

    async def _drain(self, action: Drain) -> None:
        ok = False
        client = action.client
        cut_mode = self._cuts_with(action.owner)
        # a hand-off's record (if not sent yet) goes ahead of the barrier: its target's copy
        # queues from it on (sent after it, the other peers' barriers could pass first, and
        # what they routed next was refused by both copies: a rolling restart lost 1 message)
        self._publish(client)
        await self._sync(client, first=action.owner if action.handed_off else None)
        cuts = OldCopyCuts()
        if cut_mode:
            # a chain (its client left before the old queue came here): what that queue's
            # copy had goes out of the live ring here, and out of what the onward copy kept
            upstream = self.cuts.upstream(client)
            seq = await self.cuts.own_cut(client, lambda: self._command(
                "hold", client=client, on=True, cut=True, **upstream.hold_fields()))
            own = (origin_of(self.node_id, self.incarnation), seq) if seq is not None else None
            granted = tuple(await self._granted(client)) + upstream.granted
            cuts = dataclasses.replace(upstream, cut=own, granted=granted)
        else:
            await self._command("hold", client=client, on=True)
        unreleased = await self._unreleased(action.client)
        record = self.registry.records.get(action.client)
        if self._resumed_here(client):  # (the hold goes off after this)
            self.counters["drains_abandoned"] += 1
            # the node it was for waits for the end of a hand-over (a live hold): it ends
            # empty, and that node hands what it kept back here, to the newer connect
            await self._hand_over(client, action.owner, [])
            self._run(self.registry.on_abandoned(client, _wall_ms()))
            return
        try:
            shadow = await self.shadows.drain(
                action.client, action.subscriptions, record.subscriptions if record else None,
                frozenset(u.packet_id for u in unreleased))
        except Exception as exc:
            log.warning("draining a session failed: %s", exc, extra={"client": action.client})
        else:
            log.debug("session collected", extra={"client": action.client,
                                                   "messages": len(shadow.messages)})
            taken = 0
            try:
                ok, taken = await self._hand_over_to_newest(
                    action, [q for _, q in shadow.queue()], unreleased, cuts)
            finally:
                await self.shadows.finish(shadow, ok, taken)
        log.debug("session drained", extra={"client": action.client, "ok": ok})
        if ok:
            self.cuts.forget_upstream(client)  # (a failed drain's retry sends it again)
        self._run(self.registry.on_drained(action.client, ok, _wall_ms()))

    async def _hand_over_to_newest(self, action: Drain, queued: list,
                                   unreleased: list[Unreleased], cuts: OldCopyCuts
                                   ) -> tuple[bool, int]:
        """Hand the drained queue to `action.owner`; refused there because its client moved
        on meanwhile (a newer connect elsewhere), to the node of that connect instead (the
        client is there: a session given back here would wait for a drain). Returns as
        `_hand_over` does, for the last node tried."""
        client, owner = action.client, action.owner
        for _ in range(HANDOVER_RETARGETS + 1):
            ok, taken = await self._hand_over(client, owner, queued, unreleased, cuts)
            record = self.registry.records.get(client)
            if ok or record is None or record.owner in (self.node_id, owner) \
                    or record.owner not in self.peers():
                return ok, taken
            owner = record.owner
            self.counters["handovers_retargeted"] += 1
        return False, 0

    async def _granted(self, client: str) -> list[tuple[str, int]]:
        """The identities of the peers' messages this old copy queued (plugin `granted`)."""
        try:
            reply = await self.request("granted", timeout=5.0, client=client)
            return [(str(o), int(s)) for o, s in reply.fields.get("granted", [])]
        except Exception as exc:  # noqa: BLE001 - the new copy then skips fewer: duplicates
            log.info("asking the plugin what a moving session queued failed: %s", exc,
                     extra={"client": client})
            return []

    async def _unreleased(self, client: str) -> list[Unreleased]:
        """QoS 2 messages the client left here between PUBREC and PUBREL (plugin `unreleased`;
        none from an older plugin)."""
        try:
            reply = await self.request("unreleased", timeout=5.0, client=client)
            return from_plugin(reply.fields)
        except Exception as exc:  # noqa: BLE001 - the queue moves without them, as before
            log.debug("asking the plugin for unreleased messages failed: %s", exc,
                      extra={"client": client})
            return []

    async def _forget_unreleased(self, client: str, packet_ids: list[int]) -> None:
        try:
            await self.request("unreleased", timeout=5.0, client=client, forget=packet_ids)
        except Exception as exc:  # noqa: BLE001 - the session's deletion forgets them too
            log.debug("forgetting released messages failed: %s", exc, extra={"client": client})

    async def _hand_over(self, client: str, owner: str, queued: list,
                         unreleased: list[Unreleased] | tuple = (),
                         cuts: OldCopyCuts | None = None) -> tuple[bool, int]:
        """Send a drained session's queue to its new owner, in frames of at most
        BACKLOG_FRAME_BYTES, each delivered there (and acknowledged) before the next; the
        first frame also carries the messages waiting for their release, the last one says
        so (`last`, to an owner with `session-order`: it keeps what reaches the client
        meanwhile until then; sent even without messages). Returns whether all went, and
        how many of `queued` the owner took (the first, in order)."""
        ordered = SESSION_ORDER in (self.transport.capabilities(owner) or ())
        if not queued and not unreleased and not ordered:
            return True, 0
        hlc = self.clock.now(_wall_ms()).pack()

        def envelope(m: Any) -> Envelope:
            return Envelope(self.node_id, self.incarnation, next(self._seq), hlc, m.topic,
                            m.payload, m.qos, False, m.properties,
                            subscription_ids=m.subscription_ids)
        envs = [envelope(q) for q in queued]
        first = [(u, envelope(u)) for u in unreleased]
        ok, taken = True, 0
        parts = list(_batches(envs, BACKLOG_FRAME_MESSAGES, BACKLOG_FRAME_BYTES)) if envs \
            else [[]]
        for i, part in enumerate(parts):
            last = ordered and i == len(parts) - 1
            ok = await self._hand_over_part(client, owner, part, first, last,
                                            cuts if last else None)
            if ok and first:  # the new owner has them: a retried drain must not send them again
                await self._forget_unreleased(client, [u.packet_id for u, _ in first])
            first = []
            if not ok:
                break
            taken += len(part)
        if ok and unreleased:
            self.counters["unreleased_sent"] += len(unreleased)
        self.counters["backlog_sent" if ok else "backlog_failed"] += len(envs)
        log.debug("session messages handed over", extra={
            "client": client, "owner": owner, "messages": len(envs), "ok": ok})
        return ok, taken

    async def _hand_over_part(self, client: str, owner: str, envs: list[Envelope],
                              unreleased: list[tuple[Unreleased, Envelope]],
                              last: bool = False, cuts: OldCopyCuts | None = None) -> bool:
        exchange = next(self._exchanges)
        fut = asyncio.get_running_loop().create_future()
        self._backlog_acks[(client, exchange)] = fut
        try:
            if not self._send(owner, wire.backlog_frame(client, exchange, envs, unreleased,
                                                        last, cuts)):
                raise ConnectionError(f"no stream to {owner}")
            self.counters["backlog_frames"] += 1
            return bool(await asyncio.wait_for(
                fut, BACKLOG_TIMEOUT + len(envs) * BACKLOG_TIMEOUT_PER_MESSAGE))
        except Exception as exc:
            log.warning("handing a session's messages over failed: %s", exc,
                        extra={"client": client, "owner": owner, "messages": len(envs)})
            return False
        finally:
            self._backlog_acks.pop((client, exchange), None)

    async def _receive_backlog(self, peer: str, msg: peer_pb2.SessionBacklog,
                               inbound: bool) -> None:
        """Deliver a moving session's queue into its session here, in order, in batches
        (plugin `deliver_batch`: one command per DELIVER_BATCH messages)."""
        envs = wire.backlog_from(msg)
        ok = self.registry.takes_backlog(msg.client)
        log.debug("session messages arrived", extra={
            "client": msg.client, "peer": peer, "messages": len(envs), "taken": ok,
            "unreleased": len(msg.unreleased)})
        if not ok:  # the sender keeps them and retries towards the owner it learns of
            self.counters["backlog_refused"] += len(envs)
        elif msg.unreleased:
            await self._release(msg.client, wire.unreleased_from(msg))
        for batch in _batches(envs) if ok else ():
            try:
                await self.request("deliver_batch", timeout=DELIVER_BATCH_TIMEOUT,
                                   client=msg.client, messages=[
                                       deliver_item(e.topic, e.payload, e.qos, e.properties,
                                                    e.subscription_ids)
                                       for e in batch])
            except Exception as exc:
                log.warning("delivering a session's messages failed: %s", exc,
                            extra={"client": msg.client})
                ok = False
                break
            self.counters["backlog_received"] += len(batch)
        if ok and msg.last:  # the whole queue is in: what reached the client meanwhile follows
            self.cuts.on_last_backlog(msg)  # ...but for what the old copy had
            self._run(self.registry.on_backlog_in(msg.client, _wall_ms()))
        self._send(peer, wire.backlog_ack_frame(msg.client, msg.exchange, ok), reply=inbound)

    async def _release(self, client: str, messages: list[Unreleased]) -> None:
        """Send them to the client here under their own packet ids (plugin `release`); one that
        cannot go is lost, as before this existed (logged)."""
        checked = [(u, problem(u)) for u in messages]
        good = [u for u, p in checked if p is None]
        problems = [p for _, p in checked if p is not None]
        if problems:
            self.counters["unreleased_refused"] += len(problems)
            log.warning("a peer sent unreleased QoS 2 messages that cannot be released: %s",
                        problems[0], extra={"client": client})
        if not good:
            return
        try:
            await self.request("release", timeout=DELIVER_BATCH_TIMEOUT, client=client,
                               messages=to_plugin(good))
            self.counters["unreleased_received"] += len(good)
        except Exception as exc:  # noqa: BLE001 - an older plugin, or the link is down
            self.counters["unreleased_refused"] += len(good)
            log.warning("releasing QoS 2 messages to a moved client failed: %s", exc,
                        extra={"client": client, "messages": len(good)})

    def cut_applies(self, client: str) -> bool:
        """Whether a peer's cut for `client` goes to the copy here (`SessionRegistry`)."""
        return self.registry.cut_applies(client)

    def _resumed_here(self, client: str) -> bool:
        """Whether `client` connected here since an operation on its copy was decided (before
        the deny that came with it took effect: a quick reconnect, e.g. through a round-robin
        front): the copy is its live session again, and draining or deleting it would lose
        what it holds."""
        record = self.registry.records.get(client)
        return record is not None and record.owner == self.node_id and not record.deleted

    async def _discard_unless_resumed(self, client: str) -> bool:
        """Delete `client`'s copy here, unless its client resumed it meanwhile (False)."""
        if self._resumed_here(client):
            return False
        await self.shadows.discard(client)
        return True

    async def _discard(self, action: Discard) -> None:
        client = action.client
        try:
            if action.urgent:
                deleted = await self._discard_unless_resumed(client)
            else:
                async with self._background:
                    deleted = await self._discard_unless_resumed(client)
            if not deleted:
                self.counters["discards_abandoned"] += 1
                self._run(self.registry.on_abandoned(client, _wall_ms()))
                return
        except Exception as exc:
            log.warning("deleting a session failed: %s", exc, extra={"client": client})
            self._run(self.registry.on_discarded(client, False, _wall_ms()))
            return
        self._run(self.registry.on_discarded(client, True, _wall_ms()))

    async def _deliver_again(self, client: str, messages: list[Queued]) -> None:
        """Deliver a failed drain's QoS 2 messages into their session here again, in order."""
        for batch in _batches(messages):
            await self.request("deliver_batch", timeout=DELIVER_BATCH_TIMEOUT, client=client,
                               messages=[deliver_item(q.topic, q.payload, q.qos, q.properties,
                                                      q.subscription_ids) for q in batch])

    async def _set_options(self, client: str, subscriptions: dict[str, int]) -> None:
        try:
            await self.request("sub_options", client=client, subscriptions=subscriptions)
        except CommandFailed as exc:
            if exc.code != "unreadable":  # (then the options are unknown here, as reported)
                raise ShadowError(f"subscription options not set: {exc}") from exc

    async def _deliver_marker(self, client: str, topic: str, payload: bytes) -> None:
        # QoS 2 like the slowest queued message: paho hands a QoS 2 message over at its
        # PUBREL, so a QoS 1 marker could overtake QoS 2 messages queued before it
        await self.request("deliver", client=client, topic=topic, payload=payload, qos=2)

    # ---- drain (issue 20) -----------------------------------------------------------------
    def set_unavailable(self, nodes: frozenset[str]) -> None:
        """Nodes that hold no replicas and take no hand-off (`sidecar.drain`)."""
        self._run(self.registry.set_unavailable(nodes, _wall_ms()))

    def hand_off_all(self) -> None:
        """This node drains: its offline sessions go to other nodes (`SessionRegistry`)."""
        self._run(self.registry.hand_off_all(_wall_ms()))

    def drain_progress(self) -> dict[str, int]:
        """Sessions still tied to this node, and session frames in flight to peers."""
        return {**self.registry.drain_progress(_wall_ms()),
                "session_records_unsent": len(self._unpublished),
                "session_messages": self.queued_here or 0}

    # ---- views ---------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """Counts (and, up to DETAIL_LIMIT records, the client ids with a live session)."""
        at, counts = self._counts
        if time.monotonic() - at > 1.0:  # a pass over every record: at most once a second
            counts = self.registry.status(_wall_ms())
            self._counts = (time.monotonic(), counts)
        out: dict[str, Any] = {**counts, **self.registry.counters, **self.counters,
                               **self.cuts.counters, **self.shadows.counters,
                               "queued_here": self.queued_here}
        records = self.registry.records
        if len(records) <= DETAIL_LIMIT:
            out["clients"] = sorted(c for c, r in records.items() if not r.deleted)
        return out

    async def queued(self, clients: list[str] | None = None) -> dict[str, int] | None:
        """Messages this node's Mosquitto queued for these offline sessions (plugin `queued`;
        all that have some without `clients`); None when the plugin cannot tell (an older
        plugin, or the link is down)."""
        try:
            reply = await self.request("queued", timeout=2.0,
                                       **({} if clients is None else {"clients": clients}))
        except Exception as exc:  # noqa: BLE001 - shown as unknown, never fails the answer
            log.debug("asking the plugin for queued counts failed: %s", exc)
            return None
        counts = reply.fields.get("queued")
        if not isinstance(counts, dict):
            return None
        return {str(k): int(v) for k, v in counts.items() if isinstance(v, (int, float))}

    def _here(self, client: str) -> str | None:
        """What this node's Mosquitto holds for `client`: online, session, replica (held or
        queueing), shadow, or nothing."""
        reg = self.registry
        if client in reg.replica:
            return "replica-queueing" if client in reg.queueing else "replica-held"
        return reg.presence.get(client)

    def handover_histogram(self) -> tuple[list[tuple[str, int]], float]:
        """Cumulative (le, count) buckets of the time to make a moving session, and their sum
        (Prometheus histogram)."""
        out, total = [], 0
        for le, n in zip((*map(str, HANDOVER_BUCKETS), "+Inf"), self._handover, strict=True):
            total += n
            out.append((le, total))
        return out, self._handover_sum

    def sessions(self, client: str | None = None) -> list[dict[str, Any]]:
        """Records for `ctl sessions` (all, or one client id)."""
        now = _wall_ms()
        out = []
        for r in self.registry.records.values():
            if (client is not None and r.client != client) or r.deleted:
                continue
            out.append({"client": r.client, "owner": r.owner, "online": r.online,
                        "replicas": self.registry.replica_nodes(r.client, r.owner)
                        if r.persistent else [],
                        "persistent": r.persistent, "deleted": r.deleted,
                        "expiry": r.expiry, "protocol": r.protocol,
                        "expires_in_s": None if r.expires_at_ms() is None
                        else max(0, (r.expires_at_ms() - now) // 1000),
                        "subscriptions": dict(r.subscriptions),
                        "here": self._here(r.client)})
        return out
