"""The forwarding client's paho driver (sidecar.local.paho_loop) against a real Mosquitto:
chunked reads serve every packet, also what sits in the read buffer after a read turn ends;
packets queued inside and outside paho callbacks are all written and their PUBACKs settle
them; with paho's decoder and with the lean one."""

from __future__ import annotations

import asyncio
import time

import paho.mqtt.client as mqtt
import pytest

from sidecar.local import paho_loop
from sidecar.local.paho_loop import BufferedReadClient, LeanClient, LoopDriver
from tests.system.plugin.helpers import Client

TOPIC = "loopdrv/t"


def _driven_client(client_id: str, lean: bool, on_message) -> BufferedReadClient:
    """A paho client for the driver; `on_message(client, topic, payload)` gets each message,
    from paho's decoder or (`lean`) from the lean one."""
    cls = LeanClient if lean else BufferedReadClient
    client = cls(callback_api_version=mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                 protocol=mqtt.MQTTv5)
    if lean:
        client.on_publish_packet = lambda p: on_message(client, p.topic, p.payload)
    else:
        client.on_message = lambda c, u, msg: on_message(client, msg.topic, msg.payload)
    return client


async def _connect(client: mqtt.Client, port: int) -> LoopDriver:
    connected = asyncio.Event()
    client.on_connect = lambda *a: connected.set()
    driver = LoopDriver(client, asyncio.get_running_loop())
    client.connect("127.0.0.1", port, keepalive=30)
    driver.start()
    await asyncio.wait_for(connected.wait(), 10)
    return driver


async def _wait(pred, timeout: float = 20.0) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout
    while not pred():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


@pytest.mark.parametrize("lean", [False, True], ids=["paho-decoder", "lean-decoder"])
def test_a_burst_larger_than_a_read_turn_arrives_whole_and_in_order(broker, clients,
                                                                    monkeypatch, lean):
    """The burst lands in the socket while the loop is busy, so the first 64 KiB read takes
    all of it; at 7 packets per read turn the rest waits in the buffer, where no readiness
    event announces it: every message must still arrive, in order."""
    monkeypatch.setattr(paho_loop, "READ_BATCH", 7)
    total = 1000
    publisher = clients(Client("loopdrv-pub", port=broker.port))
    publisher.connect()
    watcher = clients(Client("loopdrv-watch", port=broker.port))
    watcher.connect()
    watcher.subscribe(TOPIC, qos=0)

    async def main() -> list[int]:
        got: list[int] = []
        client = _driven_client("loopdrv-sub", lean, lambda c, t, p: got.append(int(p)))
        driver = await _connect(client, broker.port)
        subscribed = asyncio.Event()
        client.on_subscribe = lambda *a: subscribed.set()
        client.subscribe(TOPIC, qos=0)
        await asyncio.wait_for(subscribed.wait(), 10)
        for i in range(total):
            publisher.c.publish(TOPIC, str(i).encode(), qos=0)
        # the loop is blocked until Mosquitto has written the whole burst to both
        assert len(watcher.wait_messages(lambda m: m.topic == TOPIC, total, 10)) == total
        time.sleep(0.2)
        await _wait(lambda: len(got) >= total, timeout=5)
        driver.stop()
        return got

    got = asyncio.run(main())
    assert got == list(range(total))


@pytest.mark.parametrize("lean", [False, True], ids=["paho-decoder", "lean-decoder"])
def test_packets_queued_in_and_outside_callbacks_are_all_written(broker, clients, lean):
    """Publishes from the loop (written at once) and from inside on_message (paho's callback
    lock is held: written after the read turn) all reach Mosquitto and are acknowledged."""
    watcher = clients(Client("loopdrv-watch", port=broker.port))
    watcher.connect()
    watcher.subscribe("loopdrv/out/#", qos=1)
    trigger = clients(Client("loopdrv-trigger", port=broker.port))
    trigger.connect()
    n = 500

    async def main() -> tuple[set[int], set[int]]:
        acked: set[int] = set()
        client = _driven_client("loopdrv-pubber", lean, lambda c, t, p: c.publish(
            "loopdrv/out/echo/" + p.decode(), p, qos=1))
        client.on_publish = lambda c, u, mid, rc, props: acked.add(mid)
        driver = await _connect(client, broker.port)
        subscribed = asyncio.Event()
        client.on_subscribe = lambda *a: subscribed.set()
        client.subscribe("loopdrv/in", qos=1)
        await asyncio.wait_for(subscribed.wait(), 10)
        mids = {client.publish(f"loopdrv/out/direct/{i}", b"x", qos=1).mid for i in range(n)}
        for i in range(n):
            trigger.c.publish("loopdrv/in", str(i).encode(), qos=1)
        await _wait(lambda: len(acked) >= 2 * n)
        driver.stop()
        return acked, mids

    acked, mids = asyncio.run(main())
    assert mids <= acked and len(acked) == 2 * n
    echoes = watcher.wait_messages(lambda m: m.topic.startswith("loopdrv/out/"), count=2 * n,
                                   timeout=20)
    topics = [m.topic for m in echoes]
    assert sorted(t for t in topics if "/echo/" in t) == sorted(
        f"loopdrv/out/echo/{i}" for i in range(n))
    assert len([t for t in topics if "/direct/" in t]) == n
