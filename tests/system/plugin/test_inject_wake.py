"""The reply to an inject batch on an idle Mosquitto (issue 25): the plugin answers at the end
of the loop iteration that routed the batch, which ends when Mosquitto's `epoll_wait` returns:
at its next socket event, or after its 100 ms timeout. So a batch whose subscribers send
nothing back (none here) is answered about 100 ms late, unless something wakes Mosquitto:
the sidecar's wake (`$CONTROL/mqfed/wake`, sidecar.routing.injection) does, once a batch has
waited WAKE_AFTER for its reply."""

from __future__ import annotations

import asyncio
import statistics
import time

from sidecar.local.batch import WAKE_TOPIC, Record, encode_batch, encode_record
from sidecar.local.forward_client import ForwardClient
from sidecar.routing.forwarder import Envelope
from sidecar.routing.injection import WAKE_AFTER, BatchInjection
from tests.system.plugin.helpers import SECRET, SIDECAR_ID, FakeSidecar

ROUNDS = 7
GAP = 0.13  # between batches: longer than the epoll timeout, so each starts on an idle loop


def _replied(sc: FakeSidecar, batch_id: int) -> bool:
    return any(r.get("cmd") == "inject" and r.get("batch") == batch_id
               for r in sc.replies.get(None, []))


def _reply_ms(sc: FakeSidecar, batch_id: int, wake: bool) -> float:
    """Inject one message nobody subscribes to on the control connection; ms to its reply."""
    data = encode_batch(batch_id, [encode_record(Record("idle/x", b"p", 1))])
    start = time.monotonic()
    sc.send(data, topic="$CONTROL/mqfed/inject")
    if wake:
        sc.c.publish(WAKE_TOPIC, b"", qos=0)
    deadline = start + 5
    with sc.cond:
        while not _replied(sc, batch_id):
            assert time.monotonic() < deadline, f"no reply to batch {batch_id}"
            sc.cond.wait(0.5)
    return (time.monotonic() - start) * 1000


def test_an_idle_mosquitto_answers_at_its_next_socket_event_which_a_wake_publish_is(
        make_broker, clients):
    """Without another socket event the reply comes after the epoll timeout (~100 ms); a QoS 0
    publish to the handler-less wake topic right after the batch brings it at once."""
    b = make_broker()
    sc = clients(FakeSidecar(b.sock)).start()
    plain, woken = [], []
    for i in range(ROUNDS):
        plain.append(_reply_ms(sc, 2 * i + 1, wake=False))
        time.sleep(GAP)
        woken.append(_reply_ms(sc, 2 * i + 2, wake=True))
        time.sleep(GAP)
    assert statistics.median(plain) > 70, plain
    assert statistics.median(woken) < 30, woken


def _envelope(i: int) -> Envelope:
    return Envelope("n1", 7, i, i << 16, "idle/x", b"p", 1, first_seq=i)


def test_the_sidecar_wakes_an_idle_mosquitto_for_an_unanswered_batch(make_broker, clients):
    """The real forwarding connection and batch injection: a QoS 1 message nobody subscribes
    to is confirmed within WAKE_AFTER and a loop turn (before the wake: ~100 ms), one wake per
    batch; the message is still confirmed only by the plugin's reply."""
    b = make_broker()
    clients(FakeSidecar(b.sock)).start()
    held: list[int] = []

    async def run() -> tuple[list[float], dict]:
        fwd = ForwardClient(b.sock, SECRET, SIDECAR_ID + ".fwd", on_copies=lambda c: None,
                            on_published=lambda t: None, on_connected=lambda present: None)
        await fwd.connect()
        inj = BatchInjection(fwd, held.extend, lambda items: None)
        times = []
        try:
            for i in range(ROUNDS):
                ticket = inj.ticket()
                start = time.monotonic()
                inj.send([(ticket, _envelope(i + 1))])
                while ticket not in held:
                    assert time.monotonic() - start < 5, "no reply"
                    await asyncio.sleep(0.0005)
                times.append((time.monotonic() - start) * 1000)
                await asyncio.sleep(GAP)
        finally:
            fwd.close()
        return times, inj.counters

    times, counters = asyncio.run(run())
    assert WAKE_AFTER * 1000 < 30
    assert statistics.median(times) < 50, times
    assert counters["batches"] == ROUNDS and counters["timeouts"] == 0, counters
    assert 1 <= counters["wakes"] <= ROUNDS, counters
