"""Which nodes exist and where their admin endpoints are (sans-IO core).

Fed the membership events the node already gets (joined, restarted, updated, crashed, left) and,
for static membership, the configured peer list. Crashed nodes stay listed, and stay targets of
cluster-wide calls for `crashed_retention` seconds (the node keeps routing for them that long),
so a cluster-wide answer names them as missing; nodes that left gracefully are listed as left
and not asked.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from sidecar.membership.routed import CRASHED_RETENTION, within_retention
from sidecar.membership.view import Change, NodeRecord

__all__ = ["Directory", "Entry", "UnknownNode"]


class UnknownNode(ValueError):
    """A node id the cluster does not know."""


@dataclass(frozen=True)
class Entry:
    """One node: its last record, its state and when that state began (`since`: unix seconds,
    for display; `changed_at`: on a monotonic clock, for the crashed retention, so that a step
    of the wall clock neither prolongs nor cuts it)."""

    record: NodeRecord
    state: str  # up | crashed | left
    since: float
    changed_at: float = 0.0


class Directory:
    """The cluster's nodes as this node sees them."""

    def __init__(self, me: NodeRecord, crashed_retention: float = CRASHED_RETENTION) -> None:
        self.me = me
        self.crashed_retention = crashed_retention
        self._entries: dict[str, Entry] = {me.node_id: Entry(me, "up", me.started_at)}

    def add_static(self, peers: dict[str, str], now: float) -> None:
        """Static membership: peers by gRPC address; their admin addresses come from their
        handshakes (`learn_admin`)."""
        for node, grpc in peers.items():
            if node != self.me.node_id:
                self._entries[node] = Entry(NodeRecord(node, grpc, "", "", 0, 0.0), "up", now)

    def learn_admin(self, node: str, admin: str) -> None:
        """A peer's handshake named its admin address: fill it in where membership had none."""
        entry = self._entries.get(node)
        if entry is not None and admin and not entry.record.admin:
            self._entries[node] = replace(entry, record=replace(entry.record, admin=admin))

    def on_events(self, changes: Iterable[Change], now: float,
                  monotonic: float | None = None) -> None:
        """Membership events seen at wall time `now` and `monotonic` (default: `now`)."""
        mono = now if monotonic is None else monotonic
        for change in changes:
            if change.node_id == self.me.node_id or change.record is None:
                continue
            old = self._entries.get(change.node_id)
            if change.kind in ("joined", "restarted", "updated", "up"):
                since = old.since if old is not None and old.state == "up" else now
                self._entries[change.node_id] = Entry(change.record, "up", since)
            elif change.kind in ("crashed", "left"):
                record = replace(change.record, leaving=False)
                self._entries[change.node_id] = Entry(record, change.kind, now, mono)

    def entries(self) -> list[Entry]:
        """Every node ever seen (this one first, then by id)."""
        me = self._entries[self.me.node_id]
        return [me] + [e for n, e in sorted(self._entries.items()) if n != self.me.node_id]

    def targets(self, nodes: Iterable[str], now: float) -> list[Entry]:
        """The nodes a cluster-wide call asks: the given ids (UnknownNode if one is not known),
        or every node that is up or crashed recently (`now` on the clock `on_events` got as
        `monotonic`)."""
        wanted = list(nodes)
        if wanted:
            unknown = [n for n in wanted if n not in self._entries]
            if unknown:
                known = ", ".join(sorted(self._entries))
                raise UnknownNode(f"no node {', '.join(unknown)} in this cluster (known: {known})")
            return [self._entries[n] for n in dict.fromkeys(wanted)]
        return [e for e in self.entries() if e.state == "up" or (
            e.state == "crashed" and within_retention(e.changed_at, now,
                                                      self.crashed_retention))]
