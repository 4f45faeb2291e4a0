"""`RetainedIndex`: last-writer-wins map topic -> entry with per-bucket digests (sans-IO)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator

from sidecar.retained.entry import (
    BUCKETS,
    RetainedEntry,
    Version,
    bucket_of,
    dead_before,
    version_hash,
)


class RetainedIndex:
    """Holds the newest entry per topic. `merge` is commutative, associative and idempotent,
    so nodes that saw the same writes in any order hold the same index (and digest)."""

    def __init__(self, entries: Iterable[RetainedEntry] = (), buckets: int = BUCKETS) -> None:
        self.buckets = buckets
        self._entries: dict[str, RetainedEntry] = {}
        self._bucket_of: dict[str, int] = {}
        self._digest = [0] * buckets
        self._counts = [0] * buckets
        self._members: list[set[str]] = [set() for _ in range(buckets)]
        self._mortal: set[str] = set()  # topics whose entry is a tombstone or expires
        self.horizon_ms = 0  # dead entries (see `dead_before`) older than this are not kept
        for entry in entries:
            self.merge(entry)

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[RetainedEntry]:
        return iter(self._entries.values())

    def get(self, topic: str) -> RetainedEntry | None:
        return self._entries.get(topic)

    def version(self, topic: str) -> Version | None:
        entry = self._entries.get(topic)
        return None if entry is None else entry.version

    def newer(self, entry: RetainedEntry) -> bool:
        """Whether `entry` would replace what the index holds for its topic."""
        current = self._entries.get(entry.topic)
        return current is None or entry.version > current.version

    def merge(self, entry: RetainedEntry) -> bool:
        """Keep `entry` if it is newer than the topic's current one and not dead before the
        horizon (a purged tombstone sent back by a peer that has not purged it yet); True if
        it was kept."""
        if not self.newer(entry) or dead_before(entry, self.horizon_ms):
            return False
        topic = entry.topic
        old = self._entries.get(topic)
        bucket = self._bucket_of.get(topic)
        if bucket is None:
            bucket = self._bucket_of[topic] = bucket_of(topic, self.buckets)
        if old is None:
            self._counts[bucket] += 1
            self._members[bucket].add(topic)
        else:
            self._digest[bucket] ^= version_hash(topic, old.version)
        self._digest[bucket] ^= version_hash(topic, entry.version)
        self._entries[topic] = entry
        if entry.deleted or entry.expires_at_ms is not None:
            self._mortal.add(topic)
        else:
            self._mortal.discard(topic)
        return True

    def purge(self, horizon_ms: int, busy: Callable[[str], bool]) -> list[RetainedEntry]:
        """Forget tombstones and expired entries dead since before `horizon_ms` (every node
        applies the same rule, so digests agree again once all have purged), except topics
        `busy` says are in flight. Raises the horizon; returns the forgotten entries."""
        self.horizon_ms = max(self.horizon_ms, horizon_ms)
        gone = [self._entries[t] for t in self._mortal
                if dead_before(self._entries[t], self.horizon_ms) and not busy(t)]
        for entry in gone:
            bucket = self._bucket_of.pop(entry.topic)
            self._digest[bucket] ^= version_hash(entry.topic, entry.version)
            self._counts[bucket] -= 1
            self._members[bucket].discard(entry.topic)
            self._mortal.discard(entry.topic)
            del self._entries[entry.topic]
        return gone

    def digest(self) -> tuple[list[int], list[int]]:
        """(per-bucket XOR of version hashes, per-bucket entry counts)."""
        return list(self._digest), list(self._counts)

    def summary(self) -> str:
        """One hex string for the whole index (equal iff the bucket digests are equal)."""
        data = b"".join(d.to_bytes(8, "little") for d in self._digest)
        return hashlib.blake2b(data, digest_size=8).hexdigest()

    def differing(self, digests: list[int], counts: list[int]) -> list[int]:
        """Buckets whose digest or count differs from a peer's."""
        if len(digests) != self.buckets or len(counts) != self.buckets:
            return list(range(self.buckets))
        return [b for b in range(self.buckets)
                if digests[b] != self._digest[b] or counts[b] != self._counts[b]]

    def in_buckets(self, buckets: Iterable[int]) -> list[RetainedEntry]:
        """Every entry (tombstones included) of these buckets."""
        return [self._entries[t] for b in buckets for t in sorted(self._members[b])]

    def max_hlc(self) -> int:
        return max((e.hlc for e in self._entries.values()), default=0)

    def counts(self, now_ms: int) -> dict[str, int]:
        live = sum(1 for e in self._entries.values() if e.live(now_ms))
        deleted = sum(1 for e in self._entries.values() if e.deleted)
        return {"entries": len(self._entries), "live": live, "tombstones": deleted,
                "expired": len(self._entries) - live - deleted}
