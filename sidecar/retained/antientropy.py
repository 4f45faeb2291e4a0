"""`AntiEntropy`: digest exchanges that bring two nodes' retained indexes together (sans-IO).

The node that dials a peer starts an exchange when its stream comes up and then every
`interval_ms`; it only *pulls* (the peer pulls the other way on its own stream). One exchange
runs at a time, so a new node pulls everything from its first peer and finds the others equal.
See peer.proto ("Retained messages") for the frames.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sidecar.retained.entry import RetainedEntry, Version
from sidecar.retained.index import RetainedIndex

REFUSED_KEPT = 10_000  # refused versions remembered (the newest)


@dataclass(frozen=True)
class SendDigest:
    peer: str
    exchange: int
    digests: list[int]
    counts: list[int]


@dataclass(frozen=True)
class SendRequest:
    peer: str
    exchange: int
    topics: tuple[str, ...]


@dataclass(frozen=True)
class ReplyEntries:
    """Answer `peer`'s exchange with entries (`last`: the answer to its request ends here)."""

    peer: str
    exchange: int
    entries: tuple[RetainedEntry, ...]
    last: bool


@dataclass(frozen=True)
class ReplyVersions:
    peer: str
    exchange: int
    buckets: tuple[int, ...]
    versions: tuple[tuple[str, Version], ...]


AeAction = SendDigest | SendRequest | ReplyEntries | ReplyVersions


@dataclass
class _Active:
    peer: str
    exchange: int
    started_ms: int


class AntiEntropy:
    """Initiator and responder sides of the digest exchange."""

    def __init__(self, index: RetainedIndex, interval_ms: int = 15_000,
                 timeout_ms: int = 60_000) -> None:
        self.index = index
        self.interval_ms = interval_ms
        self.timeout_ms = timeout_ms
        self._queue: list[str] = []
        self._up: set[str] = set()
        self._last: dict[str, int] = {}  # peer -> when its last exchange ended
        self._active: _Active | None = None
        self._exchange = 0
        self.counters = {"exchanges": 0, "in_sync": 0, "pulled": 0, "served": 0, "aborted": 0,
                         "refused_skipped": 0}
        # versions a peer offered that this node refused (invalid): not asked for again
        self._refused: OrderedDict[str, Version] = OrderedDict()

    # ---- initiator -----------------------------------------------------------------------
    def on_peer_up(self, peer: str) -> None:
        self._up.add(peer)
        if peer not in self._queue:
            self._queue.append(peer)

    def on_peer_down(self, peer: str) -> None:
        self._up.discard(peer)
        if peer in self._queue:
            self._queue.remove(peer)
        if self._active is not None and self._active.peer == peer:
            self._end(self._active.peer, 0, aborted=True)

    def poll(self, now_ms: int) -> list[AeAction]:
        """Start the next exchange when none runs (also the periodic ones); time one out."""
        active = self._active
        if active is not None and now_ms - active.started_ms > self.timeout_ms:
            self._end(active.peer, now_ms, aborted=True)
        for peer in sorted(self._up):
            if peer not in self._queue and now_ms - self._last.get(peer, now_ms) > \
                    self.interval_ms:
                self._queue.append(peer)
        if self._active is not None or not self._queue:
            return []
        peer = self._queue.pop(0)
        self._exchange += 1
        self._active = _Active(peer, self._exchange, now_ms)
        self.counters["exchanges"] += 1
        digests, counts = self.index.digest()
        return [SendDigest(peer, self._exchange, digests, counts)]

    def on_versions(self, peer: str, exchange: int, buckets: Sequence[int],
                    versions: Iterable[tuple[str, Version]], now_ms: int) -> list[AeAction]:
        """The peer's versions in the differing buckets: request what it has newer."""
        if not self._is_active(peer, exchange):
            return []
        wanted = []
        for topic, version in versions:
            if (mine := self.index.version(topic)) is not None and version <= mine:
                continue
            if self._refused.get(topic) == version:
                self.counters["refused_skipped"] += 1
                continue
            wanted.append(topic)
        if not wanted:
            self._end(peer, now_ms, in_sync=not buckets)
            return []
        self.counters["pulled"] += len(wanted)
        return [SendRequest(peer, exchange, tuple(wanted))]

    def on_refused(self, topic: str, version: Version) -> None:
        """A peer's entry of this version was refused (the replicator's `invalid`): later
        exchanges do not ask for it again (the digests keep differing; only a newer version
        of the topic is asked for). The newest REFUSED_KEPT are remembered."""
        self._refused[topic] = version
        self._refused.move_to_end(topic)
        while len(self._refused) > REFUSED_KEPT:
            self._refused.popitem(last=False)

    def on_entries_done(self, peer: str, exchange: int, now_ms: int) -> None:
        """The last frame answering our request arrived (its entries are merged)."""
        if self._is_active(peer, exchange):
            self._end(peer, now_ms)

    def active(self) -> str | None:
        return None if self._active is None else self._active.peer

    def _is_active(self, peer: str, exchange: int) -> bool:
        return self._active is not None and self._active.peer == peer and \
            self._active.exchange == exchange

    def _end(self, peer: str, now_ms: int, aborted: bool = False, in_sync: bool = False) -> None:
        self._active = None
        if aborted:
            self.counters["aborted"] += 1
        else:
            self._last[peer] = now_ms
        if in_sync:
            self.counters["in_sync"] += 1

    # ---- responder -----------------------------------------------------------------------
    def on_digest(self, peer: str, exchange: int, digests: Sequence[int],
                  counts: Sequence[int]) -> list[AeAction]:
        """A peer's digest: whole buckets where it has nothing, versions for the others (the
        versions frame comes last, so the peer knows the whole buckets have arrived)."""
        differing = self.index.differing(list(digests), list(counts))
        empty = [b for b in differing if b >= len(counts) or counts[b] == 0]
        others = [b for b in differing if b < len(counts) and counts[b] > 0]
        actions: list[AeAction] = []
        whole = tuple(self.index.in_buckets(empty))
        if whole:
            self.counters["served"] += len(whole)
            actions.append(ReplyEntries(peer, exchange, whole, last=False))
        versions = tuple((e.topic, e.version) for e in self.index.in_buckets(others))
        actions.append(ReplyVersions(peer, exchange, tuple(differing), versions))
        return actions

    def on_request(self, peer: str, exchange: int, topics: Iterable[str]) -> list[AeAction]:
        entries = tuple(e for t in topics if (e := self.index.get(t)) is not None)
        self.counters["served"] += len(entries)
        return [ReplyEntries(peer, exchange, entries, last=True)]
