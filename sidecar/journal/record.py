"""The plugin's journal files (sans-IO): records, fingerprints, and the entries a run left
unconfirmed.

Format (little endian; deploy/mosquitto-plugin/src/journal.c writes it): ``MQFJRNL1``, then
records. A message: ``M``, qos, retain, 0, u32 topic length, u32 payload length, u32
properties length, u64 seq, u64 fingerprint, i64 wall-clock ms, then the topic, the payload and
the properties as the plugin protocol's JSON. A trim: ``T``, 0, 0, 0, u32 count, then count u64
seqs (those entries were confirmed). A record cut short (the machine stopped mid-write) ends
the file.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass, field

from sidecar.local.events import ProtocolError, properties_from_json
from sidecar.message import MessageProperties

MAGIC = b"MQFJRNL1"
FILE_PREFIX = "journal-"
FILE_SUFFIX = ".bin"
_MSG = struct.Struct("<BBBxIIIQQq")
_TRIM = struct.Struct("<BxxxI")


def fingerprint(topic: str, payload: bytes) -> int:
    """What a copy is named by when confirmed: CRC-32 of the topic (high half) and of the
    payload (low half), as the plugin computes it."""
    return (zlib.crc32(topic.encode()) << 32) | zlib.crc32(payload)


def pack_fingerprints(fps: list[int]) -> bytes:
    """The `confirm` command's bytes: 8 little-endian bytes per fingerprint."""
    return struct.pack(f"<{len(fps)}Q", *fps)


@dataclass(frozen=True)
class JournalEntry:
    """One message the plugin journaled: acknowledged to its publisher, wanted by peers."""

    seq: int
    qos: int
    retain: bool
    wall_ms: int
    topic: str
    payload: bytes
    properties: MessageProperties = MessageProperties()


@dataclass
class JournalContents:
    """What a journal file holds: `entries` never confirmed (oldest first), counts, and why
    reading stopped early (`problem`, or None)."""

    entries: list[JournalEntry] = field(default_factory=list)
    written: int = 0
    trimmed: int = 0
    problem: str | None = None


def _properties(raw: bytes) -> MessageProperties:
    if not raw:
        return MessageProperties()
    try:
        return properties_from_json(json.loads(raw))
    except (ValueError, ProtocolError):
        return MessageProperties()  # the message still counts more than its properties


def parse(data: bytes) -> JournalContents:
    """The unconfirmed entries of a journal file's bytes."""
    out = JournalContents()
    if data[:len(MAGIC)] != MAGIC:
        out.problem = "not a journal file (no MQFJRNL1 header)"
        return out
    live: dict[int, JournalEntry] = {}
    pos, end = len(MAGIC), len(data)
    while pos < end:
        kind = data[pos]
        if kind == ord("M"):
            if pos + _MSG.size > end:
                out.problem = "a record cut short"
                break
            _, qos, retain, tlen, plen, prlen, seq, _fp, wall_ms = _MSG.unpack_from(data, pos)
            body = pos + _MSG.size
            stop = body + tlen + plen + prlen
            if stop > end:
                out.problem = "a record cut short"
                break
            topic = data[body:body + tlen].decode("utf-8", "replace")
            payload = data[body + tlen:body + tlen + plen]
            props = _properties(data[body + tlen + plen:stop])
            live[seq] = JournalEntry(seq, qos, bool(retain), wall_ms, topic, payload, props)
            out.written += 1
            pos = stop
        elif kind == ord("T"):
            if pos + _TRIM.size > end:
                out.problem = "a record cut short"
                break
            _, count = _TRIM.unpack_from(data, pos)
            stop = pos + _TRIM.size + 8 * count
            if stop > end:
                out.problem = "a record cut short"
                break
            for (seq,) in struct.iter_unpack("<Q", data[pos + _TRIM.size:stop]):
                if live.pop(seq, None) is not None:
                    out.trimmed += 1
            pos = stop
        else:
            out.problem = f"an unknown record type {kind:#x} at byte {pos}"
            break
    out.entries = [live[s] for s in sorted(live)]
    return out


def encode_message(seq: int, qos: int, retain: bool, wall_ms: int, topic: str, payload: bytes,
                   properties_json: bytes = b"") -> bytes:
    """One message record as the plugin writes it (tests, tools)."""
    t = topic.encode()
    return (_MSG.pack(ord("M"), qos, int(retain), len(t), len(payload), len(properties_json),
                      seq, fingerprint(topic, payload), wall_ms)
            + t + payload + properties_json)


def encode_trim(seqs: list[int]) -> bytes:
    """One trim record (tests, tools)."""
    return _TRIM.pack(ord("T"), len(seqs)) + struct.pack(f"<{len(seqs)}Q", *seqs)
