"""MQFB batches: messages crossing nodes as one binary blob (pure; issue 25).

The plugin parses the same layout (`deploy/mosquitto-plugin/src/batch.c`); the contract is
docs/plugin-protocol.md, "Batches". Little-endian framing:

    batch  = b"MQFB" u8 version u8 flags u16 count u64 batch-id, then `count` records
    record = u32 length (of what follows) u8 kind u8 flags (QoS bits 0-1, retain bit 2)
             u64 seq u64 hlc u16 topic_len topic u16 client_len client
             [u16 origin_len origin: with flag bit 3] u32 props_len props u32 payload_len payload

A cut (kind 2, docs/architecture.md §5 "Exactly once across a move under traffic") names the
session's client id as `client`, the node that cut as `origin`, the cut as `seq` and when it
was made as `hlc`; its topic, properties and payload are empty.

`props` is the MQTT v5 property encoding (big-endian fields, one-byte identifiers) of what a
PUBLISH may carry to a subscriber. The sidecar publishes a batch to `$CONTROL/mqfed/inject`;
the plugin re-injects every message and answers on `INJECT_REPLY`. A QoS 0 publish to
`WAKE_TOPIC` (no handler: Mosquitto reads it and does nothing) wakes an idle Mosquitto whose
answer waits for its next socket event (`sidecar.routing.injection`).
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from sidecar.message import MessageProperties

INJECT_TOPIC = "$CONTROL/mqfed/inject"
INJECT_REPLY = "$SYS/broker/mqfed/replies/inject"
WAKE_TOPIC = "$CONTROL/mqfed/wake"
MAGIC = b"MQFB"
VERSION = 1
KIND_MESSAGE = 1
KIND_CUT = 2
FLAG_ORIGIN = 0x08
MAX_RECORDS = 65535

_HEADER = struct.Struct("<4sBBHQ")
HEADER_SIZE = _HEADER.size
RECORD_FIXED = struct.Struct("<IBBQQ")
"""A record's fixed part: length (after itself), kind, flags, seq, hlc."""
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")

_PAYLOAD_FORMAT, _EXPIRY, _CONTENT_TYPE = 0x01, 0x02, 0x03
_RESPONSE_TOPIC, _CORRELATION, _USER = 0x08, 0x09, 0x26
NO_PROPERTIES = MessageProperties()


class BatchError(ValueError):
    """A batch that does not follow the layout."""


class Record(NamedTuple):
    """One message of a batch."""

    topic: str
    payload: bytes
    qos: int
    retain: bool = False
    seq: int = 0
    hlc: int = 0
    client: str = ""
    properties: MessageProperties = NO_PROPERTIES
    kind: int = KIND_MESSAGE
    origin: str = ""
    """The node it was published on (with a cut: the node that cut); "": not said."""


def cut_record(client: str, origin: str, seq: int, hlc: int = 0) -> Record:
    """A session's cut: `origin`'s messages below `seq` go to `client`'s old copy, the rest to
    its new one; `hlc`: when `origin` made it (an older cut than the client's disconnect
    there is another move's)."""
    return Record("", b"", 0, seq=seq, hlc=hlc, client=client, kind=KIND_CUT, origin=origin)


def _mqtt_str(data: bytes) -> bytes:
    if len(data) > 0xFFFF:
        raise BatchError("an MQTT string or binary property is longer than 65,535 bytes")
    return struct.pack(">H", len(data)) + data


def encode_properties(p: MessageProperties) -> bytes:
    """The MQTT v5 encoding of `p` (no length prefix)."""
    out = bytearray()
    if p.payload_format is not None:
        out += bytes((_PAYLOAD_FORMAT, p.payload_format))
    if p.message_expiry is not None:
        out += bytes((_EXPIRY,)) + struct.pack(">I", p.message_expiry)
    if p.content_type is not None:
        out += bytes((_CONTENT_TYPE,)) + _mqtt_str(p.content_type.encode())
    if p.response_topic is not None:
        out += bytes((_RESPONSE_TOPIC,)) + _mqtt_str(p.response_topic.encode())
    if p.correlation_data is not None:
        out += bytes((_CORRELATION,)) + _mqtt_str(p.correlation_data)
    for k, v in p.user:
        out += bytes((_USER,)) + _mqtt_str(k.encode()) + _mqtt_str(v.encode())
    return bytes(out)


def encode_record(r: Record) -> bytes:
    """One record, length-prefixed."""
    if r.qos not in (0, 1, 2):
        raise BatchError(f"QoS {r.qos} is not 0, 1 or 2")
    if not 0 <= r.kind <= 255:
        raise BatchError(f"record kind {r.kind} is not a byte")
    topic, client, origin = r.topic.encode(), r.client.encode(), r.origin.encode()
    if len(topic) > 0xFFFF or len(client) > 0xFFFF or len(origin) > 0xFFFF:
        raise BatchError("topic, client id or origin longer than 65,535 bytes")
    props = encode_properties(r.properties) if r.properties != NO_PROPERTIES else b""
    body = b"".join((
        _U16.pack(len(topic)), topic, _U16.pack(len(client)), client,
        _U16.pack(len(origin)) + origin if origin else b"",
        _U32.pack(len(props)), props, _U32.pack(len(r.payload)), r.payload))
    flags = r.qos | (4 if r.retain else 0) | (FLAG_ORIGIN if origin else 0)
    return RECORD_FIXED.pack(18 + len(body), r.kind, flags, r.seq, r.hlc) + body


def encode_batch(batch_id: int, records: list[Record] | list[bytes]) -> bytes:
    """A batch of records (or of records already encoded with `encode_record`)."""
    if len(records) > MAX_RECORDS:
        raise BatchError(f"{len(records)} records: at most {MAX_RECORDS} per batch")
    parts = [r if isinstance(r, bytes) else encode_record(r) for r in records]
    return _HEADER.pack(MAGIC, VERSION, 0, len(parts), batch_id) + b"".join(parts)


def _take(data: bytes, pos: int, end: int, n: int, what: str) -> tuple[bytes, int]:
    if pos + n > end:
        raise BatchError(f"{what} runs past its record")
    return data[pos:pos + n], pos + n


def _utf8(raw: bytes, what: str) -> str:
    try:
        text = raw.decode()
    except UnicodeDecodeError as exc:
        raise BatchError(f"{what} is not valid UTF-8") from exc
    if "\x00" in text:
        raise BatchError(f"{what} contains NUL")
    return text


def decode_properties(data: bytes) -> MessageProperties:
    """The inverse of `encode_properties`; anything else is a BatchError."""
    pos, seen = 0, set()
    fields: dict = {"user": []}

    def mqtt_str(pos: int, what: str) -> tuple[bytes, int]:
        raw_len, pos = _take(data, pos, len(data), 2, what)
        return _take(data, pos, len(data), struct.unpack(">H", raw_len)[0], what)

    while pos < len(data):
        pid = data[pos]
        pos += 1
        if pid != _USER:
            if pid in seen:
                raise BatchError(f"property 0x{pid:02x} twice")
            seen.add(pid)
        if pid == _PAYLOAD_FORMAT:
            raw, pos = _take(data, pos, len(data), 1, "payload format")
            if raw[0] > 1:
                raise BatchError("payload format indicator is not 0 or 1")
            fields["payload_format"] = raw[0]
        elif pid == _EXPIRY:
            raw, pos = _take(data, pos, len(data), 4, "message expiry")
            fields["message_expiry"] = struct.unpack(">I", raw)[0]
        elif pid in (_CONTENT_TYPE, _RESPONSE_TOPIC):
            raw, pos = mqtt_str(pos, "property")
            key = "content_type" if pid == _CONTENT_TYPE else "response_topic"
            fields[key] = _utf8(raw, key.replace("_", " "))
        elif pid == _CORRELATION:
            fields["correlation_data"], pos = mqtt_str(pos, "correlation data")
        elif pid == _USER:
            k, pos = mqtt_str(pos, "user property")
            v, pos = mqtt_str(pos, "user property")
            fields["user"].append((_utf8(k, "user property"), _utf8(v, "user property")))
        else:
            raise BatchError(f"property 0x{pid:02x} cannot travel with a message")
    fields["user"] = tuple(fields["user"])
    return MessageProperties(**fields)


def record_fields(data: bytes, pos: int, end: int, flags: int
                  ) -> tuple[bytes, bytes, bytes, bytes, int]:
    """The topic, client id, origin (b"" without `FLAG_ORIGIN`) and properties of the record
    at `pos` that ends at `end` (its header read: `flags`), and where its payload starts;
    BatchError if its lengths do not add up to `end`."""
    u16, u32 = _U16.unpack_from, _U32.unpack_from
    p = pos + RECORD_FIXED.size
    try:
        n = u16(data, p)[0]
        topic = data[p + 2:p + 2 + n]
        p += 2 + n
        n = u16(data, p)[0]
        client = data[p + 2:p + 2 + n]
        p += 2 + n
        origin = b""
        if flags & FLAG_ORIGIN:
            n = u16(data, p)[0]
            origin = data[p + 2:p + 2 + n]
            p += 2 + n
        n = u32(data, p)[0]
        props = data[p + 4:p + 4 + n]
        p += 4 + n
        payload_at = p + 4
        p += 4 + u32(data, p)[0]
    except struct.error:
        p = end + 1
    if p > end:
        raise BatchError("a field runs past its record")
    if p != end:
        raise BatchError(f"{end - p} bytes after its payload")
    return topic, client, origin, props, payload_at


def decode_batch(data: bytes) -> tuple[int, list[Record]]:
    """(batch id, records) of a batch; a BatchError says what is wrong."""
    if len(data) < _HEADER.size:
        raise BatchError("shorter than a batch header")
    magic, version, _flags, count, batch_id = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise BatchError("not an MQFB batch")
    if version != VERSION:
        raise BatchError(f"batch version {version}, expected {VERSION}")
    pos, records, total = _HEADER.size, [], len(data)
    for i in range(count):  # (lean: on the capture path once per message)
        if pos + RECORD_FIXED.size > total:
            raise BatchError(f"record {i}: shorter than a record header")
        length, kind, flags, seq, hlc = RECORD_FIXED.unpack_from(data, pos)
        end = pos + 4 + length
        if end > total or length < 30:
            raise BatchError(f"record {i}: length {length} does not fit")
        if flags & ~(7 | FLAG_ORIGIN) or (flags & 3) == 3:
            raise BatchError(f"record {i}: bad flags 0x{flags:02x}")
        try:
            topic, client, origin, props, at = record_fields(data, pos, end, flags)
        except BatchError as exc:
            raise BatchError(f"record {i}: {exc}") from None
        payload = data[at:end]
        records.append(Record(
            _utf8(topic, "topic"), payload, flags & 3, bool(flags & 4), seq, hlc,
            _utf8(client, "client id"), decode_properties(props) if props else NO_PROPERTIES,
            kind, _utf8(origin, "origin")))
        pos = end
    if pos != len(data):
        raise BatchError(f"{len(data) - pos} bytes after the last record")
    return batch_id, records
