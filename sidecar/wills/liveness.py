"""`Liveness`: which nodes are confirmed dead, for their clients' wills (sans-IO; the clock is
passed in).

A node is confirmed dead when both hold: its membership key is gone without a graceful leave
(its etcd lease expired), and this node has had no peer stream with it (either direction) for
`grace_ms`. Either alone is not enough: a node cut off from etcd keeps its streams, and a
stream can fail while the node is well. A node that left gracefully is never dead: it drained
and handed over what it had. A confirmed-dead node that comes back with the same incarnation
was not dead at all (cut off from etcd and from this node: a partition, or a stalled
process): that is counted (`false`), since its wills may have been published while its clients
were still connected.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Death:
    """A confirmed death: `since_ms` is when the streams went down (the best estimate of when
    the node died), `incarnation` the last one seen (None: never seen in the view)."""

    node: str
    incarnation: int | None
    since_ms: int
    confirmed_ms: int


@dataclass(frozen=True, slots=True)
class Confirmed:
    death: Death


@dataclass(frozen=True, slots=True)
class Returned:
    """A node confirmed dead is a member again; `false`: with the same incarnation."""

    death: Death
    incarnation: int
    false: bool


Event = Confirmed | Returned


@dataclass
class Liveness:
    me: str
    grace_ms: int
    members: dict[str, int] = field(default_factory=dict)  # node -> incarnation (the view)
    left: set[str] = field(default_factory=set)
    seen: dict[str, int] = field(default_factory=dict)  # last incarnation seen per node
    down_since: dict[str, int] = field(default_factory=dict)
    dead: dict[str, Death] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=lambda: {"confirmed": 0, "false": 0})

    def on_view(self, members: Mapping[str, int], now_ms: int) -> list[Event]:
        """The membership view (node -> incarnation), this node included or not."""
        out: list[Event] = []
        for node, incarnation in members.items():
            self.left.discard(node)
            death = self.dead.pop(node, None)
            if death is not None:
                false = death.incarnation is not None and incarnation == death.incarnation
                self.counters["false"] += false
                out.append(Returned(death, incarnation, false))
            self.seen[node] = incarnation
        self.members = dict(members)
        return out

    def on_left(self, node: str) -> None:
        """`node` left gracefully (its record said so before its key went)."""
        self.left.add(node)

    def on_stream(self, node: str, up: bool, now_ms: int) -> None:
        """Whether any peer stream with `node` is up now."""
        if up:
            self.down_since.pop(node, None)
        else:
            self.down_since.setdefault(node, now_ms)

    def watched(self, owners: Iterable[str] = ()) -> set[str]:
        """The nodes whose streams to report: every node seen, and `owners`."""
        return (set(self.seen) | set(owners)) - {self.me}

    def tick(self, now_ms: int, owners: Iterable[str] = ()) -> list[Event]:
        """Confirm the deaths that are due among the watched nodes."""
        out: list[Event] = []
        for node in sorted(self.watched(owners)):
            if node in self.members or node in self.left or node in self.dead:
                continue
            since = self.down_since.get(node)
            if since is None or now_ms - since < self.grace_ms:
                continue
            death = Death(node, self.seen.get(node), since, now_ms)
            self.dead[node] = death
            self.counters["confirmed"] += 1
            out.append(Confirmed(death))
        return out

    def is_dead(self, node: str) -> bool:
        return node in self.dead

    def live(self) -> list[str]:
        """The nodes that may act for the dead: the members, and this node."""
        return sorted(set(self.members) | {self.me})
