"""The capture socket, sidecar side: its wire format (sidecar.local.capture_wire) and the
asyncio adapter (sidecar.local.capture_link) against a raw unix-socket peer playing the
plugin."""

from __future__ import annotations

import asyncio
import socket
import struct
import tempfile
from pathlib import Path

import pytest

from sidecar.local.batch import Record, encode_batch
from sidecar.local.capture_link import CaptureLink
from sidecar.local.capture_wire import (
    HELLO_SIZE,
    KIND_ACK,
    KIND_RESUME,
    CapturedBatch,
    CaptureDecoder,
    CaptureWireError,
    Hello,
    decode_ack,
    decode_hello,
    encode_ack,
    encode_hello,
    encode_resume,
)
from sidecar.message import MessageProperties

RECS = [Record("t/a", b"one", 0, seq=5, hlc=7 << 16, client="pub"),
        Record("t/b", b"two", 2, retain=True, seq=6, hlc=8 << 16, client="pub",
               properties=MessageProperties(user=(("k", "v"),)))]


def test_hello_layout():
    data = encode_hello(0x0102030405060708, 9)
    assert len(data) == HELLO_SIZE == 24
    assert data == b"MQFH\x01\x00\x00\x00" + struct.pack("<QQ", 0x0102030405060708, 9)
    assert decode_hello(data) == Hello(0x0102030405060708, 9)


@pytest.mark.parametrize("bad", [
    b"MQFX\x01\x00\x00\x00" + bytes(16),
    b"MQFH\x02\x00\x00\x00" + struct.pack("<QQ", 1, 1),
    b"MQFH\x01\x00\x00\x00" + struct.pack("<QQ", 0, 1),
    b"MQFH\x01\x00\x00\x00" + struct.pack("<QQ", 1, 1)[:-1],
])
def test_bad_hellos(bad):
    with pytest.raises(CaptureWireError):
        decode_hello(bad)


def test_ack_and_resume_layout():
    assert encode_resume(0) == b"MQFA\x01\x01\x00\x00" + bytes(8)
    data = encode_ack(10, [14, 12, 12])
    assert data == b"MQFA\x01\x02\x02\x00" + struct.pack("<QQQ", 10, 12, 14)
    assert decode_ack(data) == (KIND_ACK, 10, [12, 14])
    assert decode_ack(encode_resume(3, [5])) == (KIND_RESUME, 3, [5])
    with pytest.raises(CaptureWireError):
        encode_ack(10, [10])
    with pytest.raises(CaptureWireError):
        decode_ack(data[:-1])


def test_the_decoder_splits_a_stream_fed_byte_by_byte():
    b1 = encode_batch(5, RECS)
    b2 = encode_batch(7, [Record("t/c", b"", 1, seq=7)])
    stream = encode_hello(42, 5) + b1 + b2
    dec = CaptureDecoder()
    got = []
    for i in range(len(stream)):
        got += dec.feed(stream[i:i + 1])
    assert got == [Hello(42, 5), CapturedBatch(5, RECS, b1),
                   CapturedBatch(7, [Record("t/c", b"", 1, seq=7)], b2)]
    # all at once gives the same
    assert CaptureDecoder().feed(stream) == got


def test_an_empty_batch_is_complete_at_its_header():
    assert CaptureDecoder().feed(encode_hello(1, 1) + encode_batch(1, []))[1].records == []


@pytest.mark.parametrize("stream", [
    b"MQFB" + bytes(20),                                    # no hello first
    encode_hello(1, 1) + b"XQFB",                           # not a batch
    encode_hello(1, 1) + encode_batch(1, RECS)[:21] + b"\x0b" + encode_batch(1, RECS)[22:],
    encode_hello(1, 1) + encode_batch(1, [])[:6] + b"\x01\x00" + bytes(8)
    + struct.pack("<I", 1 << 31),                           # a record too long
])
def test_the_decoder_refuses_bad_streams(stream):
    with pytest.raises(CaptureWireError):
        CaptureDecoder().feed(stream)


def recv_exact(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


def test_the_link_resumes_hands_batches_over_and_acks():
    async def scenario(path: Path) -> None:
        hellos, batches = [], []

        def on_hello(h: Hello) -> int:
            hellos.append(h)
            return 4

        link = CaptureLink(path, on_hello, lambda h, b: batches.append((h, b)))
        await link.start()
        assert path.stat().st_mode & 0o777 == 0o666
        assert link.ack(1) is False   # no connection
        plugin = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        plugin.connect(str(path))
        plugin.setblocking(False)
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(plugin, encode_hello(99, 5))
        resume = b""
        while len(resume) < 16:
            resume += await loop.sock_recv(plugin, 16 - len(resume))
        assert decode_ack(resume) == (KIND_RESUME, 4, [])
        assert link.connected and link.hello == Hello(99, 5)
        data = encode_batch(5, RECS)
        await loop.sock_sendall(plugin, data[:10])
        await asyncio.sleep(0.05)
        assert batches == []
        await loop.sock_sendall(plugin, data[10:])
        for _ in range(100):
            if batches:
                break
            await asyncio.sleep(0.01)
        assert batches == [(Hello(99, 5), CapturedBatch(5, RECS, data))]
        assert link.ack(5, [6]) is True
        ack = b""
        while len(ack) < 24:
            ack += await loop.sock_recv(plugin, 24 - len(ack))
        assert decode_ack(ack) == (KIND_ACK, 5, [6])
        # garbage closes the connection
        await loop.sock_sendall(plugin, b"junk")
        assert await loop.sock_recv(plugin, 16) == b""
        plugin.close()
        assert link.errors == 1 and not link.connected
        assert (hellos, link.connections, link.batches, link.records) == ([Hello(99, 5)], 1,
                                                                            1, 2)
        await link.close()
        assert not path.exists()

    with tempfile.TemporaryDirectory() as d:
        asyncio.run(asyncio.wait_for(scenario(Path(d) / "capture.sock"), 10))
