"""A persistent-session paho client that reconnects like a real device, for session tests."""

from __future__ import annotations

import threading
import time

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions


class Device:
    """One client id; `connect` to any port (auto-retrying, as paho does after a connection
    closed without CONNACK), `leave`, and every message it got, in arrival order.

    The same paho client object is reused for every connection, as a real device keeps its
    state: QoS 2 messages paho holds between PUBREC and PUBREL survive a reconnect."""

    def __init__(self, client_id: str, v5: bool = True, expiry: int = 600) -> None:
        self.client_id, self.v5, self.expiry = client_id, v5, expiry
        self.messages: list[mqtt.MQTTMessage] = []
        self.connects: list[bool] = []  # session present of each successful connect
        self.closed = threading.Event()
        self.attempts = 0
        self._up = threading.Event()
        self._lock = threading.Lock()
        self.client = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                                  client_id=client_id,
                                  protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
                                  clean_session=None if v5 else False)
        self.client.reconnect_delay_set(0.1, 0.5)
        self.publishes: list[tuple[int, int, bytes]] = []  # (connection, packet id, payload)
        self.deliveries: list[tuple[int, bytes]] = []  # (connection, payload) at on_message
        self._spy_publishes()
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_message = self._on_message

    def _spy_publishes(self) -> None:
        """Record the packet id of every QoS 2 PUBLISH paho stores until its PUBREL (paho
        hands the message to on_message only at the PUBREL)."""
        client, handle = self.client, self.client._handle_publish

        def spy():  # noqa: ANN202 - paho's private handler
            before = dict(client._in_messages)
            rc = handle()
            for mid, msg in list(client._in_messages.items()):
                if before.get(mid) is not msg:
                    self.publishes.append((len(self.connects), mid, msg.payload))
            return rc
        client._handle_publish = spy

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        self.attempts += 1
        if not reason_code.is_failure:
            self.connects.append(bool(flags.session_present))
            self._up.set()

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        self.attempts += 1
        self.closed.set()

    def _on_message(self, client, userdata, msg: mqtt.MQTTMessage) -> None:
        with self._lock:
            self.messages.append(msg)
            self.deliveries.append((len(self.connects), msg.payload))

    def connect(self, port: int, clean: bool = False, timeout: float = 10.0) -> bool:
        """Connect (retrying until a CONNACK); returns session present."""
        self._up.clear()
        self.closed.clear()
        kwargs: dict = {}
        if self.v5:
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = self.expiry
            kwargs = {"clean_start": clean, "properties": props}
        self.client.connect("127.0.0.1", port, 30, **kwargs)
        self.client.loop_start()
        assert self._up.wait(timeout), f"{self.client_id}: no CONNACK from port {port}"
        return self.connects[-1]

    def subscribe(self, topic: str, qos: int = 1) -> None:
        done = threading.Event()
        codes: list = []
        self.client.on_subscribe = lambda c, u, mid, rcs, p: (codes.extend(rcs), done.set())
        self.client.subscribe(topic, qos)
        assert done.wait(5), "no SUBACK"
        assert not any(getattr(rc, "is_failure", False) for rc in codes), codes

    def subscribe_v5(self, filt: str, options: SubscribeOptions, identifier: int) -> None:
        """One v5 subscription with its options and a Subscription Identifier."""
        props = Properties(PacketTypes.SUBSCRIBE)
        props.SubscriptionIdentifier = identifier
        done = threading.Event()
        self.client.on_subscribe = lambda *a: done.set()
        self.client.subscribe([(filt, options)], properties=props)
        assert done.wait(5), "no SUBACK"

    def leave(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def payloads(self, topic: str | None = None) -> list[int]:
        with self._lock:
            return [int(m.payload) for m in self.messages if topic is None or m.topic == topic]

    def wait_messages(self, count: int, timeout: float = 10.0) -> list[mqtt.MQTTMessage]:
        """The messages received so far, once there are `count` (or at the timeout)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(self.messages) < count:
            time.sleep(0.05)
        with self._lock:
            return list(self.messages)

    def wait_count(self, count: int, timeout: float = 10.0) -> list[int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(set(self.payloads())) < count:
            time.sleep(0.05)
        return self.payloads()


def publish(port: int, topic: str, count: int, qos: int = 1, start: int = 0) -> None:
    """`count` messages numbered from `start`, each acknowledged with success."""
    pub = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                      client_id=f"pub-{time.time_ns()}", protocol=mqtt.MQTTv5)
    failures: list = []
    pub.on_publish = lambda c, u, mid, rc, p: rc.is_failure and failures.append(rc)
    pub.connect("127.0.0.1", port)
    pub.loop_start()
    try:
        infos = [pub.publish(topic, str(i), qos=qos) for i in range(start, start + count)]
        for info in infos:
            info.wait_for_publish(10)
        assert all(i.is_published() for i in infos) and not failures, failures[:3]
    finally:
        pub.disconnect()
        pub.loop_stop()
