"""Batch re-injection (sidecar.routing.injection): batches split by size and count, tickets
confirmed on the plugin's reply (QoS > 0 only), refused or unanswered batches handed back."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from sidecar.local.batch import decode_batch
from sidecar.routing import injection
from sidecar.routing.forwarder import Envelope
from sidecar.routing.injection import BatchInjection


class FakeInjector:
    def __init__(self) -> None:
        self.sent: list[tuple[int, bytes, asyncio.Future]] = []
        self.forgotten: list[int] = []
        self.wakes = 0

    def inject(self, batch_id: int, batch: bytes) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self.sent.append((batch_id, batch, fut))
        return fut

    def forget_injection(self, batch_id: int) -> None:
        self.forgotten.append(batch_id)

    def wake(self) -> None:
        self.wakes += 1


def env(i: int, qos: int = 1, size: int = 10) -> Envelope:
    return Envelope("n1", 7, i, i << 16, f"t/{i}", b"x" * size, qos, first_seq=i)


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


def test_batches_wait_for_room_in_the_fullest_subscribers_queue(monkeypatch):
    """max_queued_messages 100: batches carry at most 50 messages less the reported queue
    and what is unanswered; the rest waits in order for the replies."""
    monkeypatch.setattr(injection, "PROBE_AFTER", 0.01)

    async def main():
        fake, held = FakeInjector(), []
        inj = BatchInjection(fake, held.extend, lambda i: None, max_queued=100)
        inj.send([(inj.ticket(), env(i)) for i in range(120)])
        sizes = [len(decode_batch(d)[1]) for _, d, _ in fake.sent]
        assert sizes == [50]                      # nothing measured yet: the limit
        fake.sent[0][2].set_result({"ok": True, "count": 50, "queued": 40})
        await asyncio.sleep(0)
        assert [len(decode_batch(d)[1]) for _, d, _ in fake.sent[1:]] == [10]
        fake.sent[1][2].set_result({"ok": True, "count": 10, "queued": 50})   # full
        await asyncio.sleep(0.05)                  # probes: one message at a time
        probes = fake.sent[2:]
        assert probes and all(len(decode_batch(d)[1]) == 1 for _, d, _ in probes)
        assert len(probes) == 1                    # the next waits for its reply
        probes[0][2].set_result({"ok": True, "count": 1, "queued": 0})        # drained
        await asyncio.sleep(0)
        assert len(decode_batch(fake.sent[-1][1])[1]) == 50
        fake.sent[-1][2].set_result({"ok": True, "count": 50, "queued": 0})
        await asyncio.sleep(0)
        seqs = [r.seq for _, d, _ in fake.sent for r in decode_batch(d)[1]]
        return seqs, inj.counters, inj.status()
    seqs, counters, status = run(main())
    assert seqs == list(range(120))               # every message once, in order
    assert counters["waits"] >= 1 and counters["probes"] >= 1
    assert status["pending"] == 0


def test_a_queue_that_never_shrinks_lifts_the_bound(monkeypatch):
    """A subscriber that does not read: after GIVE_UP_AFTER without progress the others are
    no longer held up by it; the bound comes back once its queue is under the limit."""
    from sidecar.routing.inject_room import GIVE_UP_AFTER, QueueRoom
    room = QueueRoom(1000)
    room.sent(500)
    assert not room.answered(500, 600, now=0.0) and room.room() < 1
    assert not room.answered(0, 590, now=3.0)     # shrinking: still waiting
    assert not room.answered(0, 590, now=3.0 + GIVE_UP_AFTER - 0.1)
    assert room.answered(0, 595, now=3.0 + GIVE_UP_AFTER) and room.room() == float("inf")
    assert not room.answered(0, 10, now=20.0) and room.room() == 490
    assert QueueRoom(0).room() == float("inf")    # max_queued_messages 0: no bound


def test_a_record_names_the_messages_publisher_where_the_origin_knew_it():
    """The receiving plugin keeps a client's own message from its No Local subscriptions by
    the record's client id (issue 17)."""
    async def main():
        fake = FakeInjector()
        inj = BatchInjection(fake, [].extend, [].extend)
        inj.send([(inj.ticket(), replace(env(1), publisher="dev-7")), (inj.ticket(), env(2))])
        (_, data, _), = fake.sent
        return [r.client for r in decode_batch(data)[1]]
    assert run(main()) == ["dev-7", ""]


def test_records_carry_identities_and_cuts():
    """A message's record names its origin and first seq (a moving session's cut mode), a
    replay (first seq 0) neither; a cut envelope is a cut record."""
    async def main():
        fake = FakeInjector()
        inj = BatchInjection(fake, [].extend, [].extend)
        inj.send([(inj.ticket(), replace(env(3), origin_seq=9)),
                  (inj.ticket(), replace(env(4), first_seq=0)),
                  (inj.ticket(), Envelope("n2", 1, 12, 0, "", b"", 1, first_seq=12,
                                          cut_client="dev-1"))])
        (_, data, _), = fake.sent
        return [(r.kind, r.origin, r.seq, r.client) for r in decode_batch(data)[1]]
    assert run(main()) == [(1, "n1/7", 3, ""), (1, "", 0, ""), (2, "n2/1", 12, "dev-1")]


def test_a_message_no_record_can_carry_is_dropped_and_the_rest_go_on():
    """A peer's message the record format refuses (here a topic over 65,535 bytes) used to
    raise in the pump, which then never ran again: nothing more reached local subscribers
    (found by the peer fuzzer). It is dropped, acknowledged, counted; the others go."""
    async def main():
        fake, held, failed = FakeInjector(), [], []
        inj = BatchInjection(fake, held.extend, failed.extend)
        bad = replace(env(1), topic="t/" + "x" * 70_000)
        items = [(inj.ticket(), env(0)), (inj.ticket(), bad), (inj.ticket(), env(2))]
        inj.send(items)
        (bid, data, fut), = fake.sent
        assert [r.seq for r in decode_batch(data)[1]] == [0, 2]
        fut.set_result({"ok": True, "batch": bid, "count": 2})
        await asyncio.sleep(0)
        inj.send([(inj.ticket(), env(3))])  # the pump still runs
        return items, held, inj.counters, len(fake.sent)
    items, held, counters, batches = run(main())
    assert held == [items[1][0], items[0][0], items[2][0]] and counters["unencodable"] == 1
    assert batches == 2


def test_a_prompt_reply_costs_no_wake(monkeypatch):
    monkeypatch.setattr(injection, "WAKE_AFTER", 0.01)

    async def main():
        fake = FakeInjector()
        inj = BatchInjection(fake, lambda t: None, lambda i: None)
        for i in range(3):
            inj.send([(inj.ticket(), env(i))])
            bid, _, fut = fake.sent[-1]
            fut.set_result({"ok": True, "batch": bid, "count": 1})
            await asyncio.sleep(0)
        await asyncio.sleep(0.05)
        return fake.wakes, inj.counters["wakes"]
    assert run(main()) == (0, 0)


def test_an_unanswered_batch_wakes_mosquitto_once_and_a_wake_covers_earlier_batches(
        monkeypatch):
    """Mosquitto answers at the end of the loop iteration that routed a batch: on an idle
    Mosquitto only the next socket event ends it, which the wake is."""
    monkeypatch.setattr(injection, "WAKE_AFTER", 0.1)

    async def main():
        fake = FakeInjector()
        inj = BatchInjection(fake, lambda t: None, lambda i: None)
        inj.send([(inj.ticket(), env(1))])
        await asyncio.sleep(0.01)
        inj.send([(inj.ticket(), env(2))])
        await asyncio.sleep(0.02)
        early = fake.wakes                      # 30 ms: the first has not waited 100 ms yet
        await asyncio.sleep(0.15)
        after_one = fake.wakes                  # 180 ms: one wake for both
        await asyncio.sleep(0.25)
        still = fake.wakes                      # never woken again, though still unanswered
        inj.send([(inj.ticket(), env(3))])      # a batch after the wake gets its own
        await asyncio.sleep(0.2)
        for bid, _, fut in fake.sent:
            fut.set_result({"ok": True, "batch": bid, "count": 1})
        await asyncio.sleep(0)
        return early, after_one, still, fake.wakes, inj.counters["wakes"]
    assert run(main()) == (0, 1, 1, 2, 2)


def test_a_wake_waits_for_the_oldest_unanswered_batch_sent_since_the_last_one(monkeypatch):
    monkeypatch.setattr(injection, "WAKE_AFTER", 0.2)

    async def main():
        fake = FakeInjector()
        inj = BatchInjection(fake, lambda t: None, lambda i: None)
        inj.send([(inj.ticket(), env(1))])
        await asyncio.sleep(0.1)
        inj.send([(inj.ticket(), env(2))])
        bid, _, fut = fake.sent[0]
        fut.set_result({"ok": True, "batch": bid, "count": 1})   # the first is answered
        await asyncio.sleep(0.15)   # 250 ms: the first's timer fired, the second waited 150
        early = fake.wakes
        await asyncio.sleep(0.15)   # 400 ms: the second waited 300
        return early, fake.wakes
    assert run(main()) == (0, 1)
