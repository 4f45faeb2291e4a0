"""FrameStream's writer: `busy` while a frame is written or queued, and `on_drained` once the
last queued frame has been written (the origin builds its next frame then, so frames grow
with the load)."""

from __future__ import annotations

import asyncio

from sidecar.peering import wire
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


def test_bytes_that_are_not_a_frame_end_the_stream_with_a_clear_reason() -> None:
    """Found by fuzzing: raised by the gRPC deserializer, a decoding error ended the stream
    inside gRPC (a traceback in the log, no reason); now the reader ends it itself."""
    async def main() -> None:
        items = [wire.decode(b"\x0a\x05\xff"), wire.decode(wire.heartbeat_frame())]
        assert items[0] == (3, None)
        frames: list = []
        closed: list[str] = []

        async def read():
            return items.pop(0) if items else await asyncio.Event().wait()

        async def write(data: bytes) -> None:
            return None

        stream = FrameStream("p", True, read, write, on_frame=lambda *a: frames.append(a),
                             on_closed=lambda s, reason: closed.append(reason),
                             counters=Counters(), heartbeat_interval=60, dead_after=120)
        assert await stream.run() == wire.NOT_A_FRAME
        assert closed == [wire.NOT_A_FRAME] and stream.closed_locally and frames == []

    asyncio.run(main())


def test_a_cumulative_frame_replaces_the_one_still_queued() -> None:
    """`send_latest`: while the stream is busy, a newer answer of the same key takes the place
    of the one waiting (InterestApplied(v) says all InterestApplied(v-1) said), so a busy
    stream writes one answer per key, the newest, in the place of the first."""
    async def main() -> None:
        release = asyncio.Event()
        written: list[bytes] = []

        async def write(data: bytes) -> None:
            await release.wait()
            written.append(data)

        async def read():
            await asyncio.Event().wait()

        counters = Counters()
        stream = FrameStream("p", True, read, write, on_frame=lambda *a: None,
                             on_closed=lambda *a: None, counters=counters,
                             heartbeat_interval=60, dead_after=120)
        task = asyncio.create_task(stream.run())
        await asyncio.sleep(0.01)  # the first heartbeat is being written, and blocks
        assert stream.send_latest("applied", b"v1")
        stream.send(b"other")
        assert stream.send_latest("applied", b"v2")
        assert stream.send_latest("applied", b"v3")
        assert stream.queued == 2 and stream.queued_bytes == len(b"v3") + len(b"other")
        release.set()
        for _ in range(50):
            await asyncio.sleep(0)
            if not stream.busy:
                break
        assert written[1:] == [b"v3", b"other"]
        assert counters.superseded_out == 2 and counters.frames_out == 3
        stream.send_latest("applied", b"v4")  # nothing of that key waits: queued anew
        await asyncio.sleep(0.01)
        assert written[-1] == b"v4" and counters.superseded_out == 2
        stream.close("done")
        assert not stream.send_latest("applied", b"v5")
        await task

    asyncio.run(main())
