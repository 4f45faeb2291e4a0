"""Batch re-injection (sidecar.routing.injection): batches split by size and count, tickets
confirmed on the plugin's reply (QoS > 0 only), refused or unanswered batches handed back."""

from __future__ import annotations

import asyncio

import pytest

from sidecar.local.batch import decode_batch
from sidecar.routing import injection
from sidecar.routing.forwarder import Envelope
from sidecar.routing.injection import BatchInjection


class FakeInjector:
    def __init__(self) -> None:
        self.sent: list[tuple[int, bytes, asyncio.Future]] = []
        self.forgotten: list[int] = []

    def inject(self, batch_id: int, batch: bytes) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self.sent.append((batch_id, batch, fut))
        return fut

    def forget_injection(self, batch_id: int) -> None:
        self.forgotten.append(batch_id)


def env(i: int, qos: int = 1, size: int = 10) -> Envelope:
    return Envelope("n1", 7, i, i << 16, f"t/{i}", b"x" * size, qos)


def run(coro):
    return asyncio.run(coro)


def test_a_reply_confirms_the_qos_1_and_2_tickets_in_order():
    async def main():
        fake, held, failed = FakeInjector(), [], []
        inj = BatchInjection(fake, held.extend, failed.extend)
        items = [(inj.ticket(), env(i, qos=i % 3)) for i in range(6)]
        inj.send(items)
        (bid, data, fut), = fake.sent
        assert decode_batch(data)[0] == bid
        assert [r.seq for r in decode_batch(data)[1]] == [0, 1, 2, 3, 4, 5]
        fut.set_result({"ok": True, "batch": bid, "count": 6})
        await asyncio.sleep(0)
        return items, held, failed, inj.counters
    items, held, failed, counters = run(main())
    assert held == [t for t, e in items if e.qos] and all(t < 0 for t in held)
    assert failed == [] and counters["batches"] == 1 and counters["messages"] == 6


def test_large_frames_split_into_several_batches(monkeypatch):
    monkeypatch.setattr(injection, "MAX_BATCH_BYTES", 1000)
    monkeypatch.setattr(injection, "MAX_BATCH_RECORDS", 3)

    async def main():
        fake = FakeInjector()
        inj = BatchInjection(fake, lambda t: None, lambda i: None)
        inj.send([(inj.ticket(), env(i, size=300)) for i in range(7)])
        return [len(decode_batch(data)[1]) for _, data, _ in fake.sent]
    assert run(main()) == [2, 2, 2, 1]


def test_refused_or_unanswered_batches_come_back(monkeypatch):
    monkeypatch.setattr(injection, "REPLY_TIMEOUT", 0.05)

    async def main():
        fake, held, failed = FakeInjector(), [], []
        inj = BatchInjection(fake, held.extend, failed.extend)
        a = [(inj.ticket(), env(1))]
        b = [(inj.ticket(), env(2))]
        inj.send(a)
        inj.send(b)
        fake.sent[0][2].set_result({"ok": False, "error": "topic", "at": 0})
        await asyncio.sleep(0.2)          # b: no reply
        return a, b, held, failed, fake.forgotten, inj.counters
    a, b, held, failed, forgotten, counters = run(main())
    assert held == [] and failed == a + b and forgotten == [2]
    assert (counters["refused"], counters["timeouts"]) == (1, 1)


@pytest.mark.parametrize("qos", [0, 1])
def test_nothing_is_confirmed_before_the_reply(qos):
    async def main():
        fake, held = FakeInjector(), []
        inj = BatchInjection(fake, held.extend, lambda i: None)
        inj.send([(inj.ticket(), env(1, qos=qos))])
        await asyncio.sleep(0.01)
        return held
    assert run(main()) == []
