"""Drive a paho client from the asyncio loop instead of paho's own thread (adapter).

The socket is read when it is readable and written when paho has packets queued, keep-alive
runs on a timer, and a lost connection is re-established with backoff. Every paho callback
then runs on the loop's thread, so a message costs no thread handoff on its way in, and acks
written in one loop iteration leave in one write.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from sidecar.local import mqtt_codec
from sidecar.local.mqtt_codec import LeanPublish

log = logging.getLogger("mqfed.forward")

READ_BATCH = 512
"""Packets read per turn at most (then other tasks run)."""
READ_CHUNK = 65536
"""Bytes asked of the socket per read by `BufferedReadClient`."""


class BufferedReadClient(mqtt.Client):
    """A paho client that reads its socket in chunks. paho reads each packet with three or
    more `recv` calls (the command byte, each length byte, the body); this serves them from one
    larger read (measured at 2,000 msgs/s on the origin: 1.8 `recv` per message, was 3.8).
    Only for a client driven by `LoopDriver`: paho's own loop would `select` on a socket whose
    data already sits in this buffer."""

    _rsock: socket.socket | None = None
    _rbuf: bytes = b""
    _rpos: int = 0

    def _sock_recv(self, bufsize: int) -> bytes:
        sock = self._sock
        if sock is None:
            raise ConnectionError("self._sock is None")
        if sock is not self._rsock:  # a new connection: nothing buffered belongs to it
            self._rsock, self._rbuf, self._rpos = sock, b"", 0
        buf, pos = self._rbuf, self._rpos
        if pos >= len(buf):
            buf = sock.recv(READ_CHUNK)  # BlockingIOError: nothing to read; b"": EOF
            if len(buf) <= bufsize:
                self._rbuf, self._rpos = b"", 0
                return buf
            pos = 0
            self._rbuf = buf
        self._rpos = pos + bufsize
        return buf[pos:pos + bufsize]

    def buffered(self) -> bool:
        """Whether read bytes wait in the buffer (the socket will not signal them)."""
        return self._rsock is self._sock and self._rpos < len(self._rbuf)


class LeanClient(BufferedReadClient):
    """The forwarding client's paho client: MQTT v5 PUBLISH packets are decoded by
    `sidecar.local.mqtt_codec` and handed to `on_publish_packet` when they arrive (QoS 2 ones
    too, acknowledged by PUBREC through `ack`), and bare PUBACKs settle their publish, both
    without paho's per-packet `Properties`, `ReasonCode` and `MQTTMessage` objects. Anything
    the lean decoder refuses goes through paho as before (to `on_message`)."""

    on_publish_packet: Callable[[LeanPublish], None] | None = None
    on_suback_codes: Callable[[int, bytes], None] | None = None
    """Gets (packet id, reason codes) of each SUBACK instead of paho's `on_subscribe`."""

    def subscribe_lean(self, filters: list[str], options: int,
                       subscription_id: int) -> int | None:
        """SUBSCRIBE to valid `filters` (the caller checked them), one options byte and
        identifier for all, built by `mqtt_codec.subscribe_packet`; the packet id, or None
        without a connection (as paho's `subscribe`)."""
        if self._sock is None:
            return None
        mid = self._mid_generate()
        self._packet_queue(0x82, mqtt_codec.subscribe_packet(mid, filters, subscription_id,
                                                             options), mid, 1)
        return mid

    def _handle_suback(self) -> None:
        hook = self.on_suback_codes
        if hook is None or self._protocol != mqtt.MQTTv5:
            return super()._handle_suback()
        try:
            mid, codes = mqtt_codec.decode_suback(self._in_packet["packet"])
        except (ValueError, IndexError):
            return super()._handle_suback()
        with self._in_callback_mutex:
            hook(mid, codes)
        return None

    def _handle_publish(self) -> mqtt.MQTTErrorCode:
        hook = self.on_publish_packet
        header = self._in_packet["command"]
        if hook is None or self._protocol != mqtt.MQTTv5:
            return super()._handle_publish()
        try:
            packet = mqtt_codec.decode_publish(header, self._in_packet["packet"])
        except (ValueError, IndexError):  # paho decodes it, or reports it malformed
            return super()._handle_publish()
        with self._in_callback_mutex:  # as paho's on_message: LoopDriver defers writes
            hook(packet)
        if self._manual_ack:
            return mqtt.MQTT_ERR_SUCCESS
        if packet.qos == 1:
            return self._send_puback(packet.mid)
        if packet.qos == 2:
            return self._send_pubrec(packet.mid)
        return mqtt.MQTT_ERR_SUCCESS

    def ack(self, mid: int, qos: int) -> mqtt.MQTTErrorCode:
        """Accept a received message: PUBACK at QoS 1, PUBREC at QoS 2. A QoS 2 message is
        handed over when its PUBLISH arrives, like a QoS 1 one (paho waits for the PUBREL,
        after its own immediate PUBREC): so copies reach their reader in Mosquitto's id order
        (`sidecar.local.midgaps` relies on it), and Mosquitto keeps one until it is accepted,
        resending it after a reconnect."""
        if self._manual_ack and qos == 2:
            return self._send_pubrec(mid)
        return super().ack(mid, qos)

    def _handle_pubrel(self) -> mqtt.MQTTErrorCode:
        """PUBREL of an accepted QoS 2 message: completed at once (PUBCOMP)."""
        if not self._manual_ack or len(self._in_packet["packet"]) < 2:
            return super()._handle_pubrel()
        packet = self._in_packet["packet"]
        mid = (packet[0] << 8) | packet[1]
        if mid in self._in_messages:  # one paho decoded (and acknowledged with PUBREC)
            rc = super()._handle_pubrel()
            if rc != mqtt.MQTT_ERR_SUCCESS:
                return rc
        return self._send_pubcomp(mid)

    def _handle_pubackcomp(self, cmd: Any) -> mqtt.MQTTErrorCode:
        packet = self._in_packet["packet"]
        if len(packet) != 2:  # a reason code or properties: paho decodes them
            return super()._handle_pubackcomp(cmd)
        mid = (packet[0] << 8) | packet[1]
        with self._out_message_mutex:
            if mid in self._out_messages:
                return self._do_on_publish(mid, _SUCCESS[cmd], _NO_PROPS[cmd])
        return mqtt.MQTT_ERR_SUCCESS

    def _handle_pubrec(self) -> mqtt.MQTTErrorCode:
        """A PUBREC with a failure reason (0x80 and above) ends the QoS 2 exchange: the message
        was not accepted (MQTT 5, 4.3.3), so no PUBREL is sent and the publish is reported to
        `on_publish` with that reason. paho 2.2 ignores the reason, sends PUBREL and reports the
        (successful) PUBCOMP Mosquitto gives even for a message it never stored."""
        packet = self._in_packet["packet"]
        if len(packet) > 2 and packet[2] >= 0x80 and self._protocol == mqtt.MQTTv5:
            mid = (packet[0] << 8) | packet[1]
            with self._out_message_mutex:
                if mid in self._out_messages:
                    reason = ReasonCode(PacketTypes.PUBREC, identifier=packet[2])
                    return self._do_on_publish(mid, reason, Properties(PacketTypes.PUBREC))
            return mqtt.MQTT_ERR_SUCCESS
        return super()._handle_pubrec()


_SUCCESS = {"PUBACK": ReasonCode(PacketTypes.PUBACK), "PUBCOMP": ReasonCode(PacketTypes.PUBCOMP)}
_NO_PROPS = {"PUBACK": Properties(PacketTypes.PUBACK), "PUBCOMP": Properties(PacketTypes.PUBCOMP)}
"""Shared by every bare ack (a 2-byte PUBACK/PUBCOMP means success without properties)."""


class LoopDriver:
    """Runs one paho client's network I/O on `loop` (paho's own loop must not be started)."""

    def __init__(self, client: mqtt.Client, loop: asyncio.AbstractEventLoop,
                 min_delay: float = 0.05, max_delay: float = 2.0) -> None:
        self.client = client
        self.loop = loop
        self.min_delay = min_delay
        self.max_delay = max_delay
        self.reconnects = 0
        self._sock: socket.socket | None = None
        self._write_due = False  # packets wait for the end of a read or of this iteration
        self._writer_added = False  # the socket is watched for writability
        self._reading = False
        self.after_read: Callable[[], None] = lambda: None
        """Called after each read turn, outside paho's callbacks (the owner's hand-over)."""
        self._stopping = False
        self._tasks: set[asyncio.Task[Any]] = set()
        client.on_socket_open = self._on_open
        client.on_socket_close = self._on_close
        client.on_socket_register_write = self._on_register_write
        client.on_socket_unregister_write = self._on_unregister_write

    def start(self) -> None:
        """Start the keep-alive timer (after `client.connect`)."""
        self._spawn(self._misc_loop(), "paho-misc")

    def _spawn(self, coro: Any, name: str) -> None:
        task = self.loop.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- paho socket callbacks (on the loop thread) ------------------------------------
    def _on_open(self, client: mqtt.Client, userdata: Any, sock: socket.socket) -> None:
        self._sock = sock
        self.loop.add_reader(sock, self._read)

    def _on_close(self, client: mqtt.Client, userdata: Any, sock: socket.socket) -> None:
        self.loop.remove_reader(sock)
        self.loop.remove_writer(sock)
        self._writer_added = False
        self._sock = None
        if not self._stopping:
            self._spawn(self._reconnect(), "paho-reconnect")

    def _on_register_write(self, client: mqtt.Client, userdata: Any,
                           sock: socket.socket) -> None:
        """paho queued a packet: write it now, as paho's own unthreaded mode does, unless a
        read is under way or a paho callback runs (paho's callback lock is not reentrant);
        then once the read or the loop iteration ends. The socket is watched for writability
        only when it did not take everything."""
        if self._write_due:
            return
        lock = client._in_callback_mutex  # paho 2.2
        if self._reading or not lock.acquire(False):
            self._write_due = True
            if not self._reading:
                self.loop.call_soon(self._write)
            return
        lock.release()
        self._write()

    def _on_unregister_write(self, client: mqtt.Client, userdata: Any,
                             sock: socket.socket) -> None:
        if self._writer_added:
            self._writer_added = False
            self.loop.remove_writer(sock)

    def _write(self) -> None:
        self._write_due = False
        client = self.client
        client.loop_write()
        sock = client.socket()
        if sock is not None and client.want_write() and not self._writer_added:
            self._writer_added = True
            self.loop.add_writer(sock, client.loop_write)

    def _read(self) -> None:
        """Read what the socket holds, up to READ_BATCH packets per turn (paho's `loop_read`
        reads one packet when nothing of ours is in flight), then run `after_read` and write
        what paho queued meanwhile (acks)."""
        client = self.client
        self._reading = True
        try:
            more = self._read_packets(client)
        finally:
            self._reading = False
        try:
            self.after_read()
        finally:
            if self._write_due:
                self._write()
            if more:
                self.loop.call_soon(self._read)  # buffered bytes raise no readiness event

    def _read_packets(self, client: mqtt.Client) -> bool:
        """Read up to READ_BATCH packets; True when read bytes are left in the buffer."""
        for _ in range(READ_BATCH):
            if client.socket() is None:
                return False
            rc = client._packet_read()  # paho 2.2: what loop_read does per packet
            if rc == mqtt.MQTT_ERR_AGAIN:
                return False
            if rc > 0:
                client._loop_rc_handle(rc)  # closes the socket, calls on_disconnect
                return False
        return isinstance(client, BufferedReadClient) and client.buffered()

    @property
    def reading(self) -> bool:
        """True while paho callbacks run from a read (`after_read` follows it)."""
        return self._reading

    # ---- timers ------------------------------------------------------------------------
    async def _misc_loop(self) -> None:
        while not self._stopping:
            await asyncio.sleep(1.0)
            self.client.loop_misc()

    async def _reconnect(self) -> None:
        delay = self.min_delay
        while not self._stopping:
            await asyncio.sleep(delay)
            try:
                self.client.reconnect()
            except OSError as exc:
                log.debug("forwarding client reconnect failed", extra={"error": str(exc)})
                delay = min(delay * 2, self.max_delay)
                continue
            self.reconnects += 1
            return

    def stop(self) -> None:
        """Send DISCONNECT and stop; the client is not reconnected afterwards."""
        self._stopping = True
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(Exception):
            self.client.disconnect()
            self.client.loop_write()
        sock = self._sock
        if sock is not None:
            self.loop.remove_reader(sock)
            self.loop.remove_writer(sock)
