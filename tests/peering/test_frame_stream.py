"""FrameStream's writer: `busy` while a frame is written or queued, and `on_drained` once the
last queued frame has been written (the origin builds its next frame then, so frames grow
with the load)."""

from __future__ import annotations

import asyncio

from sidecar.peering.frame_stream import Counters, FrameStream


def test_busy_and_drained_follow_the_writes() -> None:
    async def main() -> None:
        release = asyncio.Event()
        written: list[bytes] = []
        drained: list[int] = []

        async def write(data: bytes) -> None:
            await release.wait()
            written.append(data)

        async def read():
            await asyncio.Event().wait()

        stream = FrameStream("p", False, read, write, on_frame=lambda *a: None,
                             on_closed=lambda *a: None,
                             on_drained=lambda s: drained.append(len(written)),
                             counters=Counters(), heartbeat_interval=60, dead_after=120)
        task = asyncio.create_task(stream.run())
        await asyncio.sleep(0.01)  # the first heartbeat is being written, and blocks
        assert stream.busy and not drained
        stream.send(b"f1")
        stream.send(b"f2")
        assert stream.busy
        release.set()
        for _ in range(50):
            await asyncio.sleep(0)
            if drained:
                break
        assert len(written) == 3 and not stream.busy
        assert drained == [3]  # once, after the last queued frame was written
        stream.send(b"f3")
        assert stream.busy
        await asyncio.sleep(0.01)
        assert written[-1] == b"f3" and drained == [3, 4] and not stream.busy
        stream.close("done")
        await task

    asyncio.run(main())
