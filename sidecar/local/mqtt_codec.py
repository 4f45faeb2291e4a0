"""Lean decoding of the MQTT v5 packets on the forwarding client's hot path (pure).

paho builds a `Properties` object, a `ReasonCode` and an `MQTTMessage` for every packet; at
full speed that was most of a sidecar's CPU. The forwarding client only needs the fields
below, so `sidecar.local.paho_loop.LeanClient` decodes PUBLISH packets here and leaves
anything this module does not know (a property a PUBLISH may not carry, bad UTF-8) to
paho.
"""

from __future__ import annotations

from typing import NamedTuple

from sidecar.message import MessageProperties

NO_PROPERTIES = MessageProperties()


class LeanPublish(NamedTuple):
    """One received PUBLISH: what the forwarding client hands to the routing core."""

    mid: int
    topic: str
    payload: bytes
    qos: int
    retain: bool
    dup: bool
    properties: MessageProperties
    subscription_ids: tuple[int, ...]


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """A variable byte integer at `pos`: (value, position after it)."""
    value = shift = 0
    while True:
        if shift > 21:
            raise ValueError("variable byte integer longer than 4 bytes")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _string(data: bytes, pos: int) -> tuple[str, int]:
    end = pos + 2 + ((data[pos] << 8) | data[pos + 1])
    if end > len(data):
        raise ValueError("string runs past the packet")
    return data[pos + 2:end].decode("utf-8"), end


def decode_properties(data: bytes, pos: int) -> tuple[MessageProperties, tuple[int, ...], int]:
    """A PUBLISH's property block at `pos`: (properties, subscription identifiers, position
    after the block). ValueError for anything malformed or not allowed in a PUBLISH (topic
    aliases included: the forwarding client allows none)."""
    length, pos = _varint(data, pos)
    end = pos + length
    if end > len(data):
        raise ValueError("properties run past the packet")
    if not length:
        return NO_PROPERTIES, (), end
    user: list[tuple[str, str]] = []
    sids: list[int] = []
    fields: dict[str, object] = {}
    while pos < end:
        ident = data[pos]
        pos += 1
        if ident == 0x0B:  # subscription identifier
            sid, pos = _varint(data, pos)
            sids.append(sid)
        elif ident == 0x26:  # user property
            key, pos = _string(data, pos)
            value, pos = _string(data, pos)
            user.append((key, value))
        elif ident == 0x01 and "payload_format" not in fields:
            fields["payload_format"] = data[pos]
            pos += 1
        elif ident == 0x02 and "message_expiry" not in fields:
            fields["message_expiry"] = int.from_bytes(data[pos:pos + 4], "big")
            pos += 4
        elif ident == 0x03 and "content_type" not in fields:
            fields["content_type"], pos = _string(data, pos)
        elif ident == 0x08 and "response_topic" not in fields:
            fields["response_topic"], pos = _string(data, pos)
        elif ident == 0x09 and "correlation_data" not in fields:
            size = (data[pos] << 8) | data[pos + 1]
            fields["correlation_data"] = bytes(data[pos + 2:pos + 2 + size])
            pos += 2 + size
        else:
            raise ValueError(f"property {ident:#04x} is not expected in a PUBLISH here")
    if pos != end:
        raise ValueError("a property runs past the property block")
    props = MessageProperties(user=tuple(user), **fields) if user or fields else NO_PROPERTIES
    return props, tuple(sids), end


def decode_publish(header: int, packet: bytes) -> LeanPublish:
    """An MQTT v5 PUBLISH from its first header byte and the bytes after the remaining length.
    ValueError (or IndexError) when it is malformed."""
    qos = (header & 0x06) >> 1
    if qos == 3:
        raise ValueError("QoS 3")
    topic, pos = _string(packet, 0)
    mid = 0
    if qos:
        mid = (packet[pos] << 8) | packet[pos + 1]
        pos += 2
    props, sids, pos = decode_properties(packet, pos)
    return LeanPublish(mid, topic, bytes(packet[pos:]), qos, bool(header & 0x01),
                       bool(header & 0x08), props, sids)


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if not value:
            out.append(byte)
            return bytes(out)
        out.append(byte | 0x80)


def subscribe_packet(mid: int, filters: list[str], subscription_id: int,
                     options: int) -> bytearray:
    """A whole MQTT v5 SUBSCRIBE packet: every filter with the same options byte and the
    subscription identifier (0: none). The filters must be valid (not checked here): paho
    builds an options object, a bytes copy and a wildcard check per filter, a third of a
    joining node's CPU for 100,000 forwarding subscriptions."""
    props = b"\x0b" + _varint_bytes(subscription_id) if subscription_id else b""
    option = bytes((options,))
    body = bytearray(mid.to_bytes(2, "big"))
    body += _varint_bytes(len(props))
    body += props
    for filter in filters:
        data = filter.encode()
        body += len(data).to_bytes(2, "big")
        body += data
        body += option
    packet = bytearray(b"\x82")
    packet += _varint_bytes(len(body))
    packet += body
    return packet


def decode_suback(packet: bytes) -> tuple[int, bytes]:
    """An MQTT v5 SUBACK's body (after the fixed header): (packet id, one reason code per
    filter). ValueError or IndexError if malformed."""
    if len(packet) < 3:
        raise ValueError("SUBACK too short")
    mid = (packet[0] << 8) | packet[1]
    length, pos = _varint(packet, 2)
    if pos + length > len(packet):
        raise ValueError("SUBACK properties run past the packet")
    return mid, bytes(packet[pos + length:])
