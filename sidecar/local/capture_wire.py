"""The capture socket's wire format (pure; issue 25, slice 2).

The plugin (`deploy/mosquitto-plugin/src/capture.c`) connects to a unix stream socket the
sidecar listens on and writes, little-endian (docs/plugin-protocol.md, "Capture socket"):

    hello  = b"MQFH" u8 version(1) u8 0 u16 0 u64 epoch u64 next_seq     (once, first)
    batch  = an MQFB batch (sidecar/local/batch.py), its id the seq of its first record

The sidecar answers on the same socket:

    ack    = b"MQFA" u8 version(1) u8 kind u16 count u64 seq, then `count` u64 seqs

kind 1 (resume, once, after the hello): the sidecar has every record <= seq (and the listed
ones); the plugin sends every other unacknowledged record again, in seq order. kind 2 (ack):
every record <= seq is settled, and the listed seqs above it.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import NamedTuple

from sidecar.local.batch import HEADER_SIZE, MAGIC, BatchError, Record, decode_batch

HELLO_MAGIC = b"MQFH"
ACK_MAGIC = b"MQFA"
VERSION = 1
KIND_RESUME = 1
KIND_ACK = 2
MAX_LISTED = 65535
MAX_RECORD = 1 << 30
"""A record longer than this is refused (the plugin keeps records within Mosquitto's
max_packet_size, at most 256 MiB + headers)."""

_HELLO = struct.Struct("<4sBBHQQ")
_ACK = struct.Struct("<4sBBHQ")
_U32 = struct.Struct("<I")
_U16 = struct.Struct("<H")

HELLO_SIZE = _HELLO.size


class CaptureWireError(ValueError):
    """Bytes on the capture socket that do not follow the format."""


class Hello(NamedTuple):
    """The plugin's hello: its epoch (random per Mosquitto start) and the seq of its next
    new record."""

    epoch: int
    next_seq: int


class CapturedBatch(NamedTuple):
    """One batch of captured records, as decoded, and its bytes."""

    batch_id: int
    records: list[Record]
    raw: bytes

    def record_bytes(self) -> list[bytes]:
        """Each record's own bytes, in order (`records` as the plugin wrote them)."""
        out, pos, raw = [], HEADER_SIZE, self.raw
        for _ in self.records:
            end = pos + 4 + _U32.unpack_from(raw, pos)[0]
            out.append(raw[pos:end])
            pos = end
        return out


def encode_hello(epoch: int, next_seq: int) -> bytes:
    return _HELLO.pack(HELLO_MAGIC, VERSION, 0, 0, epoch, next_seq)


def decode_hello(data: bytes) -> Hello:
    if len(data) != HELLO_SIZE:
        raise CaptureWireError(f"a hello is {HELLO_SIZE} bytes, not {len(data)}")
    magic, version, _r1, _r2, epoch, next_seq = _HELLO.unpack(data)
    if magic != HELLO_MAGIC:
        raise CaptureWireError("not a capture hello")
    if version != VERSION:
        raise CaptureWireError(f"hello version {version}, expected {VERSION}")
    if epoch == 0 or next_seq == 0:
        raise CaptureWireError("a hello with epoch 0 or next_seq 0")
    return Hello(epoch, next_seq)


def _encode_ack(kind: int, seq: int, listed: Iterable[int]) -> bytes:
    seqs = sorted(set(listed))
    if len(seqs) > MAX_LISTED:
        raise CaptureWireError(f"{len(seqs)} listed seqs: at most {MAX_LISTED}")
    if seqs and seqs[0] <= seq:
        raise CaptureWireError("listed seqs must be above the cumulative seq")
    return _ACK.pack(ACK_MAGIC, VERSION, kind, len(seqs), seq) + b"".join(
        struct.pack("<Q", s) for s in seqs)


def encode_resume(seq: int, listed: Iterable[int] = ()) -> bytes:
    """The sidecar has every record <= seq, and those listed."""
    return _encode_ack(KIND_RESUME, seq, listed)


def encode_ack(seq: int, listed: Iterable[int] = ()) -> bytes:
    """Every record <= seq is settled, and those listed (each above seq)."""
    return _encode_ack(KIND_ACK, seq, listed)


def decode_ack(data: bytes) -> tuple[int, int, list[int]]:
    """(kind, seq, listed) of one ack message (for tests and tools)."""
    if len(data) < _ACK.size:
        raise CaptureWireError("shorter than an ack header")
    magic, version, kind, count, seq = _ACK.unpack_from(data)
    if magic != ACK_MAGIC or version != VERSION or kind not in (KIND_RESUME, KIND_ACK):
        raise CaptureWireError("not a capture ack")
    if len(data) != _ACK.size + 8 * count:
        raise CaptureWireError("ack length does not match its count")
    return kind, seq, [struct.unpack_from("<Q", data, _ACK.size + 8 * i)[0]
                       for i in range(count)]


class CaptureDecoder:
    """Splits the plugin's byte stream into its hello and then its batches. Feed bytes as
    they arrive; `feed` returns what became complete. One decoder per connection."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._hello_seen = False
        self._scan_pos = 0        # the next record header to read in the current batch
        self._scan_left = -1      # records of the current batch not scanned (-1: no header)

    def feed(self, data: bytes) -> list[Hello | CapturedBatch]:
        """What `data` completed, in order; CaptureWireError (or BatchError) on bad input."""
        self._buf += data
        out: list[Hello | CapturedBatch] = []
        while True:
            item = self._next()
            if item is None:
                return out
            out.append(item)

    def _next(self) -> Hello | CapturedBatch | None:
        buf = self._buf
        if not self._hello_seen:
            if bytes(buf[:4]) != HELLO_MAGIC[:min(4, len(buf))]:
                raise CaptureWireError("the stream does not begin with a hello")
            if len(buf) < HELLO_SIZE:
                return None
            hello = decode_hello(bytes(buf[:HELLO_SIZE]))
            del buf[:HELLO_SIZE]
            self._hello_seen = True
            return hello
        if self._scan_left < 0:
            if bytes(buf[:4]) != MAGIC[:min(4, len(buf))]:
                raise CaptureWireError("not an MQFB batch")
            if len(buf) < HEADER_SIZE:
                return None
            self._scan_left = _U16.unpack_from(buf, 6)[0]
            self._scan_pos = HEADER_SIZE
        while self._scan_left > 0:
            if len(buf) < self._scan_pos + 4:
                return None
            length = _U32.unpack_from(buf, self._scan_pos)[0]
            if length > MAX_RECORD:
                raise CaptureWireError(f"a record of {length} bytes")
            if len(buf) < self._scan_pos + 4 + length:
                return None
            self._scan_pos += 4 + length
            self._scan_left -= 1
        raw = bytes(buf[:self._scan_pos])
        del buf[:self._scan_pos]
        self._scan_left = -1
        try:
            batch_id, records = decode_batch(raw)
        except BatchError as exc:
            raise CaptureWireError(f"a bad batch: {exc}") from exc
        return CapturedBatch(batch_id, records, raw)
