"""A fake peer that holds the cluster's peer token: it proves the token like a node dialling
(Challenge, then the proof in the Stream call's metadata), checks the node's answer, sends
its Hello, and then whatever bytes a test wants on the stream (each one gRPC message). It
runs on its own event loop thread so that synchronous tests (hypothesis) can drive it; it
reads what the node sends and sends heartbeats, so the stream stays up between sends."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any

import grpc
import grpc.aio

from sidecar._proto import peer_pb2
from sidecar.grpc_auth import Prover
from sidecar.peering import wire
from sidecar.peering.handshake import CAPABILITIES, PROTOCOL_MAJOR, PROTOCOL_MINOR


class FakePeer:
    """`connect()` once; `send(data)` any number of times (it reconnects if the node ended the
    stream: `streams` counts the streams opened, `ends` the reasons they ended)."""

    def __init__(self, cluster_id: str, node_id: str, token: str, callee: str,
                 address: str) -> None:
        self.cluster_id, self.node_id, self.callee, self.address = (cluster_id, node_id,
                                                                     callee, address)
        self.prover = Prover(token, "peer", node_id)
        self.streams = 0
        self.ends: list[str] = []
        self.received: dict[str, int] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._channel: grpc.aio.Channel | None = None
        self._call: Any = None
        self._tasks: list[asyncio.Task] = []
        self._lock: asyncio.Lock | None = None  # one write at a time on a gRPC call

    def run(self, coro: Coroutine, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def connect(self, incarnation: int = 1) -> peer_pb2.Frame:
        """Open an authenticated stream; the node's first answer (a Welcome when accepted)."""
        return self.run(self._connect(incarnation))

    def send(self, data: bytes) -> None:
        self.run(self._send(data))

    def up(self) -> bool:
        return self.run(self._up())

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.run(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    async def _up(self) -> bool:
        return self._call is not None and not self._call.done()

    async def _connect(self, incarnation: int) -> peer_pb2.Frame:
        await self._close()
        self._channel = grpc.aio.insecure_channel(
            self.address, options=[("grpc.enable_http_proxy", 0),
                                   ("grpc.max_send_message_length", -1),
                                   ("grpc.max_receive_message_length", -1)])
        claim = await self.prover.claim(self._channel, wire.CHALLENGE, self.callee, self.address,
                                        10, peer_pb2.ChallengeReply)
        call = self._channel.stream_stream(wire.METHOD)(metadata=self.prover.metadata(claim))
        assert self.prover.answered(claim, await call.initial_metadata()), \
            "the node did not prove the peer token"
        hello = peer_pb2.Hello(cluster_id=self.cluster_id, node_id=self.node_id,
                               protocol_major=PROTOCOL_MAJOR, protocol_minor=PROTOCOL_MINOR,
                               capabilities=sorted(CAPABILITIES), incarnation=incarnation,
                               grpc_address="127.0.0.1:1", mqtt_address="127.0.0.1:1")
        await call.write(peer_pb2.Frame(hello=hello).SerializeToString())
        first = peer_pb2.Frame.FromString(await call.read())
        self._call = call
        self.streams += 1
        self._tasks = [asyncio.create_task(self._drain(call)),
                       asyncio.create_task(self._beat(call))]
        return first

    async def _send(self, data: bytes) -> None:
        if not await self._up():
            await asyncio.gather(*self._tasks, return_exceptions=True)  # the reason it ended
            await self._connect(incarnation=1 + self.streams)
        await self._write(self._call, data)

    async def _write(self, call: Any, data: bytes) -> None:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                await call.write(data)

    async def _drain(self, call: Any) -> None:
        try:
            while (data := await call.read()) is not grpc.aio.EOF:
                kind = peer_pb2.Frame.FromString(data).WhichOneof("body") or "?"
                self.received[kind] = self.received.get(kind, 0) + 1
        except grpc.aio.AioRpcError as exc:
            self.ends.append(f"{exc.code().name}: {exc.details()}")
        else:
            self.ends.append(f"{(await call.code()).name}: {await call.details()}")

    async def _beat(self, call: Any) -> None:
        with contextlib.suppress(Exception):
            while not call.done():
                await self._write(call, wire.heartbeat_frame())
                await asyncio.sleep(0.5)

    async def _close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._call is not None:
            self._call.cancel()
            self._call = None
        if self._channel is not None:
            await self._channel.close(None)
            self._channel = None
