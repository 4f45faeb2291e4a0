"""Plain messages between nodes as MQFB records (capability `records`, issue 25) (pure).

A peer that lists `records` gets each plain delivery (no shared group, no cut, no catch-up
renumbering) as the very record its plugin re-injects (`sidecar.local.batch`): origin
`node/incarnation` (`origin_of`), seq the forwarder's (also the message's first seq), hlc the
origin's. They travel concatenated in `MessageBatch.records`. The receiver reads each record's
header, topic and origin (dedup, checks, acks: `read_records`) and hands the bytes to its
plugin as they are: no envelope is decoded, built or encoded again on that side.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from sidecar.local.batch import (
    FLAG_ORIGIN,
    KIND_MESSAGE,
    NO_PROPERTIES,
    RECORD_FIXED,
    BatchError,
    Record,
    cut_record,
    decode_properties,
    encode_record,
    record_fields,
)
from sidecar.message import MessageProperties
from sidecar.routing.forwarder import Envelope

_U16 = struct.Struct("<H")
_MIN_LENGTH = 18 + 2 + 2 + 2 + 4 + 4   # after the length: an empty record with an origin
_FLAGS = 3 | 4 | FLAG_ORIGIN


def origin_of(node: str, incarnation: int) -> str:
    """How a record names where a message was first forwarded: the node and its sidecar's
    incarnation (the forwarder's seqs start again with a new one)."""
    return f"{node}/{incarnation}"


def record_of(env: Envelope) -> Record:
    """The batch record of a peer's message: named by its publisher (No Local) and by its
    identity (origin and first seq: a moving session's cut mode), where it has them."""
    origin = origin_of(env.origin_node, env.origin_incarnation)
    if env.cut_client:
        return cut_record(env.cut_client, origin, env.first_seq, env.hlc)
    return Record(env.topic, env.payload, env.qos, seq=env.first_seq, hlc=env.hlc,
                  client=env.publisher, properties=env.properties,
                  origin=origin if env.first_seq else "")


def travels_as_record(env: Envelope) -> bool:
    """Whether `env` may go to a `records` peer as a record: a plain delivery under the seq
    it was first forwarded with (a record carries one seq: identity and ack alike)."""
    return (env.shared_group is None and not env.cut_client and not env.subscription_ids
            and env.first_seq == env.origin_seq != 0)


def encode_wire_record(env: Envelope) -> bytes:
    """`env` as a record for the wire (`travels_as_record` must hold); BatchError if the
    record format cannot carry it. A captured message's record is reused: its bytes with
    the forwarder's identity put in (`with_identity`), nothing encoded again."""
    if env.record:
        return with_identity(env.record, origin_of(env.origin_node, env.origin_incarnation),
                             env.origin_seq, env.hlc)
    return encode_record(record_of(env))


def with_identity(record: bytes, origin: str, seq: int, hlc: int) -> bytes:
    """A captured record (a plain message, no origin) as `origin`'s message `seq` at `hlc`:
    what `record_of` makes of the same message (its retain flag dropped)."""
    length, kind, flags, _seq, _hlc = RECORD_FIXED.unpack_from(record)
    if kind != KIND_MESSAGE or flags & FLAG_ORIGIN or length + 4 != len(record):
        raise BatchError("not a captured message's record")
    p = RECORD_FIXED.size
    p += 2 + _U16.unpack_from(record, p)[0]   # topic
    p += 2 + _U16.unpack_from(record, p)[0]   # client
    name = origin.encode()
    if len(name) > 0xFFFF:
        raise BatchError("origin longer than 65,535 bytes")
    return b"".join((RECORD_FIXED.pack(length + 2 + len(name), KIND_MESSAGE,
                                 (flags & 3) | FLAG_ORIGIN, seq, hlc),
                     record[RECORD_FIXED.size:p], _U16.pack(len(name)), name, record[p:]))


class WireRecord(NamedTuple):
    """One received record: what the receiver needs without decoding it, and its bytes."""

    data: bytes
    origin_node: str
    origin_incarnation: int
    origin_seq: int
    hlc: int
    qos: int
    topic: str
    publisher: str
    props: bytes
    """Its MQTT v5 properties, encoded (b"": none)."""

    @property
    def properties(self) -> MessageProperties:
        """Its properties, decoded (BatchError if malformed)."""
        return decode_properties(self.props) if self.props else NO_PROPERTIES

    def envelope(self) -> Envelope:
        """The same message as an envelope (a peer without `records`, a fallback)."""
        payload_at = record_fields(self.data, 0, len(self.data), FLAG_ORIGIN)[4]
        payload = self.data[payload_at:]
        return Envelope(self.origin_node, self.origin_incarnation, self.origin_seq, self.hlc,
                        self.topic, payload, self.qos, False, self.properties,
                        publisher=self.publisher, first_seq=self.origin_seq)


def read_records(data: bytes) -> list[WireRecord]:
    """The records of a `MessageBatch.records`; BatchError says what is wrong (a record that is
    not a plain message with an origin `node/incarnation`, or one that breaks the layout)."""
    out: list[WireRecord] = []
    origins: dict[bytes, tuple[str, int]] = {}
    pos, total = 0, len(data)
    while pos < total:
        if pos + RECORD_FIXED.size > total:
            raise BatchError(f"record at {pos} runs past the end")
        length, kind, flags, seq, hlc = RECORD_FIXED.unpack_from(data, pos)
        end = pos + 4 + length
        if end > total or length < _MIN_LENGTH:
            raise BatchError(f"record at {pos}: length {length} does not fit")
        if kind != KIND_MESSAGE or flags & ~_FLAGS or flags & 3 == 3 or not flags & FLAG_ORIGIN:
            raise BatchError(f"record at {pos}: kind {kind}, flags 0x{flags:02x}: not a "
                             "plain message with an origin")
        try:
            topic, client, origin_raw, props, _ = record_fields(data, pos, end, flags)
        except BatchError as exc:
            raise BatchError(f"record at {pos}: {exc}") from None
        origin = origins.get(origin_raw)
        if origin is None:
            origin = origins[origin_raw] = _origin(origin_raw)
        try:
            text, publisher = topic.decode(), client.decode()
        except UnicodeDecodeError:
            raise BatchError(f"record at {pos}: topic or client id is not UTF-8") from None
        out.append(WireRecord(data[pos:end], origin[0], origin[1], seq, hlc, flags & 3,
                              text, publisher, props))
        pos = end
    return out


def _origin(raw: bytes) -> tuple[str, int]:
    try:
        node, _, incarnation = raw.decode().rpartition("/")
    except UnicodeDecodeError:
        raise BatchError(f"origin {raw!r} is not UTF-8") from None
    if not node or not incarnation.isdigit():
        raise BatchError(f"origin {raw!r} is not node/incarnation")
    return node, int(incarnation)
