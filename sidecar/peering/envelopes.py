"""Conversions between the routing cores' values and `peer.proto` frames (adapter helpers).

Envelopes are serialized once, when they are queued; a batch frame is then assembled from the
serialized envelopes by concatenation (protobuf's wire format makes a repeated field the
concatenation of its elements), so the hot path never re-parses what it already encoded.

A plain delivery is queued as its MQFB record instead (`queued_form`: `RECORD_MARK` and the
record; a serialized envelope never starts with a zero byte), and goes in a frame of records
(`MessageBatch.records`) to a peer that takes them, else as an envelope again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeVar

from sidecar._proto import peer_pb2
from sidecar.local.batch import BatchError
from sidecar.message import MessageProperties
from sidecar.routing.forwarder import Envelope
from sidecar.routing.interest import InterestDelta, InterestSnapshot
from sidecar.routing.records import encode_wire_record, read_records, travels_as_record
from sidecar.routing.table import InterestKey

T = TypeVar("T")

_FRAME_MESSAGE_BATCH = 6  # Frame.message_batch
_BATCH_ENVELOPES = 1  # MessageBatch.envelopes
_BATCH_RECORDS = 2  # MessageBatch.records
RECORD_MARK = b"\x00"
"""The first byte of a queued record (`queued_form`)."""


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, data: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def encode_envelope(env: Envelope) -> bytes:
    """One envelope, serialized (what the outbound queue stores)."""
    props = env.properties
    msg = peer_pb2.Envelope(
        origin_node=env.origin_node, origin_seq=env.origin_seq,
        origin_incarnation=env.origin_incarnation, hlc=env.hlc, topic=env.topic,
        payload=env.payload, qos=env.qos, retain=env.retain,
        user_properties=[peer_pb2.UserProperty(key=k, value=v) for k, v in props.user],
        content_type=props.content_type, payload_format_indicator=props.payload_format,
        correlation_data=props.correlation_data, response_topic=props.response_topic,
        message_expiry=props.message_expiry, shared_group=env.shared_group,
        shared_filter=env.shared_filter, publisher=env.publisher, first_seq=env.first_seq,
        cut_client=env.cut_client,
    )
    return msg.SerializeToString()


def queued_form(env: Envelope, records: bool = True) -> bytes:
    """What the outbound queue keeps for `env`: its record (marked) where it may travel as
    one (and `records`: this node sends records), else the serialized envelope."""
    if records and travels_as_record(env):
        try:
            return RECORD_MARK + encode_wire_record(env)
        except BatchError:
            pass  # the record format cannot carry it: the envelope can say why on the far side
    return encode_envelope(env)


def is_record(data: bytes) -> bool:
    """Whether a queued item is a record (`queued_form`)."""
    return data[:1] == RECORD_MARK


def same_form_runs(items: Sequence[T], data: Callable[[T], bytes]) -> list[list[T]]:
    """`items` in order, split where they change between records and envelopes (a frame
    carries one form: order holds)."""
    out: list[list[T]] = []
    last = None
    for item in items:
        form = is_record(data(item))
        if form is not last:
            out.append([])
            last = form
        out[-1].append(item)
    return out


def batch_frame(items: Iterable[bytes], records: bool = True) -> bytes:
    """A serialized `Frame{message_batch}` of queued items of one form (`same_form_runs`):
    envelopes as they are; records concatenated, or (`records` False: the peer does not take
    them) each as an envelope again."""
    items = list(items)
    if items and is_record(items[0]):
        if records:
            inner = _field(_BATCH_RECORDS, b"".join([item[1:] for item in items]))
            return _field(_FRAME_MESSAGE_BATCH, inner)
        items = [encode_envelope(read_records(item[1:])[0].envelope()) for item in items]
    inner = b"".join(_field(_BATCH_ENVELOPES, env) for env in items)
    return _field(_FRAME_MESSAGE_BATCH, inner)


def properties_from(msg: peer_pb2.Envelope | peer_pb2.RetainedEntry,
                    with_expiry: bool = True) -> MessageProperties:
    """The MQTT v5 properties a received Envelope or RetainedEntry carries (the expiry left
    out where the caller computes its own)."""
    has = msg.HasField
    return MessageProperties(
        user=tuple((p.key, p.value) for p in msg.user_properties),
        content_type=msg.content_type if has("content_type") else None,
        payload_format=msg.payload_format_indicator if has("payload_format_indicator") else None,
        correlation_data=msg.correlation_data if has("correlation_data") else None,
        response_topic=msg.response_topic if has("response_topic") else None,
        message_expiry=msg.message_expiry if with_expiry and has("message_expiry") else None,
    )


def decode_envelope(msg: peer_pb2.Envelope) -> Envelope:
    """A received protobuf envelope as the cores' `Envelope`."""
    props = properties_from(msg)
    has = msg.HasField
    return Envelope(
        msg.origin_node, msg.origin_incarnation, msg.origin_seq, msg.hlc, msg.topic,
        msg.payload, msg.qos, msg.retain, props,
        msg.shared_group if has("shared_group") else None, msg.shared_filter,
        publisher=msg.publisher, first_seq=msg.first_seq, cut_client=msg.cut_client,
    )


def ack_frame(acks: Sequence[tuple[int, int, int]]) -> bytes:
    """`Frame{ack_batch}` from (incarnation, seq, status) triples."""
    batch = peer_pb2.AckBatch(acks=[
        peer_pb2.Ack(origin_incarnation=inc, origin_seq=seq, status=status)
        for inc, seq, status in acks])
    return peer_pb2.Frame(ack_batch=batch).SerializeToString()


_FRAME_INTEREST_SNAPSHOT = 4  # Frame.interest_snapshot
_FRAME_INTEREST_DELTA = 5  # Frame.interest_delta
_SMALL = [bytes((i,)) for i in range(128)]  # one-byte varints


def _entry_fields(number: int, keys: Iterable[InterestKey],
                  since: Mapping[InterestKey, int] | None = None) -> bytes:
    """`InterestEntry`s as repeated field `number`, serialized here: 100,000 protobuf objects
    cost a second of the loop when a node joins (one message per entry, then copies)."""
    tag = _varint(number << 3 | 2)
    times = since or {}
    small = _SMALL
    out: list[bytes] = []
    append = out.append
    for key in keys:
        data = key.filter.encode()
        size = len(data)
        entry = b"\x12" + (small[size] if size < 128 else _varint(size)) + data
        if key.group is not None:
            group = key.group.encode()
            entry = b"\x0a" + _varint(len(group)) + group + entry
        at = times.get(key, 0) if times else 0
        if at:
            entry += b"\x18" + _varint(at)
        size = len(entry)
        append(tag)
        append(small[size] if size < 128 else _varint(size))
        append(entry)
    return b"".join(out)


def _uint(number: int, value: int) -> bytes:
    """A varint field, left out when 0 (proto3)."""
    return _varint(number << 3) + _varint(value) if value else b""


def _keys(entries: Iterable[peer_pb2.InterestEntry],
          since: dict[InterestKey, int] | None = None) -> frozenset[InterestKey]:
    """The entries' keys, in one pass; their subscribe times (catch-up) go into `since`."""
    keys = []
    append_key = keys.append
    for e in entries:
        key = InterestKey(e.group if e.HasField("group") else None, e.filter)
        append_key(key)
        if since is not None and e.since_ms:
            since[key] = e.since_ms
    return frozenset(keys)


def interest_snapshot_frame(snap: InterestSnapshot) -> bytes:
    """A serialized `Frame{interest_snapshot}`."""
    inner = (_uint(1, snap.version) + _entry_fields(2, snap.keys, snap.since)
             + _uint(3, snap.chunk) + _uint(4, int(not snap.last)))
    return _field(_FRAME_INTEREST_SNAPSHOT, inner)


def interest_delta_frame(delta: InterestDelta) -> bytes:
    """A serialized `Frame{interest_delta}`."""
    inner = (_uint(1, delta.from_version) + _uint(2, delta.to_version)
             + _entry_fields(3, delta.added, delta.since) + _entry_fields(4, delta.removed))
    return _field(_FRAME_INTEREST_DELTA, inner)


def interest_request_frame(have_version: int, reason: str) -> bytes:
    msg = peer_pb2.InterestRequest(have_version=have_version, reason=reason)
    return peer_pb2.Frame(interest_request=msg).SerializeToString()


def interest_applied_frame(version: int) -> bytes:
    msg = peer_pb2.InterestApplied(version=version)
    return peer_pb2.Frame(interest_applied=msg).SerializeToString()


def snapshot_from(msg: peer_pb2.InterestSnapshot) -> InterestSnapshot:
    since: dict[InterestKey, int] = {}
    keys = _keys(msg.entries, since)
    return InterestSnapshot(msg.version, keys, msg.chunk, not msg.more, since)


def delta_from(msg: peer_pb2.InterestDelta) -> InterestDelta:
    since: dict[InterestKey, int] = {}
    added = _keys(msg.added, since)
    return InterestDelta(msg.from_version, msg.to_version, added, _keys(msg.removed), since)
