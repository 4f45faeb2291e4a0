"""The measuring subscriber and the figures of one case (throughput, latency, loss, dups).

The subscriber only timestamps and keeps each message's header in paho's callback; decoding
and statistics happen afterwards (`summarize`, pure). Latency = receive time - publish time
from the payload (both wall clock on this machine), first copy of each message only.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from sidecar.bench import payload

PROBE = "probe"  # last topic level of the warm-up messages, not counted


class Subscriber:
    """A paho MQTT v5 client subscribed to `topic_filter` that records what arrives."""

    def __init__(self, port: int, topic_filter: str, qos: int, client_id: str,
                 host: str = "127.0.0.1", trace: bool = False,
                 session_expiry: int = 0) -> None:
        self.host, self.port, self.filter, self.qos = host, port, topic_filter, qos
        # (header, receive ns, DUP flag), plus (topic, QoS) when traced
        self.records: list[tuple] = []
        self.probe_seen = threading.Event()
        self.granted_qos: int | None = None
        self.session_expiry = session_expiry
        self._subscribed = threading.Event()
        self.ready = threading.Event()  # connected, and subscribed since that connect
        self.client = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                                  client_id=client_id, protocol=mqtt.MQTTv5)
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = self._on_subscribe
        self.client.on_disconnect = self._on_disconnect
        self.client.reconnect_delay_set(min_delay=0.1, max_delay=2)  # a restarted node: soon
        # chosen once: tracing costs nothing per message when it is off
        self.client.on_message = self._on_message_traced if trace else self._on_message

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        if not reason_code.is_failure:
            client.subscribe(self.filter, qos=self.qos)

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties) -> None:
        if reason_codes and not reason_codes[0].is_failure:
            self.granted_qos = reason_codes[0].value
            self.ready.set()
        self._subscribed.set()

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        self.ready.clear()

    def _on_message_traced(self, client, userdata, msg: mqtt.MQTTMessage) -> None:
        now = time.time_ns()
        topic = msg.topic
        if topic.endswith("/" + PROBE):
            self.probe_seen.set()
            return
        self.records.append((msg.payload[:payload.HEADER_SIZE], now, bool(msg.dup), topic,
                             msg.qos))

    def _on_message(self, client, userdata, msg: mqtt.MQTTMessage) -> None:
        now = time.time_ns()
        if msg.topic.endswith("/" + PROBE):
            self.probe_seen.set()
            return
        self.records.append((msg.payload[:payload.HEADER_SIZE], now, bool(msg.dup)))

    def start(self, timeout: float = 10.0) -> None:
        """Connect and subscribe; raise if the SUBACK does not come within `timeout`."""
        props = None
        if self.session_expiry:
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = self.session_expiry
        self.client.connect(self.host, self.port, keepalive=30, properties=props)
        self.client.loop_start()
        if not self._subscribed.wait(timeout):
            raise RuntimeError(f"no SUBACK from {self.host}:{self.port} for {self.filter}")

    def pause(self) -> None:
        """Drop the connection (the session stays if `session_expiry` > 0)."""
        self.client.disconnect()
        self.client.loop_stop()

    def resume(self, timeout: float = 10.0) -> None:
        """Reconnect (clean start false) and wait for the (re)subscription's SUBACK."""
        self._subscribed.clear()
        self.client.reconnect()
        self.client.loop_start()
        if not self._subscribed.wait(timeout):
            raise RuntimeError(f"no SUBACK from {self.host}:{self.port} after resuming")

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@dataclass(frozen=True)
class CaseStats:
    """The figures of one case."""

    sent: int
    received: int  # every copy, duplicates included
    unique: int
    lost: int
    duplicates: int
    out_of_order: int  # first copies arriving after a later seq of the same publisher
    seconds: float  # first publish to last receive
    throughput: float  # unique messages per second over `seconds`
    publish_rate: float  # messages per second the publishers achieved
    p50_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float


def percentile(ordered: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of an ascending sequence (0.0 when it is empty)."""
    if not ordered:
        return 0.0
    return ordered[max(0, math.ceil(pct / 100 * len(ordered)) - 1)]


def summarize(records: Sequence[tuple], sent: Mapping[int, int],
              first_pub_ns: int, last_pub_ns: int) -> CaseStats:
    """Figures from the subscriber's records and the publishers' sent counts (by index)."""
    seen: set[tuple[int, int]] = set()
    highest: dict[int, int] = {}
    latencies: list[float] = []
    out_of_order = 0
    last_recv = first_pub_ns
    for header, recv_ns, *_ in records:
        stamp = payload.decode(header)
        if stamp is None:
            continue
        key = (stamp.publisher, stamp.seq)
        if key in seen:
            continue
        seen.add(key)
        if stamp.seq < highest.get(stamp.publisher, -1):
            out_of_order += 1
        highest[stamp.publisher] = max(stamp.seq, highest.get(stamp.publisher, -1))
        latencies.append((recv_ns - stamp.published_ns) / 1e6)
        last_recv = max(last_recv, recv_ns)
    latencies.sort()
    total = sum(sent.values())
    expected = sum(1 for pub, seq in seen if seq < sent.get(pub, 0))
    seconds = max(last_recv - first_pub_ns, 1) / 1e9
    pub_seconds = max(last_pub_ns - first_pub_ns, 1) / 1e9
    return CaseStats(
        sent=total, received=len(records), unique=len(seen), lost=total - expected,
        duplicates=len(records) - len(seen), out_of_order=out_of_order,
        seconds=round(seconds, 3), throughput=round(len(seen) / seconds, 1),
        publish_rate=round(total / pub_seconds, 1) if total > 1 else 0.0,
        p50_ms=round(percentile(latencies, 50), 3), p99_ms=round(percentile(latencies, 99), 3),
        max_ms=round(latencies[-1], 3) if latencies else 0.0,
        mean_ms=round(sum(latencies) / len(latencies), 3) if latencies else 0.0,
    )


def wait_complete(sub: Subscriber, expected: int, idle: float = 5.0,
                  limit: float = 120.0) -> float:
    """Wait until `expected` distinct messages arrived, nothing arrived for `idle` s while the
    subscriber was connected and subscribed (a subscriber still reconnecting, e.g. after a
    drain, has its messages waiting in its session), or `limit` s passed; returns when
    (time.monotonic) the last message arrived."""
    start = last_change = quiet_since = time.monotonic()
    count = -1
    while time.monotonic() - start < limit:
        now_count = len(sub.records)
        if now_count != count:
            count, last_change = now_count, time.monotonic()
            quiet_since = last_change
            if count >= expected and len({r[0] for r in sub.records}) >= expected:
                break
        elif not sub.ready.is_set():
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since > idle:
            break
        time.sleep(0.05)
    return last_change
