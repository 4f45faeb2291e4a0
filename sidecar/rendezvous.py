"""Rendezvous (highest random weight) hashing: the one node of a set that acts for a key.

Every node that sees the same set picks the same node; when a node leaves the set, only the
keys it had move (to their next highest weight)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def weight(key: str, node: str) -> int:
    """A stable 64-bit weight of (key, node), the same on every node and in every process."""
    digest = hashlib.blake2b(f"{key}\x00{node}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def ranked(key: str, nodes: Iterable[str]) -> list[str]:
    """`nodes` from the highest weight for `key` down (ties by node id)."""
    return sorted(nodes, key=lambda n: (weight(key, n), n), reverse=True)


def choose(key: str, nodes: Iterable[str]) -> str | None:
    """The node with the highest weight for `key` (None for no nodes; ties by node id)."""
    return max(nodes, key=lambda n: (weight(key, n), n), default=None)
