"""`FrameStream`: one established peer stream, either direction, after the handshake.

It owns three tasks while `run()` runs: a writer draining the outgoing queue into gRPC (telling
`on_drained` when it has written the last queued frame), a reader
handing frames to `on_frame` in stream order, and a ticker sending heartbeats and declaring the
peer dead when nothing arrived for `dead_after` seconds. The stream ends at the first of: the
peer ends it, gRPC fails it, the watchdog fires, or `close()`. `on_closed` is called exactly
once, synchronously, by whichever comes first, so no frame is delivered after it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import grpc.aio

from sidecar._proto import peer_pb2
from sidecar.peering import wire

log = logging.getLogger("mqfed.peering")

_HANDSHAKE_BODIES = frozenset({"hello", "welcome", "refuse"})


class Counters:
    """Traffic of one stream direction of one peer (kept across reconnects)."""

    __slots__ = ("frames_in", "frames_out", "bytes_in", "bytes_out", "unknown_in", "unexpected_in",
                 "superseded_out")

    def __init__(self) -> None:
        self.frames_in = self.frames_out = self.bytes_in = self.bytes_out = 0
        self.unknown_in = self.unexpected_in = 0
        self.superseded_out = 0  # cumulative frames replaced by a newer one before being written

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}


def describe(exc: BaseException) -> str:
    """A one-line reason for a failed stream."""
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"gRPC {exc.code().name}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class FrameStream:
    """One peer stream after the handshake (see the module docstring).

    `read` returns `(size, Frame)` or `grpc.aio.EOF`; `write` takes a serialized Frame.
    """

    def __init__(
        self,
        peer: str,
        inbound: bool,
        read: Callable[[], Awaitable[Any]],
        write: Callable[[bytes], Awaitable[None]],
        *,
        on_frame: Callable[[str, peer_pb2.Frame, bool], None],
        on_closed: Callable[[FrameStream, str], None],
        on_drained: Callable[[FrameStream], None] = lambda stream: None,
        counters: Counters,
        heartbeat_interval: float,
        dead_after: float,
    ) -> None:
        self.peer = peer
        self.inbound = inbound
        self.counters = counters
        self.announced = False  # the owner called on_*_up for this stream
        self.closed = False
        self.closed_locally = False  # ended by us (close/watchdog), not by the peer or gRPC
        self.reason = ""
        self._read = read
        self._write = write
        self._on_frame = on_frame
        self._on_closed = on_closed
        self._on_drained = on_drained
        self._heartbeat_interval = heartbeat_interval
        self._dead_after = dead_after
        self._queue: deque[bytes | str] = deque()  # a str: the key of a frame in _latest
        self._latest: dict[str, bytes] = {}  # cumulative frames waiting, by key (send_latest)
        self._writing = False
        self.queued_bytes = 0
        self._wakeup = asyncio.Event()
        self._done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._last_rx = asyncio.get_running_loop().time()

    @property
    def queued(self) -> int:
        """Frames waiting to be written."""
        return len(self._queue)

    @property
    def busy(self) -> bool:
        """A frame is being written or waits to be."""
        return self._writing or bool(self._queue)

    def send(self, data: bytes) -> bool:
        """Queue a serialized frame; False once the stream is closed."""
        if self.closed:
            return False
        self._queue.append(data)
        self.queued_bytes += len(data)
        self._wakeup.set()
        return True

    def send_latest(self, key: str, data: bytes) -> bool:
        """Queue a cumulative frame (one that says everything an earlier one of the same `key`
        said, as `InterestApplied(version)` does): if one of `key` still waits, it is replaced
        in its place, so a busy stream writes only the newest. False once the stream is closed."""
        if self.closed:
            return False
        old = self._latest.get(key)
        self._latest[key] = data
        if old is None:
            self._queue.append(key)
            self.queued_bytes += len(data)
            self._wakeup.set()
        else:
            self.counters.superseded_out += 1
            self.queued_bytes += len(data) - len(old)
        return True

    def close(self, reason: str, *, local: bool = True) -> None:
        """End the stream (idempotent); queued frames are dropped."""
        if self.closed:
            return
        self.closed = True
        self.closed_locally = local
        self.reason = reason
        self._queue.clear()
        self._latest.clear()
        self.queued_bytes = 0
        if not self._done.done():
            self._done.set_result(None)
        self._on_closed(self, reason)

    async def run(self) -> str:
        """Run until the stream ends; return why it ended."""
        tasks = [
            asyncio.create_task(self._read_loop(), name=f"peer-read-{self.peer}"),
            asyncio.create_task(self._write_loop(), name=f"peer-write-{self.peer}"),
            asyncio.create_task(self._tick_loop(), name=f"peer-tick-{self.peer}"),
        ]
        try:
            done, _ = await asyncio.wait([*tasks, self._done], return_when=asyncio.FIRST_COMPLETED)
            for task in tasks:
                if task in done and not self.closed:
                    if task.cancelled():
                        self.close("the stream was cancelled", local=False)
                    elif (exc := task.exception()) is not None:
                        self.close(describe(exc), local=False)
                    else:  # the watchdog is ours; the reader ends when the peer ends the stream
                        self.close(task.result(), local=task is tasks[2])
        finally:  # cancelled: by gRPC when the peer cancelled or the connection dropped
            self.close("the stream was cancelled or its connection dropped", local=False)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return self.reason

    async def _read_loop(self) -> str:
        loop = asyncio.get_running_loop()
        counters = self.counters
        while True:
            item = await self._read()
            if item is grpc.aio.EOF:
                return "the peer ended the stream"
            size, frame = item
            self._last_rx = loop.time()
            counters.frames_in += 1
            counters.bytes_in += size
            if frame is None:
                self.close(wire.NOT_A_FRAME)
                return self.reason
            kind = frame.WhichOneof("body")
            if kind == "heartbeat":
                continue
            if kind is None:  # a body from a newer minor version: ignored (peer.proto)
                counters.unknown_in += 1
                continue
            if kind in _HANDSHAKE_BODIES:
                counters.unexpected_in += 1
                log.debug("ignoring a %s frame after the handshake", kind,
                          extra={"peer": self.peer, "inbound": self.inbound})
                continue
            try:
                self._on_frame(self.peer, frame, self.inbound)
            except Exception:
                log.exception("the peer frame handler failed (frame dropped): this is a bug",
                              extra={"peer": self.peer, "inbound": self.inbound, "body": kind})
            if self.closed:
                return self.reason

    async def _write_loop(self) -> str:
        queue, counters = self._queue, self.counters
        while True:
            while not queue:
                self._wakeup.clear()
                await self._wakeup.wait()
            item = queue.popleft()
            data = self._latest.pop(item) if isinstance(item, str) else item
            self.queued_bytes -= len(data)
            self._writing = True
            try:
                await self._write(data)
            finally:
                self._writing = False
            counters.frames_out += 1
            counters.bytes_out += len(data)
            if not queue:  # the owner may build its next frame from what gathered meanwhile
                self._on_drained(self)

    async def _tick_loop(self) -> str:
        loop = asyncio.get_running_loop()
        tick = min(self._heartbeat_interval, self._dead_after / 4)
        last_tick = last_beat = loop.time()
        self.send(wire.heartbeat_frame())
        while True:
            await asyncio.sleep(tick)
            now = loop.time()
            if now - last_tick > tick + self._dead_after / 2:
                # We ourselves did not run for a while (stopped, starved): the peer's frames may
                # be waiting unread, so give it a fresh `dead_after` instead of blaming it.
                self._last_rx = now
            last_tick = now
            if now - self._last_rx > self._dead_after:
                return (f"nothing received for {self._dead_after:g}s: the peer is hung or the"
                        " network is cut")
            if now - last_beat >= self._heartbeat_interval:
                self.send(wire.heartbeat_frame())
                last_beat = now
