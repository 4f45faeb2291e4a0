"""The benchmark payload: a fixed header (publisher, sequence, publish time) plus padding."""

from __future__ import annotations

import struct
from typing import NamedTuple

HEADER = struct.Struct("!HIQ")  # publisher index, sequence number, publish time (ns, wall)
HEADER_SIZE = HEADER.size
MIN_SIZE = HEADER_SIZE


class Stamp(NamedTuple):
    """What a payload says about its message."""

    publisher: int
    seq: int
    published_ns: int


def encode(publisher: int, seq: int, published_ns: int, size: int) -> bytes:
    """A payload of `size` bytes (at least the header) carrying its publisher, seq and time."""
    return HEADER.pack(publisher, seq, published_ns) + bytes(max(0, size - HEADER_SIZE))


def decode(payload: bytes) -> Stamp | None:
    """The stamp of a benchmark payload, or None if the payload is too short to be one."""
    if len(payload) < HEADER_SIZE:
        return None
    return Stamp(*HEADER.unpack_from(payload))
