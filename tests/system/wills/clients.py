"""MQTT clients for the will tests: a client that sets a will and never reconnects by itself,
and a subscriber that records when each message arrived."""

from __future__ import annotations

import threading
import time

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties


class Subscriber:
    """Subscribes `filt` on one port and keeps (arrival monotonic time, message)."""

    def __init__(self, port: int, client_id: str, filt: str, qos: int = 1) -> None:
        self.got: list[tuple[float, mqtt.MQTTMessage]] = []
        self._lock = threading.Lock()
        self._subscribed = threading.Event()
        self.client = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                                  client_id=client_id, protocol=mqtt.MQTTv5)
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda *a: self._subscribed.set()
        self.client.on_connect = lambda c, u, f, rc, p: c.subscribe(filt, qos)
        self.client.connect("127.0.0.1", port, 30)
        self.client.loop_start()
        assert self._subscribed.wait(10), f"{client_id}: no SUBACK"

    def _on_message(self, client, userdata, msg: mqtt.MQTTMessage) -> None:
        with self._lock:
            self.got.append((time.monotonic(), msg))

    def messages(self, topic: str | None = None) -> list[tuple[float, mqtt.MQTTMessage]]:
        with self._lock:
            return [(t, m) for t, m in self.got if topic is None or m.topic == topic]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class WillClient:
    """A v5 client with a will (delay, retain, properties) that does not reconnect on its own."""

    def __init__(self, port: int, client_id: str, topic: str, payload: bytes, *, qos: int = 1,
                 retain: bool = False, delay: int = 0, expiry: int = 0) -> None:
        self.client_id = client_id
        self.client = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                                  client_id=client_id, protocol=mqtt.MQTTv5,
                                  reconnect_on_failure=False)
        props = Properties(PacketTypes.WILLMESSAGE)
        props.WillDelayInterval = delay
        props.UserProperty = [("from", client_id)]
        self.client.will_set(topic, payload, qos=qos, retain=retain, properties=props)
        self.expiry = expiry
        self.up = threading.Event()
        self.down = threading.Event()
        self.client.on_connect = lambda c, u, f, rc, p: (not rc.is_failure) and self.up.set()
        self.client.on_disconnect = lambda *a: self.down.set()
        self.connect(port)

    def connect(self, port: int, timeout: float = 10.0) -> None:
        """Connect (clean start false: the session, if any, is resumed), retrying while the
        node closes the connection without a CONNACK (a session being made there)."""
        self.up.clear()
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = self.expiry
        deadline = time.monotonic() + timeout
        while True:
            self.down.clear()
            self.client.connect("127.0.0.1", port, 30, clean_start=False, properties=props)
            self.client.loop_start()
            while not self.up.is_set() and not self.down.is_set():
                time.sleep(0.02)
            if self.up.is_set():
                return
            self.client.loop_stop()
            assert time.monotonic() < deadline, f"{self.client_id}: no CONNACK on {port}"
            time.sleep(0.1)

    def close(self) -> None:
        self.client.disconnect()  # a normal DISCONNECT: the will is cleared
        self.client.loop_stop()
