"""Small synchronous paho helpers for tests."""

from __future__ import annotations

import threading
import time

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties


class Client:
    """A connected paho client (MQTT v5 by default) that records what it receives."""

    def __init__(self, port: int, client_id: str, *, v5: bool = True, clean: bool = True,
                 session_expiry: int = 0, username: str | None = None,
                 password: str | None = None, host: str = "127.0.0.1",
                 receive_maximum: int = 0) -> None:
        self.messages: list[mqtt.MQTTMessage] = []
        self.connected = threading.Event()
        self.reason: object = None
        self.session_present: bool | None = None
        self.client = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                                  client_id=client_id,
                                  protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
                                  clean_session=None if v5 else clean)
        if username is not None:
            self.client.username_pw_set(username, password)
        self.client.on_connect = self._on_connect
        self.client.on_message = lambda c, u, m: self.messages.append(m)
        kwargs: dict = {}
        if v5:
            props = Properties(PacketTypes.CONNECT)
            if session_expiry:
                props.SessionExpiryInterval = session_expiry
            if receive_maximum:  # else Mosquitto sends at most max_inflight_messages (20)
                props.ReceiveMaximum = receive_maximum
            kwargs = {"clean_start": clean, "properties": props}
        self.client.connect(host, port, keepalive=30, **kwargs)
        self.client.loop_start()

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        self.reason = reason_code
        self.session_present = flags.session_present
        self.connected.set()

    def wait_connected(self, timeout: float = 5.0) -> bool:
        """True if CONNACK said success."""
        if not self.connected.wait(timeout):
            return False
        return not self.reason.is_failure

    def subscribe(self, topic: str, qos: int = 1) -> None:
        done = threading.Event()
        self.client.on_subscribe = lambda *a: done.set()
        self.client.subscribe(topic, qos)
        assert done.wait(5), f"no SUBACK for {topic}"

    def unsubscribe(self, topic: str) -> None:
        done = threading.Event()
        self.client.on_unsubscribe = lambda *a: done.set()
        self.client.unsubscribe(topic)
        assert done.wait(5), f"no UNSUBACK for {topic}"

    def subscribe_many(self, topics: list[tuple[str, int]]) -> None:
        """One SUBSCRIBE packet per filter (each gets its own identifier on v5)."""
        for topic, qos in topics:
            self.subscribe(topic, qos)

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False,
                properties: Properties | None = None, wait: bool = True) -> None:
        info = self.client.publish(topic, payload, qos=qos, retain=retain, properties=properties)
        if wait and qos:
            info.wait_for_publish(10)

    def wait_count(self, count: int, timeout: float = 10.0, topic: str | None = None) -> list:
        """Wait until `count` messages (on `topic`, if given) arrived; return them all."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = [m for m in self.messages if topic is None or m.topic == topic]
            if len(got) >= count:
                return got
            time.sleep(0.02)
        return [m for m in self.messages if topic is None or m.topic == topic]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()
