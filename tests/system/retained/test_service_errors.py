"""`RetainedService` keeps replicating when one message fails: its read loop and ticker
survive any error while handling one batch (real SQLite store and asyncio tasks; the transport,
the forwarding client and Mosquitto's read-back are stand-ins, this never reaches gRPC)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from sidecar.hlc import HybridClock
from sidecar.local.events import RetainedSeen
from sidecar.message import MessageProperties
from sidecar.peering.transport import FrameTooLarge
from sidecar.retained.replicator import ReadValue
from sidecar.retained.service import RetainedService


class Transport:
    """Fails the first `fail` sends (with `error`), then records the frames."""

    max_message_bytes = 64 << 10

    def __init__(self, fail: int, error: Exception) -> None:
        self.fail, self.error, self.sent = fail, error, []

    def send(self, peer: str, data: bytes) -> bool:
        if self.fail:
            self.fail -= 1
            raise self.error
        self.sent.append((peer, data))
        return True

    reply = send


class ForwardClient:
    def publish(self, *args, **kwargs) -> int:
        return 1

    def barrier(self) -> int:
        return 2


def _run(tmp_path: Path, transport: Transport, payloads: dict[str, bytes]) -> RetainedService:
    async def read(topics: list[str]) -> dict[str, ReadValue]:
        return {t: ReadValue(payloads[t]) for t in topics if t in payloads}

    async def scenario() -> RetainedService:
        service = RetainedService("n1", HybridClock(), tmp_path, transport, ForwardClient(),
                                  lambda: ["n2"], read)
        service.start()
        try:
            for topic, payload in payloads.items():
                service.on_local(RetainedSeen("e", 1, 0, "c", topic, payload, 1,
                                              MessageProperties()))
                await asyncio.sleep(0.05)  # one read-back each
            for _ in range(100):
                if len(transport.sent) >= len(payloads) - 1:
                    break
                await asyncio.sleep(0.02)
            return service
        finally:
            await service.stop()

    return asyncio.run(scenario())


def test_an_error_in_one_batch_leaves_the_read_loop_running(tmp_path: Path, caplog) -> None:
    transport = Transport(fail=1, error=RuntimeError("boom"))
    service = _run(tmp_path, transport, {"a": b"1", "b": b"2", "c": b"3"})
    assert service.counters["errors"] == 1  # the first write's broadcast failed
    assert len(transport.sent) == 2  # the next writes still went out
    assert any("this is a bug" in r.getMessage() for r in caplog.records
               if r.levelno == logging.ERROR)


def test_a_frame_too_large_is_counted_not_raised(tmp_path: Path) -> None:
    transport = Transport(fail=1, error=FrameTooLarge("too big"))
    service = _run(tmp_path, transport, {"a": b"1", "b": b"2"})
    assert service.counters["too_large"] == 1 and service.counters["errors"] == 0
    big = Transport(fail=0, error=RuntimeError())
    service = _run(tmp_path / "big", big, {"big": b"x" * (100 << 10), "after": b"ok"})
    assert service.counters["too_large"] == 1 and len(big.sent) == 2
    assert all(len(data) <= big.max_message_bytes for _, data in big.sent)
