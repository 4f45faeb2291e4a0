"""Which forwarding connection holds a filter, and copies' ids over shards
(sidecar.local.shards)."""

from __future__ import annotations

from collections import Counter
from zlib import crc32

from sidecar.local.shards import (
    MAX_SHARDS,
    client_ids,
    global_mid,
    mid_range,
    shard_of,
    split_mid,
)


def test_one_shard_holds_everything():
    assert {shard_of(f, 1) for f in ("a", "a/#", "$share/g/x", "")} == {0}


def test_a_filter_s_shard_is_stable_across_runs():
    # crc32 of the UTF-8 bytes, not Python's salted hash(): a restarted sidecar finds each
    # filter on the shard whose session holds it
    assert shard_of("dev/17", 4) == crc32(b"dev/17") % 4
    assert shard_of("ü/#", 7) == crc32("ü/#".encode()) % 7


def test_filters_spread_evenly():
    counts = Counter(shard_of(f"scale/{i // 1000}/{i % 1000}", 4) for i in range(20_000))
    assert set(counts) == {0, 1, 2, 3}
    assert all(4_500 < n < 5_500 for n in counts.values())


def test_client_ids_shard_zero_is_the_forwarding_connection():
    assert client_ids("mqfed-sidecar-ab", 1) == ["mqfed-sidecar-ab.fwd"]
    assert client_ids("s", 3) == ["s.fwd", "s.fwd1", "s.fwd2"]
    assert len(client_ids("s", MAX_SHARDS)) == MAX_SHARDS
    assert client_ids("s", MAX_SHARDS)[-1] == f"s.fwd{MAX_SHARDS - 1}"  # the plugin's last


def test_copy_ids_are_unique_over_shards_and_shard_zero_keeps_packet_ids():
    assert global_mid(0, 41) == 41
    assert split_mid(global_mid(3, 65535)) == (3, 65535)
    assert global_mid(1, 1) != global_mid(2, 1)
    assert global_mid(2, 7) in mid_range(2) and global_mid(2, 7) not in mid_range(1)
    assert 65535 in mid_range(0) and 65536 not in mid_range(0)
