"""Conversions between will records and `peer.proto` frames (adapter helpers)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from sidecar._proto import peer_pb2
from sidecar.message import MessageProperties
from sidecar.wills.record import ARMED, DELAYED, DONE, WillMessage, WillRecord

RECORDS_PER_FRAME = 200
FRAME_BYTES = 4 << 20  # a frame holds fewer records when their wills are large
_STATE = {ARMED: peer_pb2.WillRecord.ARMED, DELAYED: peer_pb2.WillRecord.DELAYED,
          DONE: peer_pb2.WillRecord.DONE}
_STATE_BACK = {v: k for k, v in _STATE.items()}


def record_to_proto(r: WillRecord) -> peer_pb2.WillRecord:
    m = peer_pb2.WillRecord(
        client=r.client, owner=r.owner, epoch=r.epoch, connect_hlc=r.connect_hlc,
        change_hlc=r.change_hlc, writer=r.writer, state=_STATE[r.state], orphaned=r.orphaned,
        since_ms=r.since_ms, outcome=r.outcome)
    if r.expiry is not None:
        m.session_expiry = r.expiry
    w = r.will
    if w is not None:
        m.topic, m.payload, m.qos, m.retain, m.delay = w.topic, w.payload, w.qos, w.retain, \
            w.delay
        p = w.properties
        m.user_properties.extend(peer_pb2.UserProperty(key=k, value=v) for k, v in p.user)
        if p.content_type is not None:
            m.content_type = p.content_type
        if p.payload_format is not None:
            m.payload_format_indicator = p.payload_format
        if p.correlation_data is not None:
            m.correlation_data = p.correlation_data
        if p.response_topic is not None:
            m.response_topic = p.response_topic
        if p.message_expiry is not None:
            m.message_expiry = p.message_expiry
    return m


def record_from_proto(m: peer_pb2.WillRecord) -> WillRecord:
    """Raises ValueError for a record that breaks the rules (a peer's bug: it is skipped)."""
    state = _STATE_BACK.get(m.state)
    if state is None:
        raise ValueError(f"will record of {m.client!r} has no known state ({m.state})")
    will = None
    if state != DONE:
        if m.qos > 2:
            raise ValueError(f"will record of {m.client!r} has QoS {m.qos}")
        props = MessageProperties(
            user=tuple((u.key, u.value) for u in m.user_properties),
            content_type=m.content_type if m.HasField("content_type") else None,
            payload_format=m.payload_format_indicator
            if m.HasField("payload_format_indicator") else None,
            correlation_data=m.correlation_data if m.HasField("correlation_data") else None,
            response_topic=m.response_topic if m.HasField("response_topic") else None,
            message_expiry=m.message_expiry if m.HasField("message_expiry") else None)
        will = WillMessage(m.topic, m.payload, m.qos, m.retain, m.delay, props)
    return WillRecord(m.client, m.owner, m.epoch, m.connect_hlc, m.change_hlc, m.writer, state,
                      m.orphaned, m.since_ms,
                      m.session_expiry if m.HasField("session_expiry") else None, will,
                      m.outcome)


def records_frames(records: Iterable[WillRecord], snapshot: bool = False,
                   exchange: int = 0) -> Iterator[bytes]:
    """`Frame{will_records}`s of at most RECORDS_PER_FRAME records (or about FRAME_BYTES)
    each; with `exchange`, only the last asks for an acknowledgement (one is sent even for no
    records)."""
    batch: list[peer_pb2.WillRecord] = []
    size = 0
    for r in records:
        m = record_to_proto(r)
        batch.append(m)
        size += m.ByteSize()
        if len(batch) == RECORDS_PER_FRAME or size >= FRAME_BYTES:
            yield _frame(batch, snapshot, 0)
            batch, size = [], 0
    if batch or exchange:
        yield _frame(batch, snapshot, exchange)


def _frame(batch: list[peer_pb2.WillRecord], snapshot: bool, exchange: int) -> bytes:
    return peer_pb2.Frame(will_records=peer_pb2.WillRecords(
        records=batch, snapshot=snapshot, exchange=exchange)).SerializeToString()


def ack_frame(exchange: int) -> bytes:
    return peer_pb2.Frame(will_records_ack=peer_pb2.WillRecordsAck(
        exchange=exchange)).SerializeToString()
