"""`RoutedPeers`: which peers a node routes to (pure; the clock is passed in).

The membership view (etcd, or the static list) plus crash retention: a peer whose key expired
without a graceful leave stays routed for `retention` seconds, so its interest and its queue
are kept and QoS >= 1 messages for it wait instead of being lost; it is dropped when it does
not return in time. A graceful leave drops it at once. The admin directory lists crashed nodes
as targets for the same time (`within_retention`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from sidecar.membership.view import Change

CRASHED_RETENTION = 600.0
"""Seconds a crashed peer stays routed (and listed as a target of cluster-wide calls)."""


def static_peers(entries: Iterable[str]) -> dict[str, str]:
    """`membership.peers` entries ``"<node>@<grpc address>"`` as node id -> address."""
    peers: dict[str, str] = {}
    for entry in entries:
        node, _, address = entry.partition("@")
        peers[node] = address
    return peers


def within_retention(crashed_since: float, now: float,
                     retention: float = CRASHED_RETENTION) -> bool:
    """Whether a peer that crashed at `crashed_since` is still kept."""
    return now - crashed_since < retention


@dataclass
class RoutedPeers:
    """The view plus the crashed peers still retained; `routed` is what routing should use."""

    retention: float = CRASHED_RETENTION
    routed: dict[str, str] = field(default_factory=dict)
    _view: dict[str, str] = field(default_factory=dict)
    _crashed: dict[str, tuple[str, float]] = field(default_factory=dict)  # -> address, since

    @property
    def retaining(self) -> bool:
        """Crashed peers are kept (call `refresh` now and then to drop expired ones)."""
        return bool(self._crashed)

    def on_events(self, changes: Iterable[Change], now: float) -> list[str]:
        """Membership events; returns the peers that crashed (now retained). Only remembered:
        the view change that always follows (`on_view`) applies them."""
        crashed = []
        for change in changes:
            if change.kind == "crashed" and change.record is not None:
                self._crashed[change.node_id] = (change.record.grpc, now)
                crashed.append(change.node_id)
            elif change.kind == "left":  # graceful: dropped now
                self._crashed.pop(change.node_id, None)
        return crashed

    def on_view(self, peers: Mapping[str, str], now: float) -> tuple[bool, list[str]]:
        """The membership view changed: (whether `routed` changed, crashed peers dropped)."""
        self._view = dict(peers)
        return self.refresh(now)

    def refresh(self, now: float) -> tuple[bool, list[str]]:
        """Drop crashed peers that came back or did not return in time: (whether `routed`
        changed, the peers dropped for good)."""
        for peer in [p for p in self._crashed if p in self._view]:
            del self._crashed[peer]  # it is back (a join reaches the view after its event)
        dropped = [p for p, (_, since) in self._crashed.items()
                   if not within_retention(since, now, self.retention)]
        for peer in dropped:
            del self._crashed[peer]
        routed = {p: addr for p, (addr, _) in self._crashed.items()}
        routed.update(self._view)
        if routed == self.routed:
            return False, dropped
        self.routed = routed
        return True, dropped
