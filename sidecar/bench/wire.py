"""Just enough MQTT 3.1.1 for thousands of benchmark clients on one asyncio loop (pure).

Encoders for CONNECT, SUBSCRIBE, PUBLISH (QoS 0/1) and PUBACK, and a reader that splits a
byte stream into packets; no I/O here (`sidecar.bench.swarm` does that).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

CONNECT, CONNACK, PUBLISH, PUBACK, SUBSCRIBE, SUBACK, DISCONNECT = 1, 2, 3, 4, 8, 9, 14
MAX_REMAINING = 268_435_455  # the largest remaining length MQTT can encode


def remaining_length(n: int) -> bytes:
    """MQTT's variable-length encoding of a packet's remaining length."""
    if not 0 <= n <= MAX_REMAINING:
        raise ValueError(f"remaining length {n} out of range")
    out = bytearray()
    while True:
        n, digit = divmod(n, 128)
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _string(text: str | bytes) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return struct.pack("!H", len(data)) + data


def _packet(kind: int, flags: int, body: bytes) -> bytes:
    return bytes([kind << 4 | flags]) + remaining_length(len(body)) + body


def connect(client_id: str, keepalive: int = 0, clean: bool = True) -> bytes:
    """CONNECT, MQTT 3.1.1 (protocol level 4), no will, no credentials."""
    head = _string("MQTT") + bytes([4, 0x02 if clean else 0]) + struct.pack("!H", keepalive)
    return _packet(CONNECT, 0, head + _string(client_id))


def subscribe(packet_id: int, filters: list[tuple[str, int]]) -> bytes:
    """SUBSCRIBE of (filter, QoS) pairs."""
    if not filters:
        raise ValueError("SUBSCRIBE needs at least one filter")
    body = struct.pack("!H", packet_id) + b"".join(_string(f) + bytes([q]) for f, q in filters)
    return _packet(SUBSCRIBE, 0x2, body)


def publish(topic: str, payload: bytes, qos: int = 0, packet_id: int = 0) -> bytes:
    """PUBLISH at QoS 0 or 1 (a packet id only at QoS 1)."""
    if qos not in (0, 1):
        raise ValueError(f"QoS {qos} not supported here")
    pid = struct.pack("!H", packet_id) if qos else b""
    return _packet(PUBLISH, qos << 1, _string(topic) + pid + payload)


def puback(packet_id: int) -> bytes:
    return _packet(PUBACK, 0, struct.pack("!H", packet_id))


def disconnect() -> bytes:
    return _packet(DISCONNECT, 0, b"")


@dataclass(frozen=True)
class Packet:
    kind: int
    flags: int
    body: bytes

    def packet_id(self) -> int:
        """The packet id at the start of the body (PUBACK, SUBACK)."""
        return struct.unpack_from("!H", self.body)[0]


@dataclass(frozen=True)
class Message:
    topic: str
    qos: int
    packet_id: int
    payload: bytes


def parse_publish(packet: Packet) -> Message:
    body = packet.body
    (size,) = struct.unpack_from("!H", body)
    topic = body[2:2 + size].decode()
    qos = (packet.flags >> 1) & 3
    at = 2 + size
    packet_id = struct.unpack_from("!H", body, at)[0] if qos else 0
    return Message(topic, qos, packet_id, body[at + (2 if qos else 0):])


class PacketReader:
    """Feed bytes as they arrive; take whole packets out."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Packet]:
        self._buf += data
        out: list[Packet] = []
        buf = self._buf
        at = 0
        while len(buf) - at >= 2:
            length, mult, i = 0, 1, at + 1
            while True:
                if i >= len(buf):
                    self._keep(at)
                    return out
                byte = buf[i]
                length += (byte & 0x7F) * mult
                mult *= 128
                i += 1
                if not byte & 0x80:
                    break
                if i - at > 4:
                    raise ValueError("malformed remaining length")
            if len(buf) - i < length:
                break
            out.append(Packet(buf[at] >> 4, buf[at] & 0x0F, bytes(buf[i:i + length])))
            at = i + length
        self._keep(at)
        return out

    def _keep(self, at: int) -> None:
        if at:
            del self._buf[:at]
