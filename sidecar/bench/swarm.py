"""Many light MQTT 3.1.1 clients on one asyncio loop (adapter over `sidecar.bench.wire`).

A client costs a socket and a small protocol object, not a thread: 10,000 fit in the
benchmark's process. Each records when messages arrive (`time.perf_counter`) and answers
QoS 1 deliveries with PUBACK.
"""

from __future__ import annotations

import asyncio
import resource
import time
from collections.abc import Sequence

from sidecar.bench import wire

HOST = "127.0.0.1"


def raise_fd_limit(needed: int) -> int:
    """Raise this process's open-files limit towards `needed` (at most the hard limit);
    returns the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if want > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        soft = want
    return soft


class LightClient(asyncio.Protocol):
    """One connection: CONNECT/SUBSCRIBE/PUBLISH with futures for their acks."""

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id
        self.transport: asyncio.Transport | None = None
        self.arrivals: list[tuple[float, wire.Message]] = []
        self.closed = False
        self._reader = wire.PacketReader()
        self._waiting: dict[tuple[int, int], asyncio.Future] = {}
        self._next_id = 0
        self._loop = asyncio.get_running_loop()

    # ---- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        for packet in self._reader.feed(data):
            if packet.kind == wire.PUBLISH:
                message = wire.parse_publish(packet)
                self.arrivals.append((now, message))
                if message.qos == 1 and self.transport is not None:
                    self.transport.write(wire.puback(message.packet_id))
            elif packet.kind == wire.CONNACK:
                self._settle((wire.CONNACK, 0), packet.body[1])
            elif packet.kind in (wire.SUBACK, wire.PUBACK):
                self._settle((packet.kind, packet.packet_id()), packet.body[2:])

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(ConnectionError(f"{self.client_id}: connection lost"))
        self._waiting.clear()

    # ---- requests -----------------------------------------------------------------------
    def _settle(self, key: tuple[int, int], value: object) -> None:
        fut = self._waiting.pop(key, None)
        if fut is not None and not fut.done():
            fut.set_result(value)

    def _expect(self, key: tuple[int, int]) -> asyncio.Future:
        fut = self._loop.create_future()
        self._waiting[key] = fut
        return fut

    def _packet_id(self) -> int:
        self._next_id = self._next_id % 65535 + 1
        return self._next_id

    def _send(self, data: bytes) -> None:
        if self.transport is None or self.closed:
            raise ConnectionError(f"{self.client_id}: not connected")
        self.transport.write(data)

    async def handshake(self, keepalive: int = 0) -> None:
        fut = self._expect((wire.CONNACK, 0))
        self._send(wire.connect(self.client_id, keepalive))
        code = await fut
        if code:
            raise ConnectionError(f"{self.client_id}: CONNACK refused ({code})")

    async def subscribe(self, filters: Sequence[tuple[str, int]]) -> bytes:
        """SUBSCRIBE; the granted QoS codes (0x80 = refused)."""
        pid = self._packet_id()
        fut = self._expect((wire.SUBACK, pid))
        self._send(wire.subscribe(pid, list(filters)))
        return await fut

    def publish_qos1(self, topic: str, payload: bytes) -> asyncio.Future:
        """PUBLISH at QoS 1; a future done at its PUBACK."""
        pid = self._packet_id()
        fut = self._expect((wire.PUBACK, pid))
        self._send(wire.publish(topic, payload, 1, pid))
        return fut

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            try:
                self.transport.write(wire.disconnect())
            finally:
                self.transport.close()


async def open_client(port: int, client_id: str, keepalive: int = 0,
                      timeout: float = 30.0) -> LightClient:
    """Connect to 127.0.0.1:`port` and finish the MQTT handshake."""
    loop = asyncio.get_running_loop()
    _, client = await asyncio.wait_for(
        loop.create_connection(lambda: LightClient(client_id), HOST, port), timeout)
    try:
        await asyncio.wait_for(client.handshake(keepalive), timeout)
    except BaseException:
        client.close()
        raise
    return client
