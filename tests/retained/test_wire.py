"""Retained frames: chunks stay below the peer frame limit; an entry too large for any frame
goes as its version only (peers hold it as deleted, so anti-entropy agrees and stops)."""

from __future__ import annotations

from sidecar._proto import peer_pb2
from sidecar.retained.entry import RetainedEntry
from sidecar.retained.wire import entries_frames, entry_from_proto

NOW = 1_700_000_000_000
LIMIT = 64 << 10


def _entries(frames: list[bytes]) -> list[peer_pb2.RetainedEntry]:
    return [e for data in frames for e in peer_pb2.Frame.FromString(data).retained_entries.entries]


def test_an_entry_above_the_frame_limit_goes_as_its_version_only():
    small = [RetainedEntry(f"t/{i}", 10 + i, "n1", b"v" * 100) for i in range(3)]
    big = RetainedEntry("t/big", 99, "n1", b"x" * (LIMIT + 1), qos=1)
    told: list[tuple[str, int]] = []
    frames = list(entries_frames([small[0], big, *small[1:]], NOW, exchange=7, last=True,
                                 max_frame=LIMIT, too_large=lambda e, n: told.append((e.topic, n))))
    assert all(len(f) <= LIMIT for f in frames)
    assert told and told[0][0] == "t/big" and told[0][1] > LIMIT
    got = {e.topic: e for e in _entries(frames)}
    assert [got[e.topic].payload for e in small] == [b"v" * 100] * 3  # the others intact
    marker = got["t/big"]
    assert marker.expired and not marker.payload and (marker.hlc, marker.origin_node) == (99, "n1")
    received = entry_from_proto(marker, NOW)
    assert received.deleted and received.version == big.version
    assert peer_pb2.Frame.FromString(frames[-1]).retained_entries.last


def test_entries_near_the_limit_get_frames_of_their_own():
    near = [RetainedEntry(f"t/{i}", i + 1, "n1", b"y" * (LIMIT // 2)) for i in range(3)]
    frames = list(entries_frames(near, NOW, max_frame=LIMIT))
    assert len(frames) == 3 and all(len(f) <= LIMIT for f in frames)
    assert [e.payload for e in _entries(frames)] == [e.payload for e in near]
