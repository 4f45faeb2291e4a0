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
from typing import Any

import paho.mqtt.client as mqtt

log = logging.getLogger("mqfed.forward")

READ_BATCH = 512
"""Packets read per readiness event at most (then other tasks run)."""


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
        self._sock = None
        if not self._stopping:
            self._spawn(self._reconnect(), "paho-reconnect")

    def _on_register_write(self, client: mqtt.Client, userdata: Any,
                           sock: socket.socket) -> None:
        self.loop.add_writer(sock, self.client.loop_write)

    def _on_unregister_write(self, client: mqtt.Client, userdata: Any,
                             sock: socket.socket) -> None:
        self.loop.remove_writer(sock)

    def _read(self) -> None:
        """Read what the socket holds, up to READ_BATCH packets. paho's `loop_read` reads one
        packet when nothing of ours is in flight; this reads until the socket is drained."""
        client = self.client
        for _ in range(READ_BATCH):
            if client.socket() is None:
                return
            rc = client._packet_read()  # paho 2.2: what loop_read does per packet
            if rc == mqtt.MQTT_ERR_AGAIN:
                return
            if rc > 0:
                client._loop_rc_handle(rc)  # closes the socket, calls on_disconnect
                return

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
