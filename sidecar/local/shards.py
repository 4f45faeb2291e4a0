"""Forwarding shards: which connection holds a forwarding subscription (core).

Mosquitto 2.0.11 scans a client's whole array of subscriptions for every SUBSCRIBE and
UNSUBSCRIBE of a filter (`sub__add_context`, `sub__remove_normal`), so one connection taking N
filters costs it O(N²). The forwarding subscriptions are therefore spread over K connections:
shard 0 is `<sidecar_id>.fwd` (which also re-injects peers' messages), shard k > 0 is
`<sidecar_id>.fwd<k>`. A filter's shard is a stable hash of the filter (the same in every
run: the shards' persistent sessions keep their subscriptions across a sidecar restart).

Packet ids are per connection; a copy's id outside its shard is `shard << 16 | packet id`
(`global_mid`), so shard 0's copies keep their packet ids and one forwarder keys them all.
"""

from __future__ import annotations

from zlib import crc32

MAX_SHARDS = 64
"""The plugin knows `.fwd` and `.fwd1` .. `.fwd63` (FWD_SHARDS_MAX)."""
MID_BITS = 16
"""Packet ids are below 2**16."""


def shard_of(filter: str, shards: int) -> int:
    """The shard (0 .. shards - 1) holding `filter`'s forwarding subscription."""
    if shards <= 1:
        return 0
    return crc32(filter.encode()) % shards


def client_ids(sidecar_id: str, shards: int) -> list[str]:
    """The forwarding connections' client ids, shard 0 first."""
    base = sidecar_id + ".fwd"
    return [base] + [f"{base}{k}" for k in range(1, shards)]


def global_mid(shard: int, mid: int) -> int:
    """A copy's packet id, unique over the shards."""
    return shard << MID_BITS | mid


def split_mid(gmid: int) -> tuple[int, int]:
    """(shard, packet id) of a `global_mid`."""
    return gmid >> MID_BITS, gmid & ((1 << MID_BITS) - 1)


def mid_range(shard: int) -> range:
    """Every `global_mid` of `shard`."""
    return range(shard << MID_BITS, (shard + 1) << MID_BITS)
