"""A shadow's collection of a queue: messages come on paho's thread, in order, and the drain
marker behind them is found however many runs they came in (`ThreadHandoff`; no broker:
paho's callback is called as its network thread would call it)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import paho.mqtt.client as mqtt

from sidecar.sessions.shadow import Shadow, ShadowError

MARKER = "$mqfed/marker"


def _message(topic: str, payload: bytes, mid: int) -> mqtt.MQTTMessage:
    msg = mqtt.MQTTMessage(mid=mid, topic=topic.encode())
    msg.payload, msg.qos = payload, 1
    return msg


def _feed(shadow: Shadow, count: int, marker: bytes | None) -> threading.Thread:
    """`count` queued messages then (maybe) the marker, from another thread, as paho does."""
    def run() -> None:
        for i in range(count):
            shadow._on_message(None, None, _message("q/t", str(i).encode(), i + 1))
        if marker is not None:
            shadow._on_message(None, None, _message(MARKER, marker, count + 1))
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_queue_of_many_messages_arrives_whole_and_in_order_before_its_marker():
    async def main() -> list[bytes]:
        shadow = Shadow(Path("/nonexistent.sock"), "secret", "c1")
        thread = _feed(shadow, 20_000, b"c1:1")
        await shadow.wait_for(MARKER, b"c1:1", timeout=30)
        thread.join()
        return [m.payload for m, _ in shadow.messages]

    payloads = asyncio.run(main())
    assert payloads[:-1] == [str(i).encode() for i in range(20_000)]
    assert payloads[-1] == b"c1:1"


def test_a_marker_that_never_comes_is_an_error_after_the_timeout():
    async def main() -> None:
        shadow = Shadow(Path("/nonexistent.sock"), "secret", "c2")
        thread = _feed(shadow, 100, None)
        try:
            await shadow.wait_for(MARKER, b"c2:1", timeout=0.5)
        finally:
            thread.join()

    try:
        asyncio.run(main())
    except ShadowError as exc:
        assert "did not arrive" in str(exc)
    else:
        raise AssertionError("no error for a marker that never came")
