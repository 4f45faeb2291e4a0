"""`RetainedService`: the retained cores wired to I/O (adapter).

Moves values between the cores (`Replicator`, `AntiEntropy`) and the node's adapters: the
peer transport (frames), the forwarding client (re-injections with retain=1, confirmed by
PUBACK/PUBCOMP, or for QoS 0 by a QoS 1 barrier publish behind them), the control link (reading
Mosquitto's retained messages back) and the SQLite store. It decides nothing itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from sidecar._proto import peer_pb2
from sidecar.config import TOMBSTONE_GRACE
from sidecar.hlc import HybridClock
from sidecar.local.events import RetainedSeen
from sidecar.local.forward_client import from_paho_properties
from sidecar.peering.transport import FrameTooLarge
from sidecar.retained import wire
from sidecar.retained.antientropy import (
    AntiEntropy,
    ReplyEntries,
    ReplyVersions,
    SendDigest,
    SendRequest,
)
from sidecar.retained.index import RetainedIndex
from sidecar.retained.replicator import (
    Broadcast,
    LocalWrite,
    Persist,
    ReadBack,
    ReadValue,
    Reinject,
    Replicator,
    RetryRead,
    invalid,
)
from sidecar.retained.sqlite import SqliteRetainedStore

log = logging.getLogger("mqfed.retained")

READ_BATCH = 200  # with the plugin's event window (500), below a stock max_queued_messages (1000)
READ_TIMEOUT = 5.0  # above the link's own (sidecar.local.link.READ_TIMEOUT), which repairs
CONFIRM_TIMEOUT = 10.0  # a re-injection unconfirmed this long (lost with a connection) counts
TICK = 0.2
PRIVATE_PREFIX = "$mqfed/"

ReadRetained = Callable[[list[str]], Awaitable[Mapping[str, ReadValue]]]


def link_reader(link: Any) -> ReadRetained:
    """`read_retained` over the control link (`LocalLink.read_retained`)."""
    async def read(topics: list[str]) -> dict[str, ReadValue]:
        out: dict[str, ReadValue] = {}
        for topic, msg in (await link.read_retained(topics)).items():
            props, _ = from_paho_properties(getattr(msg, "properties", None))
            out[topic] = ReadValue(msg.payload, props, props.message_expiry)
        return out
    return read


def _wall_ms() -> int:
    return int(time.time() * 1000)


class RetainedService:
    """Retained replication of one node; `RoutingService` forwards it frames and events."""

    def __init__(self, node_id: str, clock: HybridClock, run_dir: Path, transport: Any,
                 forward_client: Any, peers: Callable[[], Iterable[str]],
                 read_retained: ReadRetained | None, grace: float = TOMBSTONE_GRACE) -> None:
        self.transport = transport
        self.forward_client = forward_client
        self.peers = peers
        self.read_retained = read_retained
        self.store = SqliteRetainedStore(run_dir / "retained.sqlite")
        self.index = RetainedIndex(self.store.load())
        self.replicator = Replicator(node_id, clock, self.index)
        self.ae = AntiEntropy(self.index)
        self.grace = grace
        self._purged_at = 0.0
        self._to_read: dict[str, None] = {}
        self._reader: asyncio.Task | None = None
        self._mids: dict[int, int] = {}  # forwarding client ticket -> re-injection token
        self._barriers: dict[int, list[int]] = {}  # barrier ticket -> QoS 0 tokens behind it
        self._qos0: list[int] = []
        self._sent_at: dict[int, float] = {}  # token -> when re-injected
        self._task: asyncio.Task | None = None
        self._stopped = False
        self._counts: tuple[float, dict[str, int]] = (0.0, {})
        self.counters = {"reads": 0, "read_topics": 0, "read_found": 0, "read_failures": 0,
                         "unconfirmed_timeouts": 0, "frames_out": 0, "ae_received": 0,
                         "purged": 0, "too_large": 0, "errors": 0}
        self.max_frame = getattr(transport, "max_message_bytes", wire.MAX_FRAME)

    # ---- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._ticker())

    async def stop(self) -> None:
        self._stopped = True
        for task in (self._task, self._reader):
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in (self._task, self._reader) if t),
                             return_exceptions=True)
        self.store.close()

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(TICK)
            try:
                self._tick()
            except Exception:  # one bad entry must not stop replication for good
                self.counters["errors"] += 1
                log.exception("retained replication tick failed: this is a bug")

    def _tick(self) -> None:
        now = time.monotonic()
        stale = [t for t, at in self._sent_at.items() if now - at > CONFIRM_TIMEOUT]
        if stale:
            self.counters["unconfirmed_timeouts"] += len(stale)
            self._confirm(stale)
        self._run(self.ae.poll(_wall_ms()))
        if now - self._purged_at >= min(60.0, self.grace / 4):
            self._purged_at = now
            self._purge()

    def _purge(self) -> None:
        """Forget tombstones and expired messages older than the grace period."""
        horizon = _wall_ms() - int(self.grace * 1000)
        gone = self.index.purge(horizon, self.replicator.busy)
        if gone:
            self.store.forget(gone)
            self.counters["purged"] += len(gone)
            log.info("forgot old tombstones and expired retained messages",
                     extra={"entries": len(gone)})

    # ---- inputs --------------------------------------------------------------------------
    def on_local(self, event: RetainedSeen) -> None:
        if event.topic.startswith(PRIVATE_PREFIX):
            return  # the link's own sentinel (only a client tampering with it gets here)
        self._run(self.replicator.on_local(
            [LocalWrite(event.topic, event.payload, event.qos, event.properties)], _wall_ms()))

    def on_broker_reset(self) -> None:
        """The local Mosquitto has a new, empty retained store: repopulate it."""
        self._mids.clear()
        self._barriers.clear()
        self._qos0.clear()
        self._sent_at.clear()
        actions = self.replicator.on_broker_reset(_wall_ms())
        log.info("repopulating the local retained store", extra={"entries": len(actions)})
        self._run(actions)

    def on_peer_up(self, peer: str) -> None:
        self.ae.on_peer_up(peer)
        self._run(self.ae.poll(_wall_ms()))

    def on_peer_down(self, peer: str) -> None:
        self.ae.on_peer_down(peer)

    def on_published(self, mids: list[int]) -> list[int]:
        """Confirm our re-injections among `mids`; return the others."""
        rest: list[int] = []
        tokens: list[int] = []
        for mid in mids:
            token = self._mids.pop(mid, None)
            barrier = self._barriers.pop(mid, None)
            if token is not None:
                tokens.append(token)
            elif barrier is not None:
                tokens += barrier
            else:
                rest.append(mid)
        if tokens:
            self._confirm(tokens)
        return rest

    def on_frame(self, peer: str, frame: peer_pb2.Frame, inbound: bool) -> None:
        kind = frame.WhichOneof("body")
        now = _wall_ms()
        if kind == "retained_entries":
            msg = frame.retained_entries
            entries = [wire.entry_from_proto(m, now) for m in msg.entries]
            if msg.exchange:
                self.counters["ae_received"] += len(entries)
                for entry in entries:
                    if invalid(entry) is not None:
                        self.ae.on_refused(entry.topic, entry.version)
            self._run(self.replicator.on_remote(entries, now, live=msg.exchange == 0))
            if msg.exchange and msg.last:
                self.ae.on_entries_done(peer, msg.exchange, now)
                self._run(self.ae.poll(now))
        elif kind == "retained_digest":
            msg = frame.retained_digest
            self._run(self.ae.on_digest(peer, msg.exchange, msg.buckets, msg.counts), inbound)
        elif kind == "retained_versions":
            msg = frame.retained_versions
            self._run(self.ae.on_versions(peer, msg.exchange, msg.buckets,
                                          wire.versions_from(msg), now))
            self._run(self.ae.poll(now))
        elif kind == "retained_request":
            msg = frame.retained_request
            self._run(self.ae.on_request(peer, msg.exchange, msg.topics), inbound)

    # ---- actions -------------------------------------------------------------------------
    def _run(self, actions: list, inbound: bool = True) -> None:
        if self._stopped:
            return
        now = _wall_ms()
        for action in actions:
            if isinstance(action, Persist):
                self.store.save(action.entries)
            elif isinstance(action, Reinject):
                self._reinject(action, now)
            elif isinstance(action, RetryRead):
                asyncio.get_running_loop().call_later(
                    action.delay, self._retry, action.topics)
            elif isinstance(action, ReadBack):
                self._to_read.update(dict.fromkeys(action.topics))
                if self._reader is None or self._reader.done():
                    self._reader = asyncio.get_running_loop().create_task(self._read_loop())
            elif isinstance(action, Broadcast):
                frames = list(wire.entries_frames(action.entries, now, max_frame=self.max_frame,
                                                  too_large=self._too_large))
                for peer in self.peers():
                    for data in frames:
                        self._send(peer, data)
            elif isinstance(action, SendDigest):
                self._send(action.peer, wire.digest_frame(action.exchange, action.digests,
                                                          action.counts))
            elif isinstance(action, SendRequest):
                self._send(action.peer, wire.request_frame(action.exchange, action.topics))
            elif isinstance(action, ReplyEntries):
                for data in wire.entries_frames(action.entries, now, action.exchange,
                                                action.last, self.max_frame, self._too_large):
                    self._send(action.peer, data, reply=inbound)
            elif isinstance(action, ReplyVersions):
                self._send(action.peer, wire.versions_frame(action.exchange, action.buckets,
                                                            action.versions), reply=inbound)
            else:  # pragma: no cover - a new action type must be wired here
                raise TypeError(f"unhandled action {action!r}")
        if self._qos0:
            self._barriers[self.forward_client.barrier()] = self._qos0
            self._qos0 = []

    def _too_large(self, entry: Any, size: int) -> None:
        self.counters["too_large"] += 1
        log.error("a retained message is larger than a peer frame may be: peers get it as"
                  " deleted (set Mosquitto's message_size_limit below the limit to refuse such"
                  " publishes at the edge)", extra={"topic": entry.topic, "bytes": size,
                                                    "limit": self.max_frame})

    def _send(self, peer: str, data: bytes, reply: bool = False) -> None:
        try:
            sent = self.transport.reply(peer, data) if reply else self.transport.send(peer, data)
        except FrameTooLarge as exc:  # frames are sized to fit: a bug, but never fatal
            self.counters["too_large"] += 1
            log.error("a retained frame was not sent: %s", exc, extra={"peer": peer})
            return
        if sent:
            self.counters["frames_out"] += 1

    def _reinject(self, action: Reinject, now_ms: int) -> None:
        entry = action.entry
        live = entry.live(now_ms)
        props = replace(entry.properties, message_expiry=entry.remaining_expiry(now_ms)) \
            if live else entry.properties
        mid = self.forward_client.publish(entry.topic, entry.payload if live else b"", entry.qos,
                               props, retain=True)
        self._sent_at[action.token] = time.monotonic()
        if entry.qos:
            self._mids[mid] = action.token
        else:
            self._qos0.append(action.token)

    def _retry(self, topics: tuple[str, ...]) -> None:
        self._run(self.replicator.on_retry(topics))

    def _confirm(self, tokens: list[int]) -> None:
        for token in tokens:
            self._sent_at.pop(token, None)
        self._run(self.replicator.on_reinjected(tokens))

    async def _read_loop(self) -> None:
        """Read Mosquitto's retained messages of the waiting topics, a batch at a time."""
        while self._to_read:
            topics = list(self._to_read)[:READ_BATCH]
            for topic in topics:
                del self._to_read[topic]
            if self.read_retained is None:  # no control link (tests of routing alone)
                self._run(self.replicator.on_read(topics, {}, _wall_ms()))
                continue
            try:
                results = await asyncio.wait_for(self.read_retained(topics), READ_TIMEOUT)
            except Exception as exc:  # the link is down or Mosquitto restarting: retry
                self.counters["read_failures"] += 1
                log.warning("reading retained messages failed: %s", exc)
                await asyncio.sleep(0.5)
                self._run(self.replicator.on_read_failed(topics))
                continue
            self.counters["reads"] += 1
            self.counters["read_topics"] += len(topics)
            self.counters["read_found"] += len(results)
            try:
                self._run(self.replicator.on_read(topics, results, _wall_ms()))
            except Exception:  # the loop goes on with the next topics
                self.counters["errors"] += 1
                log.exception("handling retained messages read back failed: this is a bug",
                              extra={"topics": len(topics)})

    def status(self) -> dict[str, Any]:
        at, counts = self._counts
        if time.monotonic() - at > 1.0:  # a pass over every entry: at most once a second
            counts = self.index.counts(_wall_ms())
            self._counts = (time.monotonic(), counts)
        return {"digest": self.index.summary(), **counts,
                "busy_topics": self.replicator.busy_topics(), "anti_entropy": self.ae.counters,
                **self.replicator.counters, **self.counters}
