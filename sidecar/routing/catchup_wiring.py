"""The catch-up wiring of `RoutingService` (adapter; the decisions are `sidecar.routing.catchup`'s).

Kept apart from service.py: which peers send subscribe times, the keys an interest frame adds,
the plugin requests once the forwarding subscriptions are in effect, the replays and the held
actions going out, the status. A mixin: it uses the service's parts (`remote`, `table`,
`forwarder`, `forward_client`, `commands`, `queues`, `_run_forward`, `_schedule_flush`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from sidecar.peering.handshake import CATCH_UP, Accept
from sidecar.routing.catchup import (
    MAX_FILTERS,
    AskPlugin,
    CatchUp,
    CatchUpAction,
    RecentCopies,
    Release,
    Replay,
    missed_from_reply,
    split_missed,
)
from sidecar.routing.forwarder import QueueEnvelope, SendEnvelope
from sidecar.routing.interest import InterestAction, LocalSubscribe
from sidecar.routing.table import InterestKey

if TYPE_CHECKING:
    from sidecar.local.forward_shards import ForwardShards
    from sidecar.peering.outbound import OutboundQueue
    from sidecar.routing.forwarder import Forwarder
    from sidecar.routing.interest import RemoteInterest
    from sidecar.routing.table import SubscriptionTable

log = logging.getLogger("mqfed.routing")

IN_FLIGHT = 2
"""`catchup` commands to the plugin at a time. The asks that come meanwhile wait, and go
together in the next commands (up to `MAX_FILTERS` filters each): under a churn of new
subscriptions the commands then grow instead of multiplying (one per interest delta was ~100
a second per peer; each needs a turn of Mosquitto's loop, and with a peer's 100,000 forwarding
subscriptions held those turns are slow: hundreds timed out)."""


class CatchUpWiring:
    """Catch-up of peers' new interest, mixed into `RoutingService` (which sets these)."""

    catchup: CatchUp
    _catchup_peers: set[str]
    _snapshot_since: dict[str, dict[InterestKey, int]]
    _plugin_ring: tuple[int, int]
    remote: RemoteInterest
    table: SubscriptionTable
    forwarder: Forwarder
    forward_client: ForwardShards
    commands: Any  # service.PluginCommands (its `catchup`)
    queues: dict[str, OutboundQueue]
    _run_forward: Callable[..., None]
    _schedule_flush: Callable[[], None]

    def _init_catch_up(self, window: float, margin: float,
                       max_bytes: int) -> RecentCopies | None:
        """Set up (seconds, bytes; window 0: off); returns the ring the forwarder feeds."""
        self.catchup = CatchUp(int(window * 1000), int(margin * 1000), max_bytes)
        self._catchup_peers = set()  # peers that send subscribe times
        self._snapshot_since = {}  # a snapshot's subscribe times, chunks so far
        self._plugin_ring = (0, 0)  # the plugin's ring: entries, bytes (pressure replies)
        self._asks: deque[AskPlugin] = deque()  # waiting for a command in flight to end
        self._asking = 0  # catchup commands in flight
        return self.catchup.recent if window > 0 else None

    def _note_catch_up(self, peer: str, accept: Accept) -> None:
        if CATCH_UP in accept.capabilities:
            self._catchup_peers.add(peer)
        else:
            self._catchup_peers.discard(peer)

    def _catch_up_fresh(self, peer: str, since: Mapping[InterestKey, int], chunk: int = 0,
                        last: bool = True) -> dict[InterestKey, int]:
        """The keys of an interest frame with a subscribe time that `peer` did not hold
        (before the frame is applied; a snapshot's chunks are collected until its last)."""
        if self.forwarder.recent is None or peer not in self._catchup_peers:
            return {}
        if chunk == 0:
            self._snapshot_since.pop(peer, None)
        if chunk or not last:
            self._snapshot_since.setdefault(peer, {}).update(since)
            if not last:
                return {}
            since = self._snapshot_since.pop(peer)
        holds = self.remote.holds
        return {k: t for k, t in since.items() if not holds(peer, k)}

    def _catch_up(self, peer: str, fresh: dict[InterestKey, int],
                  actions: list[InterestAction]) -> Callable[[], None] | None:
        """Plan the catch-up of the keys `peer` now holds; returns what runs once the change's
        forwarding subscriptions were issued: ask the plugin after their SUBACKs."""
        holds = self.remote.holds
        fresh = {k: t for k, t in fresh.items() if holds(peer, k)}  # (a delta in a gap is not)
        if not fresh:
            return None
        subscribed = {a.filter for a in actions if isinstance(a, LocalSubscribe)}
        asks = self.catchup.on_interest(peer, fresh, subscribed, self.table.holds,
                                        int(time.time() * 1000), time.monotonic())
        if not asks:
            return None

        def ask() -> None:
            self._asks.extend(asks)
            self._send_asks()

        return lambda: self.forward_client.when_subscribed(ask)

    def _send_asks(self) -> None:
        """Start commands while fewer than `IN_FLIGHT` run, each with as many waiting asks as
        fit in `MAX_FILTERS` filters (asks that timed out meanwhile are dropped)."""
        waiting = self._asks
        while waiting and self._asking < IN_FLIGHT:
            group: list[AskPlugin] = []
            size = 0
            while waiting and (not group or size + len(waiting[0].filters) <= MAX_FILTERS):
                ask = waiting.popleft()
                if self.catchup.pending(ask.request):
                    group.append(ask)
                    size += len(ask.filters)
            if group:
                self._asking += 1
                asyncio.get_running_loop().create_task(self._ask_plugin(group))

    async def _ask_plugin(self, asks: list[AskPlugin]) -> None:
        parts: list[list] | None = None
        complete = False
        try:
            missed, complete = missed_from_reply(await self.commands.catchup(
                tuple(f for ask in asks for f in ask.filters)))
            parts = split_missed(asks, missed)
        except Exception as exc:  # the plugin refused or did not answer: held ones go on
            log.warning("catch-up failed: %s", exc, extra={
                "peers": sorted({a.peer for a in asks}), "requests": len(asks)})
        finally:
            self._asking -= 1
        for i, ask in enumerate(asks):
            self._run_catch_up(self.catchup.on_reply(
                ask.request, None if parts is None else parts[i], complete))
        self._send_asks()

    def _run_catch_up(self, actions: list[CatchUpAction]) -> None:
        wall_ms = int(time.time() * 1000)
        forwarder = self.forwarder
        for action in actions:
            if action.peer not in self.queues:
                continue
            if isinstance(action, Replay):
                self._run_forward([forwarder.replay(action.peer, action.topic, action.payload,
                                                    action.qos, action.properties, wall_ms,
                                                    action.shared)], hold=False)
            elif isinstance(action, Release):
                self._run_forward([forwarder.renumber(a) for a in action.actions], hold=False)
        self._schedule_flush()

    def _note_plugin_ring(self, fields: Mapping[str, Any]) -> None:
        """The plugin's ring size, from its pressure replies."""
        self._plugin_ring = (int(fields.get("catchup_entries", 0)),
                             int(fields.get("catchup_bytes", 0)))

    def _catch_up_holds(self, action) -> bool:
        """Hold a message for a peer whose catch-up on its topic is under way."""
        if not isinstance(action, (QueueEnvelope, SendEnvelope)):
            return False
        env = action.envelope
        shared = (InterestKey(env.shared_group, env.shared_filter)
                  if env.shared_group is not None else None)
        return self.catchup.hold(action.peer, env.topic, shared, action)

    def catch_up_status(self) -> dict[str, Any]:
        """Catch-up counters (sidecar side) and the ring of recent copies."""
        return {**self.catchup.counters, "held": self.catchup.held,
                "waiting": sum(len(r) for r in self.catchup.waiting.values()),
                "recent_entries": len(self.catchup.recent),
                "recent_bytes": self.catchup.recent.bytes,
                "plugin_entries": self._plugin_ring[0], "plugin_bytes": self._plugin_ring[1]}
