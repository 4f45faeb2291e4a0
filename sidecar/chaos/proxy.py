"""A TCP proxy that delays what it forwards (adapter): the slow link of `mqfed chaos`.

Every chunk read in either direction is written `delay_ms` +- `jitter_ms` later, never before
the chunk before it (the byte stream keeps its order, as TCP over a slow path does). The delay
can change while it runs (0: forward at once). It runs its own asyncio loop in a thread;
`close()` stops it and every connection it holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time


class DelayProxy:
    """Forwards `listen_host`:port (chosen free, `port`) to `target_host`:`target_port`."""

    def __init__(self, listen_host: str, target_host: str, target_port: int) -> None:
        self.listen_host = listen_host
        self.target = (target_host, target_port)
        self.delay_ms = 0.0
        self.jitter_ms = 0.0
        self.port = 0
        self.chunks = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task] = set()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="chaos-proxy")
        self._thread.start()
        if not self._ready.wait(10) or not self.port:
            raise RuntimeError(f"the delaying proxy could not listen on {listen_host}")

    @property
    def address(self) -> str:
        return f"{self.listen_host}:{self.port}"

    def set_delay(self, delay_ms: float, jitter_ms: float = 0.0) -> None:
        self.delay_ms, self.jitter_ms = delay_ms, jitter_ms

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._serve, self.listen_host, 0))
            self.port = self._server.sockets[0].getsockname()[1]
        finally:
            self._ready.set()
        self._loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        pumps = [asyncio.ensure_future(self._pump(reader, up_writer)),
                 asyncio.ensure_future(self._pump(up_reader, writer))]
        self._tasks.update(pumps)
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in pumps:
                task.cancel()
                self._tasks.discard(task)
            for w in (writer, up_writer):
                w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        sender = asyncio.ensure_future(self._send(queue, writer))
        last = 0.0
        try:
            while data := await reader.read(65536):
                delay = max(0.0, self.delay_ms + random.uniform(-self.jitter_ms,
                                                                 self.jitter_ms)) / 1000
                last = max(last, time.monotonic() + delay)
                self.chunks += 1
                queue.put_nowait((last, data))
            queue.put_nowait((last, b""))
            await sender
        finally:
            sender.cancel()

    @staticmethod
    async def _send(queue: asyncio.Queue, writer: asyncio.StreamWriter) -> None:
        while True:
            due, data = await queue.get()
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                with contextlib.suppress(OSError):
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    def close(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            for task in list(self._tasks):
                task.cancel()

        if self._loop.is_running():
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(5)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
