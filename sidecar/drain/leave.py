"""Graceful leave (SIGTERM): disconnect this node's clients cleanly and let
their last messages reach the peers, before the node leaves etcd.

Order matters: a peer that sees us leave closes our streams, so anything our clients published
just before (or their wills) could no longer be forwarded. So: refuse the clients' reconnects
here (they retry, through the load balancer, on another node), disconnect them (MQTT 5 clients
get a DISCONNECT, reason 0x98; their wills are published, as MQTT requires when the server
closes a connection), wait until every message Mosquitto handed the sidecar is settled with
the peers and the forwarding connection has gone quiet, then leave.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from sidecar.local.events import CommandFailed
from sidecar.local.link import LinkError

__all__ = ["DRAIN_TIMEOUT", "QUIET", "DrainResult", "drain", "settled"]

log = logging.getLogger("mqfed.drain")

DRAIN_TIMEOUT = 5.0
"""Seconds a graceful leave waits for the last messages to settle before leaving anyway."""
QUIET = 0.3
"""Seconds without a new message from Mosquitto after which its queue for us is empty (with
nothing pending, Mosquitto's in-flight window is open: a queued message would have come)."""
KICK_CONCURRENCY = 64


class Requests(Protocol):
    async def request(self, cmd: str, timeout: float = 5.0, **fields): ...


class Settling(Protocol):
    @property
    def unsettled(self) -> int: ...

    @property
    def last_copy_at(self) -> float: ...


@dataclass(frozen=True)
class DrainResult:
    clients: int
    """Clients disconnected."""
    settled: bool
    """False when the timeout passed with messages still unsettled."""
    seconds: float


def settled(unsettled: int, last_copy_at: float, now: float, quiet: float = QUIET) -> bool:
    """Nothing waits for a peer and Mosquitto has had nothing more for us for `quiet` s."""
    return unsettled == 0 and now - last_copy_at >= quiet


async def _disconnect(link: Requests, client: str) -> bool:
    try:
        await link.request("deny", client=client, mode="retry")
        await link.request("kick", client=client, with_will=True)
        return True
    except CommandFailed:  # it left on its own meanwhile
        return False


async def disconnect_clients(link: Requests, clients: Iterable[str]) -> int:
    """Deny reconnects here and disconnect each client; returns how many were disconnected."""
    gate = asyncio.Semaphore(KICK_CONCURRENCY)

    async def one(client: str) -> bool:
        async with gate:
            return await _disconnect(link, client)

    return sum(await asyncio.gather(*(one(c) for c in clients)))


async def drain(link: Requests, clients: Iterable[str], routing: Settling | None, *,
                timeout: float = DRAIN_TIMEOUT,
                clock: Callable[[], float] = time.monotonic) -> DrainResult:
    """Disconnect `clients`, then wait (at most `timeout`) until `routing` has settled."""
    started = clock()
    try:
        count = await asyncio.wait_for(disconnect_clients(link, list(clients)), timeout)
    except (LinkError, TimeoutError) as exc:
        log.warning("could not disconnect every client before leaving",
                    extra={"error": str(exc) or "timeout"})
        count = 0
    kicked_at = clock()
    ok = routing is None
    while routing is not None and not ok and clock() - started < timeout:
        ok = settled(routing.unsettled, max(routing.last_copy_at, kicked_at), clock())
        if not ok:
            await asyncio.sleep(0.05)
    result = DrainResult(count, ok, clock() - started)
    log.info("drained before leaving", extra={"clients": count, "settled": ok,
                                              "seconds": round(result.seconds, 3)})
    return result
