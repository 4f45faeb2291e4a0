"""The forwarding client's re-injections against a real Mosquitto (issue 14): it keeps
within the Receive Maximum Mosquitto announces, and a publish Mosquitto refuses is never
confirmed; it is retried in order and confirmed once the refusal ends.

A plain Mosquitto (no plugin) stands in for the node's: its own ACL can refuse the
forwarding identity, which the mqfed plugin never does (it grants the sidecar everything)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode

from sidecar.local.forward_client import ForwardClient
from sidecar.local.protocol import SIDECAR_USERNAME
from sidecar.message import MessageProperties
from tests.system.plugin.helpers import SECRET, Broker, Client, give_to_mosquitto

PROPS = MessageProperties()


def _forward_client(broker: Broker, confirmed: list[int]) -> ForwardClient:
    return ForwardClient(broker.dir / "mosquitto.sock", SECRET, "fwd-test",
                         on_copies=lambda copies: None, on_published=confirmed.extend,
                         on_connected=lambda present: None)


def _subscriber(broker: Broker, qos: int = 2) -> Client:
    sub = Client("watcher", port=broker.port)
    sub.connect()
    sub.subscribe("#", qos=qos)
    return sub


async def _until(pred, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def _payloads(sub: Client, topic: str) -> list[int]:
    return [int(m.payload) for m in list(sub.messages) if m.topic == topic]


def test_burst_stays_within_a_tiny_receive_maximum_and_nothing_is_lost(procs):
    """Mosquitto announces Receive Maximum 2 (max_inflight_messages 2): 600 QoS 1 and 2
    re-injections sent at once all arrive, in order, none refused, each confirmed once."""
    broker = Broker(procs, plugin=False, extra="max_inflight_messages 2").start()
    sub = _subscriber(broker, qos=1)  # (to a QoS 2 subscriber with a full window, Mosquitto
    # 2.0.11 itself delivers out of order: tests/routing/test_qos_delivery.py)
    confirmed: list[int] = []

    async def run() -> ForwardClient:
        fwd = _forward_client(broker, confirmed)
        await fwd.connect()
        assert fwd.window.receive_maximum == 2
        tickets = [fwd.publish(f"burst/q{1 + i % 2}", str(i // 2).encode(), 1 + i % 2, PROPS)
                   for i in range(600)]
        assert fwd.window.status()["in_flight"] <= 2
        assert await _until(lambda: len(confirmed) >= 600, 30), fwd.stats()
        fwd.close()
        assert sorted(confirmed) == sorted(tickets)
        return fwd

    try:
        fwd = asyncio.run(run())
        deadline = time.monotonic() + 10
        while len(sub.messages) < 600 and time.monotonic() < deadline:
            time.sleep(0.05)
        for qos in (1, 2):
            assert _payloads(sub, f"burst/q{qos}") == list(range(300)), qos
        assert fwd.window.counters["refused"] == 0
    finally:
        sub.disconnect()
        broker.cleanup()


def test_refused_reinjection_is_held_retried_in_order_and_arrives_once_allowed(procs):
    """The ACL denies the forwarding identity `closed/#`: those publishes (QoS 1 and 2) are
    refused (0x87), not confirmed, while `open/#` flows. Once the ACL allows them (SIGHUP),
    they arrive in order, exactly once, and are confirmed."""
    broker = Broker(procs, plugin=False)
    passwords = broker.dir / "passwords"
    acl = broker.dir / "acl"
    subprocess.run(["mosquitto_passwd", "-b", "-c", str(passwords), SIDECAR_USERNAME, SECRET],
                   check=True, capture_output=True)
    give_to_mosquitto(passwords, 0o644)
    rules = f"topic read #\nuser {SIDECAR_USERNAME}\ntopic readwrite open/#\n"
    acl.write_text(rules)
    give_to_mosquitto(acl, 0o644)
    broker.extra = f"password_file {passwords}\nacl_file {acl}"
    broker.start()
    sub = _subscriber(broker)
    confirmed: list[int] = []

    async def run() -> ForwardClient:
        fwd = _forward_client(broker, confirmed)
        await fwd.connect()
        closed = [fwd.publish(f"closed/q{qos}", str(i).encode(), qos, PROPS)
                  for i in range(5) for qos in (1, 2)]
        opened = [fwd.publish("open/x", str(i).encode(), 1, PROPS) for i in range(5)]
        assert await _until(lambda: set(opened) <= set(confirmed), 10), fwd.stats()
        await asyncio.sleep(1.5)  # several retries, all refused
        assert not set(closed) & set(confirmed), "a refused publish was confirmed"
        assert fwd.refused_by_reason().get("not_authorized", 0) >= 2
        assert fwd.window.held_count >= 8, fwd.window.status()
        acl.write_text(rules + "topic readwrite closed/#\n")
        broker.proc.send_signal(signal.SIGHUP)  # Mosquitto reloads its ACL file
        assert await _until(lambda: set(closed) <= set(confirmed), 15), fwd.window.status()
        assert fwd.window.held_count == 0
        fwd.close()
        return fwd

    try:
        asyncio.run(run())
        assert len(confirmed) == len(set(confirmed)) == 15
        deadline = time.monotonic() + 5
        while len(sub.messages) < 15 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        for qos in (1, 2):
            assert _payloads(sub, f"closed/q{qos}") == list(range(5)), qos
        assert _payloads(sub, "open/x") == list(range(5))
    finally:
        sub.disconnect()
        broker.cleanup()



def test_refused_forwarding_subscription_is_counted_and_asked_again(procs):
    """Mosquitto 2.0.11 cannot refuse the forwarding identity a subscription (the mqfed plugin
    grants the sidecar everything, and its acl_file never checks subscribes), so the refusal
    is fed to the client's SUBACK hook as the lean client reads it: it is counted and the
    subscription asked again, which the real Mosquitto then accepts (copies on it arrive)."""
    broker = Broker(procs, plugin=False).start()
    pub = Client("pub", port=broker.port)
    pub.connect()
    copies: list = []

    async def run() -> None:
        fwd = ForwardClient(broker.dir / "mosquitto.sock", SECRET, "fwd-sub",
                            on_copies=copies.extend, on_published=lambda t: None,
                            on_connected=lambda present: None)
        await fwd.connect()
        client = fwd._client  # noqa: SLF001 - the paho client whose SUBACKs are altered
        real_on_codes = client.on_suback_codes  # (SUBACKs as the lean client reads them)
        subacks: list[int] = []
        refuse = [True]

        def on_codes(mid: int, codes: bytes) -> None:
            subacks.append(mid)
            if refuse[0]:  # as if Mosquitto had refused it
                client.unsubscribe("secret/#")
                codes = bytes([ReasonCode(PacketTypes.SUBACK, "Not authorized").value])
            real_on_codes(mid, codes)

        client.on_suback_codes = on_codes
        fwd.subscribe("secret/#", 7, no_local=True)
        assert await _until(lambda: len(subacks) == 1, 3)
        assert fwd.subscribe_refused == 1 and fwd.stats()["subscribe_refused"] == 1
        refuse[0] = False
        assert await _until(lambda: len(subacks) == 2, 3), "not asked again"
        assert fwd.subscribe_refused == 1
        await asyncio.to_thread(pub.publish, "secret/a", b"x", 1)
        assert await _until(lambda: any(c.topic == "secret/a" for c in copies), 5)
        refuse[0] = True  # refused again, but no longer wanted: not asked again
        fwd.subscribe("other/#", 8, no_local=True)
        fwd.unsubscribe("other/#")
        assert await _until(lambda: len(subacks) == 3, 3)
        await asyncio.sleep(1.0)
        assert len(subacks) == 3, "a filter no longer wanted was asked again"
        fwd.close()

    try:
        asyncio.run(run())
    finally:
        pub.disconnect()
        broker.cleanup()
