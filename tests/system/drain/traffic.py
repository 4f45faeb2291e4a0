"""Traced traffic for the drain tests: persistent-session subscribers through the front and a
QoS 1 publisher, writing trace records (docs/traces.md) for `mqfed audit`."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from sidecar.bench import payload
from sidecar.bench.traces import TraceWriter, pub_line, recv_line, sub_line
from tests.harness.procs import wait_for
from tests.system.cluster.conftest import mqfed
from tests.system.sessions.clients import Device

SIZE = 32


class TracedDevice(Device):
    """A `Device` that keeps the wall time and DUP flag of every copy it gets."""

    def __init__(self, client_id: str, expiry: int = 600) -> None:
        super().__init__(client_id, expiry=expiry)
        self.copies: list[tuple[int, mqtt.MQTTMessage]] = []

    def _on_message(self, client, userdata, msg: mqtt.MQTTMessage) -> None:
        with self._lock:
            self.messages.append(msg)
            self.copies.append((time.time_ns(), msg))

    def write_copies(self, writer: TraceWriter, run: str) -> int:
        """One `recv` record per stamped copy, numbered in arrival order; returns how many."""
        i = 0
        with self._lock:
            copies = list(self.copies)
        for t, msg in copies:
            stamp = payload.decode(msg.payload)
            if stamp is None or len(msg.payload) != SIZE:
                continue  # the warm-up probe
            writer.write(recv_line(run, self.client_id, "front", stamp.publisher, stamp.seq,
                                   msg.topic, msg.qos, bool(msg.dup), t, i))
            i += 1
        return i

    def seqs(self) -> set[int]:
        with self._lock:
            return {payload.decode(m.payload).seq for _, m in self.copies
                    if len(m.payload) == SIZE}


class TracedPublisher:
    """One QoS 1 publisher with a persistent session through `port`, publishing stamped
    payloads round robin over `topics` at `rate` until stopped; a `pub` record per publish."""

    def __init__(self, port: int, topics: list[str], rate: float, writer: TraceWriter,
                 run: str) -> None:
        self.topics, self.rate, self.writer, self.run = topics, rate, writer, run
        self.sent: dict[int, str] = {}  # seq -> topic
        self.acked: set[int] = set()
        self._mids: dict[int, int] = {}
        self._early: set[int] = set()  # PUBACKs that came before publish() returned
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._publish, daemon=True)
        self.client = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                                  client_id=f"roll-pub-{run}", protocol=mqtt.MQTTv5)
        self.client.reconnect_delay_set(0.1, 0.5)
        self.client.max_inflight_messages_set(20)
        self.client.on_publish = self._on_publish
        self.connected = threading.Event()
        self.connects = 0
        self.client.on_connect = self._on_connect
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 600
        self.client.connect("127.0.0.1", port, 30, clean_start=mqtt.MQTT_CLEAN_START_FIRST_ONLY,
                            properties=props)
        self.client.loop_start()
        assert self.connected.wait(10), "the publisher got no CONNACK"

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        if not reason_code.is_failure:
            self.connects += 1
            self.connected.set()

    @property
    def reconnects(self) -> int:
        return max(0, self.connects - 1)

    def _on_publish(self, client, userdata, mid, reason_code, properties) -> None:
        if reason_code.is_failure:
            return
        with self._lock:
            seq = self._mids.pop(mid, None)
            if seq is None:
                self._early.add(mid)
            else:
                self.acked.add(seq)

    def start(self) -> None:
        self._thread.start()

    def _publish(self) -> None:
        seq = 0
        start = time.monotonic()
        while not self._stop.is_set():
            delay = start + seq / self.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            topic = self.topics[seq % len(self.topics)]
            t = time.time_ns()
            # not under the lock: paho calls on_publish holding its own
            info = self.client.publish(topic, payload.encode(0, seq, t, SIZE), qos=1)
            with self._lock:
                if info.mid in self._early:
                    self._early.discard(info.mid)
                    self.acked.add(seq)
                else:
                    self._mids[info.mid] = seq
            self.writer.write(pub_line(self.run, 0, seq, topic, 1, "front", t, SIZE))
            self.sent[seq] = topic
            seq += 1

    def stop(self, timeout: float = 30.0) -> None:
        """Stop publishing and wait until every publish was acknowledged."""
        self._stop.set()
        self._thread.join()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(self.acked) < len(self.sent):
            time.sleep(0.05)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def write_subscriptions(writer: TraceWriter, kind: str, run: str,
                        devices: list[TracedDevice], topics: list[str]) -> None:
    now = time.time_ns()
    for dev, topic in zip(devices, topics, strict=True):
        writer.write(sub_line(kind, run, dev.client_id, "front", topic, 1, now))


def new_writer(directory: Path, name: str) -> TraceWriter:
    return TraceWriter(directory, name)


@dataclass
class Outcome:
    """What a restart under traffic did to the subscribers (the audit's summary included)."""

    published: int
    copies: int
    reconnects: list[list[bool]]  # per subscriber: session present of each reconnect
    summary: dict[str, Any]

    @property
    def duplicates(self) -> int:
        return sum(r["duplicates"] for r in self.summary["subscribers"])

    def line(self) -> str:
        return (f"{self.published} published, {self.copies} copies received, "
                f"{self.summary['lost']} lost, {self.duplicates} duplicates, "
                f"{len(self.summary['violations'])} ordering violations (the handover "
                f"window); {sum(map(len, self.reconnects))} reconnects, "
                f"{sum(1 for r in self.reconnects for p in r if not p)} without session "
                "present")


def audit(traces: Path) -> dict[str, Any]:
    """`mqfed audit --json` over the trace records (0 passed, 1 loss or reordering)."""
    pytest.importorskip("pyspark", reason="the pipeline extra is not installed (make install)")
    result = mqfed("audit", "--traces", str(traces), "--json", timeout=600)
    assert result.returncode in (0, 1), result.stderr[-3000:]
    return json.loads(result.stdout)


def under_traffic(front: int, restart: Callable[[], None], traces: Path,
                  subscribers: int = 100, rate: float = 150.0) -> Outcome:
    """`subscribers` persistent-session subscribers (a topic each) and a QoS 1 publisher
    (`rate` messages per second round robin over the topics), all through `front`, traced;
    `restart()` runs while they go on; then every message is waited for and audited."""
    run = uuid.uuid4().hex[:6]
    topics = [f"roll/{run}/{i}" for i in range(subscribers)]
    recv = new_writer(traces, f"recv-{run}")
    pubw = new_writer(traces, f"pub-{run}-0")
    devices = [TracedDevice(f"roll-{run}-{i}") for i in range(subscribers)]
    publisher = None
    try:
        for dev, topic in zip(devices, topics, strict=True):
            assert dev.connect(front) is False  # a new session
            dev.subscribe(topic, 1)
        publisher = TracedPublisher(front, topics, rate, pubw, run)
        pub = publisher

        def warm() -> bool:  # routed everywhere: a warm-up message reaches every subscriber
            cold = [t for d, t in zip(devices, topics, strict=True)
                    if not any(m.payload == b"warm-up" for m in d.messages)]
            for topic in cold:
                pub.client.publish(topic, b"warm-up", qos=1)
            return not cold
        wait_for(warm, 30, "every subscriber's warm-up message", interval=0.5)
        write_subscriptions(recv, "sub", run, devices, topics)
        publisher.start()
        time.sleep(2)
        restart()
        time.sleep(2)
        publisher.stop()
        assert len(publisher.acked) == len(publisher.sent), "publishes never acknowledged"
        expected = {t: {s for s, topic in publisher.sent.items() if topic == t} for t in topics}
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not all(
                d.seqs() >= expected[t] for d, t in zip(devices, topics, strict=True)):
            time.sleep(0.1)  # what is still missing then, the audit names
        write_subscriptions(recv, "unsub", run, devices, topics)
        copies = sum(dev.write_copies(recv, run) for dev in devices)
    finally:
        recv.close()
        pubw.close()
        if publisher is not None:
            publisher.close()
        for dev in devices:
            dev.leave()
    summary = audit(traces)
    assert summary["records"]["pub"] == len(publisher.sent)
    return Outcome(len(publisher.sent), copies, [d.connects[1:] for d in devices], summary)
