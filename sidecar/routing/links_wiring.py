"""Sets the plugin's links to its peers (`routing.links`): the adapter of `links.LinkPlan`.

It learns each peer's link address from its handshake (its Mosquitto's client listener;
a listener on every address is reached at the host of the peer's gRPC address), resolves it
to a numeric address (the plugin looks up no names on Mosquitto's thread), and sends the
plan's commands to the plugin in order, one at a time. The link password is derived from
the peer token, the same on every node (`link_secret`)."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from sidecar.challenge import derive_key
from sidecar.peering.handshake import LINKS, Hello
from sidecar.routing.links import LinkAction, LinkPlan, SetLinkFilters, SetLinks
from sidecar.routing.table import InterestKey

__all__ = ["LINK_USERNAME", "LinkWiring", "link_secret"]

log = logging.getLogger("mqfed.links")

LINK_USERNAME = "mqfed-link"
"""The username a link connects with (the plugin's `plugin_opt_link_secret` is its password)."""
FILTERS_PER_COMMAND = 1000
"""Filters per `link_filters` command (a peer's whole interest goes in several)."""
SETTLE_POLL = 0.005
"""Seconds between reads of a link's progress while a barrier waits for it."""
STATS_EVERY = 2.0
"""Seconds between reads of the plugin's link counters (for `status`)."""
ANY_ADDRESS = frozenset({"", "0.0.0.0", "::", "[::]"})


def link_secret(token: str) -> str:
    """The links' password on every node of a cluster with peer token `token`."""
    return derive_key(token, "link").hex()


def _split(address: str) -> tuple[str, int] | None:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def _numeric(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class LinkWiring:
    """The plugin's links, kept in line with the view, the handshakes and the interest."""

    def __init__(self, node_id: str, secret: str,
                 request: Callable[..., Awaitable[Any]]) -> None:
        self.node_id = node_id
        self.secret = secret
        self.request = request
        self.plan = LinkPlan()
        self._grpc: dict[str, str] = {}  # peer -> its gRPC address (the view)
        self._queue: asyncio.Queue[LinkAction] = asyncio.Queue()
        self.counters = {"commands": 0, "commands_failed": 0, "unresolved": 0}
        self.plugin: dict[str, Any] = {}  # the plugin's `links` stats, read every few seconds
        self._tasks: list[asyncio.Task] = []
        self._resolving: set[asyncio.Task] = set()

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._send_all()), loop.create_task(self._read_stats())]

    async def stop(self) -> None:
        tasks = [*self._tasks, *self._resolving]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def on_view(self, peers: Mapping[str, str]) -> None:
        """The membership view: node id -> gRPC address of every other node."""
        self._grpc = dict(peers)
        self._issue(self.plan.on_view(peers))

    def on_peer_hello(self, hello: Hello, capabilities: frozenset[str]) -> None:
        """A peer's stream came up: whether it takes links, and where."""
        if LINKS not in capabilities:
            self._issue(self.plan.on_address(hello.node_id, None))
            return
        task = asyncio.get_running_loop().create_task(self._resolve(hello))
        self._resolving.add(task)  # (a task nobody holds may be collected before it ran)
        task.add_done_callback(self._resolving.discard)

    def on_interest(self, peer: str, keys: Iterable[InterestKey]) -> None:
        """`peer`'s interest now (its plain filters go on its link)."""
        self._issue(self.plan.on_interest(peer, (k.filter for k in keys if k.group is None)))

    def on_plugin_reset(self) -> None:
        """The local Mosquitto restarted: its plugin holds no links; set them again."""
        self._issue(self.plan.on_reset())

    def status(self) -> dict[str, Any]:
        return {"carrying": self.plan.carrying, "links": sorted(self.plan.links),
                **self.counters, "plugin": self.plugin}

    async def settled(self, peer: str, timeout: float) -> bool:
        """Whether every record this node's link to `peer` took until now was PUBACKed by
        `peer` within `timeout` s (its Mosquitto injected them): a moving session's barrier
        covers what the links carry. True at once without a link to `peer`."""
        if peer not in self.plan.links:
            return True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        progress = await self._progress(peer)
        if progress is None:
            return True
        target = progress[0]
        while progress is not None and progress[1] < target:
            if loop.time() > deadline:
                return False
            await asyncio.sleep(SETTLE_POLL)
            progress = await self._progress(peer)
        return True

    async def _progress(self, peer: str) -> tuple[int, int] | None:
        """(records taken, records PUBACKed) of the link to `peer` (None: no such link)."""
        for link in (await self._plugin_links()).get("list", ()):
            if link.get("peer") == peer:
                return int(link.get("records", 0)), int(link.get("acked_records", 0))
        return None

    async def _plugin_links(self) -> dict[str, Any]:
        """The plugin's `links` counters (its `stats` command)."""
        reply = await self.request("stats")
        return reply.fields.get("links") or {}

    async def _read_stats(self) -> None:
        while True:
            await asyncio.sleep(STATS_EVERY)
            try:
                self.plugin = await self._plugin_links()
            except Exception:  # the link to the plugin is down: it comes back
                continue

    async def _resolve(self, hello: Hello) -> None:
        split = _split(hello.mqtt_address)
        if split is not None and split[0] in ANY_ADDRESS:
            grpc = _split(hello.grpc_address or self._grpc.get(hello.node_id, ""))
            split = None if grpc is None else (grpc[0], split[1])
        address = None
        if split is not None:
            host, port = split
            if _numeric(host):
                address = (host, port)
            else:
                try:
                    infos = await asyncio.get_running_loop().getaddrinfo(
                        host, port, type=socket.SOCK_STREAM)
                    address = (str(infos[0][4][0]), port)
                except (OSError, IndexError) as exc:
                    log.warning("a peer's link address does not resolve: its records go "
                                "through the sidecars", extra={"peer": hello.node_id,
                                                               "address": host,
                                                               "error": str(exc)})
        if address is None:
            self.counters["unresolved"] += 1
        self._issue(self.plan.on_address(hello.node_id, address))

    def _issue(self, actions: list[LinkAction]) -> None:
        for action in actions:
            self._queue.put_nowait(action)

    async def _send_all(self) -> None:
        while True:
            action = await self._queue.get()
            for cmd, fields in self._commands(action):
                try:
                    await self.request(cmd, **fields)
                    self.counters["commands"] += 1
                except Exception as exc:  # the plugin refused, or the link to it is down
                    self.counters["commands_failed"] += 1
                    log.warning("the plugin refused a links command: %s", exc,
                                extra={"cmd": cmd})

    def _commands(self, action: LinkAction) -> list[tuple[str, dict[str, Any]]]:
        if isinstance(action, SetLinks):
            return [("links", {"node": self.node_id, "links": [
                {"peer": p, "host": h, "port": port, "username": LINK_USERNAME,
                 "password": self.secret} for p, h, port in action.links]})]
        assert isinstance(action, SetLinkFilters)
        return [("link_filters", {"peer": action.peer, "add": [], "remove": [],
                                  kind: list(filters[i:i + FILTERS_PER_COMMAND])})
                for kind, filters in (("remove", action.remove), ("add", action.add))
                for i in range(0, len(filters), FILTERS_PER_COMMAND)]
