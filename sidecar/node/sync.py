"""`PluginSync`: the node's view of its Mosquitto through the plugin (adapter wiring).

Plugin events come over the control link, pass the event stream (order, gaps, re-syncs from a
snapshot) and update the subscription table; the table's interest changes and retained
publishes go to the callbacks the node gives. It also carries the plugin commands routing
needs (its small commands port): deliver to one client, probe the forwarding client, report
the overload state.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sidecar.local.event_stream import (
    Apply,
    EventStream,
    LoadSnapshot,
    RequestResume,
    RequestSnapshot,
    SendAck,
)
from sidecar.local.events import (
    CommandFailed,
    Event,
    ProtocolError,
    Reply,
    RetainedSeen,
    Snapshot,
)
from sidecar.local.forward_client import PROBE_TOPIC
from sidecar.local.link import LinkError, LocalLink
from sidecar.local.pressure import Report
from sidecar.local.protocol import sidecar_client_id
from sidecar.routing.forwarder import Envelope
from sidecar.routing.table import InterestChange, SubscriptionTable

log = logging.getLogger("mqfed.node")


class PluginSync:
    """Link, event stream and subscription table of one node."""

    def __init__(self, socket_path: Path, *,
                 on_interest: Callable[[list[InterestChange]], None],
                 on_retained: Callable[[RetainedSeen], None],
                 on_changed: Callable[[], None],
                 on_fatal: Callable[[ProtocolError], None],
                 on_event: Callable[[Event], None] = lambda event: None,
                 on_snapshot: Callable[[Snapshot], None] = lambda snapshot: None) -> None:
        self.socket_path = socket_path
        self.stream = EventStream()
        self.table = SubscriptionTable()
        self.link: LocalLink | None = None
        self.on_interest = on_interest
        self.on_retained = on_retained
        self.on_changed = on_changed  # the node's status changed (write it soon)
        self.on_fatal = on_fatal
        self.on_event = on_event  # every applied event, in order (sessions)
        self.on_snapshot = on_snapshot  # every snapshot loaded (sessions)
        self._snapshot_failures = 0
        self._tasks: set[asyncio.Task] = set()

    async def connect(self, secret: str, timeout: float) -> Snapshot:
        """Link to the plugin; returns its first snapshot (a missing plugin fails here)."""
        self.link = LocalLink(
            self.socket_path, secret, client_id=sidecar_client_id(secret),
            on_events=self._on_events,
            on_reconnect=lambda: self._run(self.stream.on_link_reconnected()),
            on_protocol_error=self.on_fatal,
        )
        await self.link.connect(timeout)
        snapshot = await self.link.snapshot(timeout=timeout)
        await self._observe(timeout)
        return snapshot

    async def _observe(self, timeout: float) -> None:
        """With the plugin's catch-up ring on (`catchup_ms`), subscribe the link's observer;
        else make sure it has none (the session may keep one from an earlier config)."""
        assert self.link is not None
        stats = await self.link.request("stats", timeout=timeout)
        if stats.fields.get("catchup"):
            self.link.observe()
        else:
            self.link.unobserve()

    def start(self, snapshot: Snapshot) -> None:
        """Apply the first snapshot and follow events from there."""
        self.stream.start()
        self._run(self.stream.on_snapshot(snapshot))

    def tick(self, now: float) -> None:
        self._run(self.stream.on_tick(now))

    @property
    def connected(self) -> bool:
        """The control link is up."""
        return self.link is not None and self.link.connected

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def close(self) -> None:
        if self.link is not None:
            self.link.close()

    # ---- events → stream → table -------------------------------------------------------
    def _on_events(self, events: list[Event]) -> None:
        now = time.monotonic()
        for event in events:
            self._run(self.stream.on_event(event, now))

    def _interest(self, changes: list[InterestChange]) -> None:
        if changes:
            self.on_interest(changes)

    def _run(self, actions: list) -> None:
        for action in actions:
            if isinstance(action, Apply):
                self.on_changed()
                self._interest(self.table.apply(action.event))
                if isinstance(action.event, RetainedSeen):
                    self.on_retained(action.event)
                self.on_event(action.event)
            elif isinstance(action, LoadSnapshot):
                self._interest(self.table.load_snapshot(action.snapshot))
                self.on_snapshot(action.snapshot)
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
            self._run(self.stream.on_snapshot_failed())
            return
        self._snapshot_failures = 0
        self._run(self.stream.on_snapshot(snapshot))
        self.on_changed()

    async def _resume(self, from_seq: int) -> None:
        assert self.link is not None
        try:
            reply = await self.link.request("resume", from_seq=from_seq, epoch=self.stream.epoch)
        except (ProtocolError, LinkError) as exc:
            log.info("resume refused, re-syncing from a snapshot", extra={"error": str(exc)})
            self._run(self.stream.on_resume_failed())
            return
        self._run(self.stream.on_resumed(reply.fields.get("epoch", "")))

    # ---- the commands port (routing's requests to the plugin) --------------------------
    async def deliver(self, client: str, env: Envelope) -> None:
        """Deliver one message to one local client (a shared subscription's pick); raises
        CommandFailed or LinkError when the plugin refuses or does not answer."""
        assert self.link is not None
        await self.link.request("deliver", client=client, topic=env.topic, payload=env.payload,
                                qos=env.qos, properties=env.properties,
                                subscription=f"$share/{env.shared_group}/{env.shared_filter}")

    def probe_forwarding(self, clients: Sequence[str]) -> None:
        """A targeted probe to each of these forwarding connections shows copies Mosquitto
        dropped at the tail of a burst (sidecar.local.midgaps)."""
        for client in clients:
            self._spawn(self._probe(client))

    async def probe_with(self, token: bytes, clients: Sequence[str]) -> None:
        """A probe carrying `token` to each forwarding connection (a barrier, see
        `RoutingService.settle_to`); raises when the plugin refuses or does not answer."""
        assert self.link is not None
        link = self.link
        await asyncio.gather(*(link.request("deliver", client=client, topic=PROBE_TOPIC,
                                            payload=token, qos=1) for client in clients))

    async def _probe(self, client: str) -> None:
        try:
            await self.probe_with(b"", [client])
        except (LinkError, CommandFailed) as exc:
            log.debug("forwarding probe failed", extra={"error": str(exc)})

    async def catchup(self, filters: tuple[tuple[str, int], ...]) -> dict[str, Any]:
        """The plugin's recent publishes these (filter, since ms) missed (`catchup`); raises
        CommandFailed or LinkError."""
        assert self.link is not None
        reply = await self.link.request("catchup", filters=[{"filter": f, "since": max(0, s)}
                                                            for f, s in filters])
        return reply.fields

    def report_pressure(self, report: Report,
                        on_reply: Callable[[dict[str, Any]], None]) -> None:
        """Tell the plugin our backlog and whether to shed publishers (sidecar.local.pressure);
        `on_reply` gets the plugin's answer."""
        self._spawn(self._pressure(report, on_reply))

    async def _pressure(self, report: Report, on_reply: Callable[[dict[str, Any]], None]) -> None:
        assert self.link is not None
        try:
            reply: Reply = await self.link.request("pressure", unacked=report.unacked,
                                                   taken=report.taken, shed_ms=report.shed_ms)
        except (LinkError, CommandFailed) as exc:
            log.debug("overload report failed", extra={"error": str(exc)})
            return
        on_reply(reply.fields)
