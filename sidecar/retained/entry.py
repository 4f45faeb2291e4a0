"""Retained entries: one topic's retained message (or tombstone) with its version (sans-IO)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import NamedTuple

from sidecar.hlc import LOGICAL_BITS
from sidecar.message import MessageProperties

BUCKETS = 256
"""Digest buckets; a topic's bucket is a hash of the topic, the same on every node."""


class Version(NamedTuple):
    """Last-writer-wins order: the HLC of the write, then the origin node (tie-break)."""

    hlc: int
    origin: str


@dataclass(frozen=True)
class RetainedEntry:
    """What the cluster holds for one topic. `deleted`: a tombstone (an empty retained publish).
    `expires_at_ms`: wall time when the MQTT v5 Message Expiry Interval ends (None: never).
    `properties.message_expiry` is always None here: the remaining time is computed on use."""

    topic: str
    hlc: int
    origin: str
    payload: bytes = b""
    qos: int = 0
    properties: MessageProperties = MessageProperties()
    deleted: bool = False
    expires_at_ms: int | None = None

    @property
    def version(self) -> Version:
        return Version(self.hlc, self.origin)

    def live(self, now_ms: int) -> bool:
        """A retained message Mosquitto should hold now (not deleted, not expired)."""
        return not self.deleted and (self.expires_at_ms is None or self.expires_at_ms > now_ms)

    def remaining_expiry(self, now_ms: int) -> int | None:
        """Seconds of Message Expiry left (rounded up, at least 1), None if it never expires."""
        if self.expires_at_ms is None:
            return None
        return max(1, -(-(self.expires_at_ms - now_ms) // 1000))

    def tombstone_of_expiry(self) -> RetainedEntry:
        """The same version without its value (an expired message is sent like this)."""
        return replace(self, payload=b"", deleted=True, properties=MessageProperties(),
                       expires_at_ms=None)


def dead_before(entry: RetainedEntry, horizon_ms: int) -> bool:
    """Whether `entry` holds no value since before `horizon_ms` (wall ms): a tombstone written
    then (HLC time), or a message expired then. Such entries can be forgotten once every node
    has them; a copy older than the horizon is no longer accepted."""
    if entry.deleted:
        return entry.hlc >> LOGICAL_BITS < horizon_ms
    return entry.expires_at_ms is not None and entry.expires_at_ms < horizon_ms


def version_hash(topic: str, version: Version) -> int:
    """64-bit hash of a topic's version: digests XOR these, so equal sets give equal digests."""
    data = b"%s\0%d\0%s" % (topic.encode(), version.hlc, version.origin.encode())
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def bucket_of(topic: str, buckets: int = BUCKETS) -> int:
    """The digest bucket of `topic`."""
    digest = hashlib.blake2b(topic.encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") % buckets
