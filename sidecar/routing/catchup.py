"""Catch-up of a peer's new interest (sans-IO core; architecture §3, "Catch-up").

A subscription counts cluster-wide from its SUBACK, but this node learns of a peer's new
interest some milliseconds later: what was published here in between never went there. When a
peer's interest delta (or snapshot) adds keys with their subscribe times, `CatchUp.on_interest`
plans what those subscriptions missed here, from the subscribe time minus `margin_ms` (the clock
skew allowed between nodes):

- copies the forwarder handled before the interest arrived (they came through another peer's
  filter) without sending them to that peer: `RecentCopies`, a ring the forwarder feeds;
- publishes no forwarding subscription took: the plugin's ring, asked with `AskPlugin` (the
  `catchup` command) once the new forwarding subscriptions are in effect in Mosquitto, so
  everything routed after that reached the forwarding client. For a shared key (only when its
  group is new on this node and has no local member) the plugin returns what was routed before
  this node joined the group: nobody in the group was offered it.

Until the plugin answers, forwarding actions for that peer on the new keys are held (`hold`);
`on_reply` returns the replays in time order, then the held actions (`Release`), so a replayed
message never arrives after a newer one on its topic. Replays are new messages for the peer
only; nothing else is ever sent twice, so they need no deduplication.
"""

from __future__ import annotations

import base64
import binascii
import itertools
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sidecar.local.events import ProtocolError, properties_from_json
from sidecar.message import MessageProperties
from sidecar.routing.table import InterestKey
from sidecar.topics import SHARE_PREFIX, TopicTrie, matches

__all__ = [
    "MAX_FILTERS",
    "AskPlugin",
    "CatchUp",
    "CatchUpAction",
    "Missed",
    "RecentCopies",
    "RecentCopy",
    "Release",
    "Replay",
    "missed_from_reply",
    "split_missed",
]

MAX_FILTERS = 1000
"""Filters per `catchup` command (the plugin's limit)."""

TIMEOUT = 3.0
"""Seconds a request may take (persisting the interest, the SUBACK, the plugin's answer) before
the held actions go without it (counted in `failed`)."""


@dataclass(frozen=True, slots=True)
class RecentCopy:
    """A copy the forwarder handled: when (this node's wall clock), what, and the peers it
    went to."""

    wall_ms: int
    topic: str
    payload: bytes
    qos: int
    properties: MessageProperties
    peers: frozenset[str]


_Kept = tuple[int, str, bytes, int, MessageProperties, frozenset[str]]


class RecentCopies:
    """The forwarder's recent copies, bounded by age (`window_ms`), bytes and count. Kept as
    plain tuples: `add` runs for every forwarded copy."""

    def __init__(self, window_ms: int, max_bytes: int, max_entries: int = 200_000) -> None:
        self.window_ms = window_ms
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self._ring: deque[_Kept] = deque()
        self.bytes = 0
        self.evicted_ms = 0  # newest time among the copies dropped

    def __len__(self) -> int:
        return len(self._ring)

    def add(self, wall_ms: int, topic: str, payload: bytes, qos: int,
            properties: MessageProperties, peers: frozenset[str]) -> None:
        """Keep one copy (costs O(1) amortized)."""
        ring = self._ring
        ring.append((wall_ms, topic, payload, qos, properties, peers))
        self.bytes += len(payload) + len(topic)
        if (ring[0][0] < wall_ms - self.window_ms or self.bytes > self.max_bytes
                or len(ring) > self.max_entries):
            self._evict(wall_ms - self.window_ms)

    def _evict(self, oldest: int) -> None:
        ring = self._ring
        while ring and (ring[0][0] < oldest or self.bytes > self.max_bytes
                        or len(ring) > self.max_entries):
            gone = ring.popleft()
            self.bytes -= len(gone[2]) + len(gone[1])
            self.evicted_ms = max(self.evicted_ms, gone[0])

    def missed(self, peer: str, filters: Sequence[tuple[str, int]]) -> list[RecentCopy]:
        """The copies, oldest first, that matched one of `filters` (plain, verbatim) at or after
        its time and did not go to `peer`."""
        if not filters or not self._ring:
            return []
        start = min(since for _, since in filters)
        found = []
        for kept in reversed(self._ring):
            wall_ms, topic = kept[0], kept[1]
            if wall_ms < start:
                break
            if peer not in kept[5] and any(
                    wall_ms >= since and matches(f, topic) for f, since in filters):
                found.append(RecentCopy(*kept))
        found.reverse()
        return found


@dataclass(frozen=True)
class Missed:
    """One message of the plugin's `catchup` answer: routed at `t_ms` (the plugin's clock);
    `plain` when a plain filter of the request wants it, `shared` the indexes of the shared
    filters that do."""

    t_ms: int
    topic: str
    payload: bytes
    qos: int
    properties: MessageProperties
    plain: bool
    shared: tuple[int, ...] = ()


def missed_from_reply(fields: Mapping[str, Any]) -> tuple[list[Missed], bool]:
    """The messages and `complete` flag of a `catchup` reply; `ProtocolError` if malformed."""
    try:
        out = []
        for m in fields["messages"]:
            shared = tuple(m.get("shared") or ())
            if not all(isinstance(i, int) and i >= 0 for i in shared):
                raise ValueError("shared")
            out.append(Missed(int(m["t"]), str(m["topic"]),
                              base64.b64decode(m["payload"], validate=True), int(m["qos"]),
                              properties_from_json(m.get("properties")), bool(m["plain"]),
                              shared))
        return out, bool(fields.get("complete", True))
    except (KeyError, TypeError, ValueError, binascii.Error) as exc:
        raise ProtocolError(f"malformed catchup reply: {exc!r}") from None


def split_missed(asks: Sequence[AskPlugin], missed: Iterable[Missed]) -> list[list[Missed]]:
    """The answer to one `catchup` command made of several asks' filters in turn, as each
    ask's own answer: `shared` indexes rebased to the ask's filters, `plain` when one of the
    ask's plain filters matches the topic at or after its time (the plugin's `plain` says that
    some plain filter of the command wants it and that no forwarding subscription took it)."""
    out: list[list[Missed]] = [[] for _ in asks]
    if len(asks) == 1:
        out[0] = list(missed)
        return out
    plain: TopicTrie[tuple[int, int]] = TopicTrie()  # plain filter -> (ask, since)
    spans = []
    start = 0
    for i, ask in enumerate(asks):
        spans.append((start, start + len(ask.filters)))
        start += len(ask.filters)
        for f, since in ask.filters:
            if not f.startswith(SHARE_PREFIX):
                plain.add(f, (i, since), checked=True)
    for m in missed:
        wants = {i for i, since in plain.match(m.topic) if m.t_ms >= since} if m.plain else ()
        for i, (low, high) in enumerate(spans):
            shared = tuple(j - low for j in m.shared if low <= j < high)
            if shared or i in wants:
                out[i].append(replace(m, plain=i in wants, shared=shared))
    return out


@dataclass(frozen=True)
class AskPlugin:
    """Send the plugin `catchup` with these (verbatim filter, since ms) once the forwarding
    subscriptions issued so far are in effect; feed the answer to `on_reply(request, ...)`."""

    request: int
    peer: str
    filters: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class Replay:
    """Send this message to `peer` alone (a new message id), as a shared delivery when
    `shared` names the group."""

    peer: str
    topic: str
    payload: bytes
    qos: int
    properties: MessageProperties
    shared: InterestKey | None = None


@dataclass(frozen=True)
class Release:
    """Forwarding actions for `peer` held while its catch-up ran, in their order: send them."""

    peer: str
    actions: tuple[Any, ...]


CatchUpAction = Replay | Release


@dataclass
class _Request:
    peer: str
    keys: list[InterestKey]
    deadline: float
    shared: set[InterestKey] = field(default_factory=set)
    recent: list[RecentCopy] = field(default_factory=list)
    _plain: TopicTrie[None] | None = None  # built at the first hold check (most see none)

    def wants(self, topic: str, shared: InterestKey | None) -> bool:
        """Whether an action on `topic` (a shared delivery for `shared`) follows this request."""
        if shared is not None:
            return shared in self.shared
        if self._plain is None:
            self._plain = TopicTrie()
            for key in self.keys:
                if key.group is None:
                    self._plain.add(key.filter, None)
        return bool(self._plain.match(topic))


class CatchUp:
    """Plans catch-ups and holds what must follow them (see the module docstring)."""

    def __init__(self, window_ms: int, margin_ms: int, max_bytes: int,
                 timeout: float = TIMEOUT) -> None:
        self.window_ms = window_ms
        self.margin_ms = margin_ms
        self.timeout = timeout
        self.recent = RecentCopies(window_ms, max_bytes)
        self.waiting: dict[str, set[int]] = {}  # peer -> its requests not answered yet
        self._requests: dict[int, _Request] = {}
        self._held: dict[str, list[tuple[Any, set[int]]]] = {}
        self._ids = itertools.count(1)
        self.counters = {"requests": 0, "replayed_plugin": 0, "replayed_recent": 0,
                         "failed": 0, "incomplete": 0, "too_old": 0, "ahead": 0,
                         "held_total": 0}

    def on_interest(self, peer: str, fresh: Mapping[InterestKey, int],
                    subscribed: set[str], local_member: Callable[[InterestKey], bool],
                    wall_ms: int, now: float) -> list[AskPlugin]:
        """`peer` now holds the keys of `fresh` (key -> its subscribe time, the peer's wall
        clock in ms), which it did not before. `subscribed`: the forwarding subscriptions this
        change made (verbatim); `local_member(key)`: a local session holds that shared key.
        Returns the plugin requests to make; holding starts now."""
        keys: list[InterestKey] = []
        oldest, ahead, margin = wall_ms - self.window_ms, wall_ms + self.margin_ms, self.margin_ms
        for key, since in fresh.items():
            if since - margin < oldest:
                if since > 0:
                    self.counters["too_old"] += 1  # past both rings
                continue
            if since > ahead:
                self.counters["ahead"] += 1  # the peer's clock is ahead of ours by more
            if key.group is not None and (key.verbatim not in subscribed or local_member(key)):
                continue  # the group got every message here already
            keys.append(key)
        asks = []
        for i in range(0, len(keys), MAX_FILTERS):
            part = keys[i:i + MAX_FILTERS]
            filters = tuple((k.filter if k.group is None else k.verbatim, fresh[k] - margin)
                            for k in part)
            request = next(self._ids)
            req = _Request(peer, part, now + self.timeout)
            req.shared = {k for k in part if k.group is not None}
            req.recent = self.recent.missed(
                peer, [f for f, k in zip(filters, part, strict=True) if k.group is None])
            self._requests[request] = req
            self.waiting.setdefault(peer, set()).add(request)
            self.counters["requests"] += 1
            asks.append(AskPlugin(request, peer, filters))
        return asks

    def hold(self, peer: str, topic: str, shared: InterestKey | None, action: Any) -> bool:
        """Whether to hold this forwarding action for `peer` (a message on `topic`, or a shared
        delivery for `shared`) until the catch-ups it follows are answered."""
        requests = self.waiting.get(peer)
        if not requests:
            return False
        wait = set()
        for request in requests:
            if self._requests[request].wants(topic, shared):
                wait.add(request)
        if not wait:
            return False
        self._held.setdefault(peer, []).append((action, wait))
        self.counters["held_total"] += 1
        return True

    def on_reply(self, request: int, missed: Iterable[Missed] | None,
                 complete: bool = True) -> list[CatchUpAction]:
        """The plugin's answer (None: it failed or timed out). Returns the replays, oldest
        first, then the held actions no other request waits for."""
        req = self._requests.pop(request, None)
        if req is None:
            return []
        peer = req.peer
        requests = self.waiting[peer]
        requests.discard(request)
        if not requests:
            del self.waiting[peer]
        timed: list[tuple[int, Replay]] = []
        if missed is None:
            self.counters["failed"] += 1
        else:
            if not complete:
                self.counters["incomplete"] += 1
            for m in missed:
                if m.plain:
                    timed.append((m.t_ms, Replay(peer, m.topic, m.payload, m.qos,
                                                 m.properties)))
                for i in m.shared:
                    if i < len(req.keys) and req.keys[i].group is not None:
                        timed.append((m.t_ms, Replay(peer, m.topic, m.payload, m.qos,
                                                     m.properties, req.keys[i])))
            self.counters["replayed_plugin"] += len(timed)
        for c in req.recent:
            timed.append((c.wall_ms, Replay(peer, c.topic, c.payload, c.qos, c.properties)))
        self.counters["replayed_recent"] += len(req.recent)
        timed.sort(key=lambda tr: tr[0])
        out: list[CatchUpAction] = [r for _, r in timed]
        held = self._held.get(peer, [])
        released = []
        for entry in held:
            entry[1].discard(request)
            if not entry[1]:
                released.append(entry[0])
        if released:
            left = [entry for entry in held if entry[1]]
            if left:
                self._held[peer] = left
            else:
                del self._held[peer]
            out.append(Release(peer, tuple(released)))
        return out

    def pending(self, request: int) -> bool:
        """Whether `request` still waits for the plugin's answer (not timed out, not forgotten)."""
        return request in self._requests

    def on_timer(self, now: float) -> list[CatchUpAction]:
        """Requests past their deadline go without the plugin's answer."""
        out: list[CatchUpAction] = []
        for request in [r for r, req in self._requests.items() if req.deadline <= now]:
            out += self.on_reply(request, None)
        return out

    def forget(self, peer: str) -> None:
        """`peer` left: drop its requests and what was held for it."""
        for request in self.waiting.pop(peer, set()):
            self._requests.pop(request, None)
        self._held.pop(peer, None)

    @property
    def held(self) -> int:
        """Forwarding actions held now."""
        return sum(len(h) for h in self._held.values())
