"""A drain whose hand-over fails gives its session back (`sidecar.sessions.shadow`), on a real
Mosquitto with the plugin: the sidecar's shadow read the queue (it sent PUBREC for each QoS 2
message, and Mosquitto its PUBREL), so Mosquitto keeps only the PUBRELs of the QoS 2 messages.
They used to be lost for the client; now what the other node did not take comes to the client
that resumes here, each once, and what it took does not come again."""

from __future__ import annotations

import asyncio
import base64
import time
from pathlib import Path

from sidecar.local.events import deliver_item
from sidecar.sessions.shadow import MARKER_TOPIC, Queued, Shadows
from tests.harness.procs import wait_for
from tests.system.plugin.helpers import SECRET, RawClient

TOPIC = "giveback/t"


def _session_with_queue(clients, broker, sidecar, name: str) -> list[bytes]:
    """`name` (persistent, QoS 2) leaves; 10 QoS 2 and 10 QoS 1 messages, interleaved, are
    queued for it; returns their payloads in order."""
    sub = clients(RawClient(name, port=broker.port, clean_start=False, session_expiry=600))
    sub.connect()
    sub.subscribe(TOPIC, 2)
    sub.disconnect()
    sidecar.wait_type("disconnect", client=name)
    pub = clients(RawClient(f"pub-{time.time_ns()}", port=broker.port))
    pub.connect()
    payloads = []
    for i in range(20):
        payload = f"m{i:02d}".encode()
        if i % 2:
            pub.publish(TOPIC, payload, qos=1)
        else:
            pub.publish2(TOPIC, payload)
        payloads.append(payload)
    return payloads


def _drain_and_fail(broker, sidecar, name: str, taken: int) -> tuple[list[Queued], dict]:
    """Drain `name` with the sidecar's shadow, as a hand-over that fails after the other node
    took the first `taken` messages; returns what the drain read and the counters."""

    async def deliver_marker(client: str, topic: str, payload: bytes) -> None:
        reply = await asyncio.to_thread(sidecar.call, "deliver", client=client, topic=topic,
                                        payload=base64.b64encode(payload).decode(), qos=2)
        assert reply["ok"] is True, reply

    async def deliver_again(client: str, messages: list[Queued]) -> None:
        items = [deliver_item(q.topic, q.payload, q.qos, q.properties, q.subscription_ids)
                 for q in messages]
        reply = await asyncio.to_thread(sidecar.call, "deliver_batch", client=client,
                                        messages=items)
        assert reply["ok"] is True, reply

    async def set_options(client: str, subscriptions: dict[str, int]) -> None:
        raise AssertionError("a drain sets no options")

    async def run() -> tuple[list[Queued], dict]:
        shadows = Shadows(Path(broker.sock), SECRET, deliver_marker, deliver_again, set_options)
        shadow = await shadows.drain(name, (), {TOPIC: 2})
        read = [q for _, q in shadow.queue()]
        await shadows.finish(shadow, False, taken)
        return read, shadows.counters

    return asyncio.run(run())


def _resume(clients, broker, name: str) -> RawClient:
    back = clients(RawClient(name, port=broker.port, clean_start=False, session_expiry=600))
    assert back.connect() is True  # session present
    return back


def test_a_failed_hand_over_gives_the_session_back_every_message_it_read(
        broker, sidecar, clients):
    payloads = _session_with_queue(clients, broker, sidecar, "gb-all")
    read, counters = _drain_and_fail(broker, sidecar, "gb-all", taken=0)
    # (the shadow has a QoS 2 message at its PUBREL: the QoS 1 ones come first)
    assert [q.payload for q in read] == payloads[1::2] + payloads[0::2]

    back = _resume(clients, broker, "gb-all")
    wait_for(lambda: len(back.received(lambda m: m.topic == TOPIC)) >= 20, 5,
             "all 20 messages")
    time.sleep(0.3)  # nothing more comes
    got = [m.payload for m in back.received(lambda m: m.topic == TOPIC)]
    assert sorted(got) == payloads  # each once: the QoS 2 ones were lost before
    # QoS 1 ones come again first (Mosquitto resends them), the QoS 2 ones after, in order
    assert got == payloads[1::2] + payloads[0::2]
    assert not back.received(lambda m: m.topic == MARKER_TOPIC)
    assert counters == {"qos2_given_back": 10, "qos2_give_back_failed": 0}


def test_what_the_other_node_took_before_the_hand_over_failed_does_not_come_again(
        broker, sidecar, clients):
    payloads = _session_with_queue(clients, broker, sidecar, "gb-part")
    read, counters = _drain_and_fail(broker, sidecar, "gb-part", taken=12)
    in_order = payloads[1::2] + payloads[0::2]
    assert [q.payload for q in read] == in_order

    back = _resume(clients, broker, "gb-part")
    wait_for(lambda: len(back.received(lambda m: m.topic == TOPIC)) >= 8, 5,
             "the 8 messages not taken")
    time.sleep(0.3)
    got = [m.payload for m in back.received(lambda m: m.topic == TOPIC)]
    assert got == in_order[12:]
    assert counters["qos2_given_back"] == 8  # the other node took the 10 QoS 1 and m00, m02
