"""Which peers the plugin links to and what each link carries (issue 25, slice 3; sans-IO).

With `routing.links` on, the plugin writes the copies peers want straight to their
Mosquittos over its own MQTT links (docs/plugin-protocol.md "Links"): no sidecar per
message. This core turns what the sidecar knows (the membership view, each peer's link
address from its handshake, each peer's interest) into the plugin's two commands:
`SetLinks` (the whole set of links) and `SetLinkFilters` (one link's filter changes).

A record the plugin captures goes to the links whose filters match *instead of* the capture
socket, so a peer whose interest is not on a link would miss it. Links therefore carry
filters only while **every** peer in the view takes links (their handshake says `links`
and gave a link address); otherwise every link's filters are taken back, and records go
to the capture socket, routed by the sidecar as without links. A link itself stays while
its peer is in the view (what it holds is still delivered). Only plain filters go on links:
a shared subscription's pick stays with the sidecar.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["LinkAction", "LinkPlan", "SetLinkFilters", "SetLinks"]


@dataclass(frozen=True, slots=True)
class SetLinks:
    """The plugin's whole set of links: (peer, numeric host, port), sorted."""

    links: tuple[tuple[str, str, int], ...]


@dataclass(frozen=True, slots=True)
class SetLinkFilters:
    """Add and remove plain filters on `peer`'s link (each filter once per peer)."""

    peer: str
    add: tuple[str, ...]
    remove: tuple[str, ...]


LinkAction = SetLinks | SetLinkFilters


class LinkPlan:
    """What the plugin's links should be; every input returns the commands that get there."""

    def __init__(self) -> None:
        self.view: frozenset[str] = frozenset()
        self.addresses: dict[str, tuple[str, int]] = {}  # peers that take links, where
        self.wanted: dict[str, frozenset[str]] = {}  # peer -> its plain filters
        self.links: dict[str, tuple[str, int]] = {}  # as set in the plugin
        self.applied: dict[str, frozenset[str]] = {}  # linked peer -> filters in the plugin

    def on_view(self, peers: Iterable[str]) -> list[LinkAction]:
        """The membership view changed (the other nodes)."""
        self.view = frozenset(peers)
        for peer in set(self.wanted) - self.view:
            del self.wanted[peer]  # (its interest went with it; an address may come first)
        return self._plan()

    def on_address(self, peer: str, address: tuple[str, int] | None) -> list[LinkAction]:
        """`peer`'s handshake: where its Mosquitto takes links (None: it takes none)."""
        if address is None:
            self.addresses.pop(peer, None)
        else:
            self.addresses[peer] = address
        return self._plan()

    def on_interest(self, peer: str, filters: Iterable[str]) -> list[LinkAction]:
        """`peer`'s plain filters now (shared ones left out by the caller)."""
        self.wanted[peer] = frozenset(filters)
        return self._plan()

    def on_reset(self) -> list[LinkAction]:
        """The plugin started afresh (its Mosquitto restarted): it has no links."""
        self.links = {}
        self.applied = {}
        return self._plan()

    @property
    def carrying(self) -> bool:
        """Whether links carry records (every peer in the view takes links)."""
        return bool(self.view) and all(p in self.addresses for p in self.view)

    def _plan(self) -> list[LinkAction]:
        out: list[LinkAction] = []
        want = {p: a for p, a in self.addresses.items() if p in self.view}
        if want != self.links:
            for peer in set(self.links) - set(want):
                self.applied.pop(peer, None)  # the plugin drops a link's filters with it
            self.links = want
            out.append(SetLinks(tuple(sorted((p, h, port) for p, (h, port) in want.items()))))
        carrying = self.carrying
        for peer in sorted(self.links):
            target = self.wanted.get(peer, frozenset()) if carrying else frozenset()
            have = self.applied.get(peer, frozenset())
            if target != have:
                out.append(SetLinkFilters(peer, tuple(sorted(target - have)),
                                          tuple(sorted(have - target))))
                self.applied[peer] = target
        return out
