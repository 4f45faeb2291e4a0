"""MQTT clients for the attacks: over TLS with a client certificate, and one that records the
reason code of every acknowledgement (PUBACK/PUBREC) it gets."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.system.plugin.helpers import Client


class AckClient(Client):
    """A client that records the reason code of each acknowledged publish (by mid)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.published: dict[int, int] = {}
        self.c.on_publish = self._on_publish

    def _on_publish(self, client, userdata, mid, reason_code, properties=None):
        with self.cond:
            self.published[mid] = getattr(reason_code, "value", reason_code)
            self.cond.notify_all()

    def send(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False,
             expiry: int | None = None, user: list[tuple[str, str]] | None = None) -> int:
        """Publish without waiting; returns the mid."""
        props = None
        if self.protocol == 5 and (expiry is not None or user):
            props = Properties(PacketTypes.PUBLISH)
            if expiry is not None:
                props.MessageExpiryInterval = expiry
            if user:
                props.UserProperty = user
        return self.c.publish(topic, payload, qos=qos, retain=retain, properties=props).mid

    def ack_of(self, mid: int, timeout: float = 5.0) -> int | None:
        """The reason code the broker acknowledged `mid` with (0: success), or None when the
        connection ended (or `timeout` passed) without an acknowledgement."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while mid not in self.published and not self.disconnected:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(left)
            return self.published.get(mid)


class TlsClient(AckClient):
    """A client presenting the certificate `name` of `certs` (tests.system.security.certs)."""

    def __init__(self, client_id: str, port: int, certs: Path, name: str, **kw: Any) -> None:
        super().__init__(client_id, port=port, **kw)
        self.c.tls_set(ca_certs=str(certs / "ca.pem"), certfile=str(certs / f"{name}.pem"),
                       keyfile=str(certs / f"{name}.key"))
