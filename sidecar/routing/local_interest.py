"""This node's interest as peers see it: versioned snapshots and deltas (sans-IO core).

`LocalInterest` turns the subscription table's `InterestAdded`/`InterestRemoved` changes into a
versioned key set. Changes fed together become one delta (coalesced: a key added and removed
again cancels out); `apply_chunked` splits a large one into consecutive deltas of at most
`max_keys` keys, and `snapshot_chunks` splits the whole interest the same way, so no frame grows
with the interest held.

Keys added within the last `keep_ms` keep their subscribe time (`InterestAdded.at_ms`): deltas
and snapshot chunks carry it in `since`, for the peers' catch-up (sidecar.routing.catchup).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import islice

from sidecar.routing.table import InterestAdded, InterestChange, InterestKey, InterestRemoved

__all__ = ["CHUNK_KEYS", "KEEP_SINCE_MS", "InterestDelta", "InterestSnapshot", "LocalInterest"]

CHUNK_KEYS = 5000
"""Keys per delta or snapshot chunk sent to peers (about 150 KB on the wire)."""

KEEP_SINCE_MS = 10_000
"""How long an added key's subscribe time is kept for snapshots (a peer's catch-up window is
far shorter; an older time is no use to it)."""


@dataclass(frozen=True)
class InterestSnapshot:
    """A node's whole interest at `version`, or one chunk of it: chunk 0 starts a snapshot, the
    receiver collects the chunks until the `last` one, then applies their union."""

    version: int
    keys: frozenset[InterestKey]
    chunk: int = 0
    last: bool = True
    since: Mapping[InterestKey, int] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class InterestDelta:
    """A node's interest changes from `from_version` to `to_version`."""

    from_version: int
    to_version: int
    added: frozenset[InterestKey] = frozenset()
    removed: frozenset[InterestKey] = frozenset()
    since: Mapping[InterestKey, int] = field(default_factory=dict, compare=False)


class LocalInterest:
    """This node's interest as sent to peers: a key set with a version bumped on every change.

    Send `snapshot()` (or its chunks) on every stream (re)connect, then each delta `apply`
    returns, in order.
    """

    def __init__(self, keep_ms: int = KEEP_SINCE_MS) -> None:
        self.version = 0
        self._keys: set[InterestKey] = set()
        # recently added keys, oldest first: an OrderedDict, whose first entry is found in O(1)
        # (a dict's iterator skips every entry deleted before it: forgetting 100,000 times
        # one by one cost O(n^2), 8 s of a blocked loop after a bulk subscribe)
        self._since: OrderedDict[InterestKey, int] = OrderedDict()
        self._keep_ms = keep_ms

    def __len__(self) -> int:
        return len(self._keys)

    def apply(self, changes: Iterable[InterestChange]) -> InterestDelta | None:
        """Apply table changes; return the delta to broadcast, or None if nothing changed."""
        deltas = self.apply_chunked(changes, max_keys=0)
        return deltas[0] if deltas else None

    def apply_chunked(self, changes: Iterable[InterestChange],
                      max_keys: int = CHUNK_KEYS) -> list[InterestDelta]:
        """Apply table changes; return the deltas to broadcast in order, each with at most
        `max_keys` keys (0: no limit). Costs O(changes)."""
        added: set[InterestKey] = set()
        removed: set[InterestKey] = set()
        keys = self._keys
        since = self._since
        newest = 0
        for change in changes:
            key = change.key
            if isinstance(change, InterestAdded) and key not in keys:
                keys.add(key)
                if change.at_ms is not None:
                    since[key] = change.at_ms
                    newest = max(newest, change.at_ms)
                if key in removed:
                    removed.discard(key)
                else:
                    added.add(key)
            elif isinstance(change, InterestRemoved) and key in keys:
                keys.discard(key)
                since.pop(key, None)
                if key in added:
                    added.discard(key)
                else:
                    removed.add(key)
        self._forget_since(newest)
        if not added and not removed:
            return []
        limit = max_keys or len(added) + len(removed)
        deltas = []
        rem, add = iter(removed), iter(added)
        left = len(added) + len(removed)
        while left:
            part_removed = frozenset(islice(rem, limit))
            part_added = frozenset(islice(add, limit - len(part_removed)))
            left -= len(part_removed) + len(part_added)
            deltas.append(InterestDelta(self.version, self.version + 1, part_added,
                                        part_removed, self._times(part_added)))
            self.version += 1
        return deltas

    def _times(self, keys: Iterable[InterestKey]) -> dict[InterestKey, int]:
        since = self._since
        return {k: since[k] for k in keys if k in since}

    def _forget_since(self, newest: int) -> None:
        """Drop subscribe times older than `keep_ms` before `newest` (O(dropped))."""
        since = self._since
        limit = newest - self._keep_ms
        while since:
            key = next(iter(since))
            if since[key] >= limit:
                break
            since.popitem(last=False)

    def snapshot(self) -> InterestSnapshot:
        """The whole interest at the current version."""
        keys = frozenset(self._keys)
        return InterestSnapshot(self.version, keys, since=self._times(self._since))

    def snapshot_chunks(self, max_keys: int = CHUNK_KEYS) -> Iterator[InterestSnapshot]:
        """The whole interest at the current version in chunks of at most `max_keys` keys (at
        least one chunk; the last one has `last` True). Take them all before the next change."""
        keys = iter(list(self._keys))
        part = frozenset(islice(keys, max_keys))
        index = 0
        while True:
            following = frozenset(islice(keys, max_keys))
            yield InterestSnapshot(self.version, part, index, last=not following,
                                   since=self._times(part))
            if not following:
                return
            part, index = following, index + 1
