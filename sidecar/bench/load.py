"""The load generator: paho publishers at a steady rate or flat out, each in its own process.

Every message carries (publisher, seq, publish time) in its payload (`payload.py`). At most
`window` publishes are outstanding per publisher (QoS 1: not yet PUBACKed; QoS 0: not yet
written to the socket), which keeps paho under its 65,535 pending-publish limit and memory
bounded. MQTT v5 clients; at QoS >= 1 the window never exceeds the broker's Receive Maximum.
"""

from __future__ import annotations

import gc
import multiprocessing
import threading
import time
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from sidecar.bench import payload
from sidecar.bench.traces import TraceWriter, pub_line

ACK_TIMEOUT = 30.0  # seconds without any ack before a publisher gives up
CONNECT_TIMEOUT = 10.0
MOSQUITTO_INFLIGHT = 20
"""Mosquitto's default `max_inflight_messages`, the window for an MQTT 3.1.1 publisher (which
is not told one): beyond it Mosquitto 2.0.11 answers a QoS 2 PUBLISH with a plain PUBREC and
drops it (measured: 3,305 of 5,000 lost with a window of 100, on one node, no cluster)."""
SESSION_EXPIRY = 300
"""Seconds the publisher's session outlives a disconnect: an overloaded node sheds publishers
(disconnects them), and a QoS 2 message the broker had answered with PUBREC but not yet
released survives that only in a session (paho completes it with its PUBREL after
reconnecting; without a session the broker has forgotten it)."""


@dataclass(frozen=True)
class LoadSpec:
    """What one publisher does."""

    port: int
    topic: str
    qos: int
    size: int
    rate: float  # messages per second for this publisher; 0 = flat out
    messages: int | None  # stop after this many, or
    seconds: float | None  # after this long
    window: int = 100
    client_id: str = "bench-pub"
    host: str = "127.0.0.1"
    traces: str | None = None  # write `pub` trace records into this folder
    run: str = "bench"  # the run id of those records
    node: str = ""  # the node this publisher is connected to (its records' origin)
    protocol: str = "5"  # the publisher's MQTT version: "5" or "3.1.1"


@dataclass
class PublishResult:
    """What one publisher did."""

    index: int
    sent: int = 0
    acked: int = 0
    failed: int = 0  # PUBACKs with a failure reason code
    disconnects: int = 0  # by the broker (overload shedding); paho reconnects and resends
    first_ns: int = 0
    last_ns: int = 0
    cpu_seconds: float = 0.0
    error: str | None = None


class Publisher:
    """One paho client publishing stamped payloads on `spec.topic`."""

    def __init__(self, spec: LoadSpec, index: int) -> None:
        self.spec = spec
        self.index = index
        self.result = PublishResult(index)
        self._window = threading.Semaphore(spec.window)
        self._connected = threading.Event()
        self._receive_max = 0
        v5 = spec.protocol == "5"
        self.client = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                                  client_id=spec.client_id,
                                  protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
                                  clean_session=None if v5 else False)
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_publish = self._on_publish
        self.client.reconnect_delay_set(min_delay=0.05, max_delay=1)

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        if not reason_code.is_failure:
            self._receive_max = getattr(properties, "ReceiveMaximum", 0) or 0
            self._connected.set()

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        if reason_code != 0:  # not our own DISCONNECT: an overloaded node sheds publishers
            self.result.disconnects += 1

    def _on_publish(self, client, userdata, mid, reason_code, properties) -> None:
        self.result.acked += 1
        if reason_code.is_failure:
            self.result.failed += 1
        self._window.release()

    def connect(self) -> None:
        self.client.max_inflight_messages_set(self.spec.window)
        if self.spec.protocol == "5":
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = SESSION_EXPIRY  # fresh, resumed on reconnect
            self.client.connect(self.spec.host, self.spec.port, keepalive=30,
                                clean_start=mqtt.MQTT_CLEAN_START_FIRST_ONLY, properties=props)
        else:  # 3.1.1: a persistent session (clean session 0), for the same reason
            self.client.connect(self.spec.host, self.spec.port, keepalive=30)
        self.client.loop_start()
        if not self._connected.wait(CONNECT_TIMEOUT):
            raise RuntimeError(f"no CONNACK from {self.spec.host}:{self.spec.port}")
        limit = self._receive_max if self.spec.protocol == "5" else MOSQUITTO_INFLIGHT
        if self.spec.qos and 0 < limit < self.spec.window:
            for _ in range(self.spec.window - limit):  # the broker's limit
                self._window.acquire()

    def run(self) -> PublishResult:
        """Publish until `messages` or `seconds` is reached, then wait for the acks."""
        gc.disable()  # a full collection here paused publishing 10-25 ms: noise, not the hop
        try:
            return self._run()
        finally:
            gc.enable()

    def _run(self) -> PublishResult:
        spec, res = self.spec, self.result
        interval = 1.0 / spec.rate if spec.rate > 0 else 0.0
        cpu0 = time.process_time()
        start = time.monotonic()
        deadline = start + spec.seconds if spec.seconds else None
        seq = 0
        trace = (TraceWriter(spec.traces, f"pub-{spec.run}-{self.index}") if spec.traces
                 else None)
        while spec.messages is None or seq < spec.messages:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                break
            if interval:
                delay = start + seq * interval - now
                if delay > 0:
                    time.sleep(delay)
            if not self._window.acquire(timeout=ACK_TIMEOUT):
                res.error = f"no ack for {ACK_TIMEOUT:.0f}s with {spec.window} outstanding"
                break
            t = time.time_ns()
            info = self.client.publish(spec.topic, payload.encode(self.index, seq, t, spec.size),
                                       qos=spec.qos)
            # NO_CONN at QoS > 0: paho keeps the message and sends it after reconnecting
            if info.rc != mqtt.MQTT_ERR_SUCCESS and not (
                    info.rc == mqtt.MQTT_ERR_NO_CONN and spec.qos > 0):
                res.error = f"publish failed: {mqtt.error_string(info.rc)}"
                break
            if trace is not None:
                trace.write(pub_line(spec.run, self.index, seq, spec.topic, spec.qos, spec.node,
                                     t, spec.size))
            if seq == 0:
                res.first_ns = t
            res.last_ns = t
            seq += 1
        res.sent = seq
        if trace is not None:
            trace.close()
        drain_deadline = time.monotonic() + ACK_TIMEOUT
        while res.acked < res.sent and time.monotonic() < drain_deadline:
            time.sleep(0.01)
        if res.acked < res.sent and res.error is None:
            res.error = f"{res.sent - res.acked} publishes never acked"
        res.cpu_seconds = time.process_time() - cpu0
        return res

    def close(self) -> None:
        if self.spec.protocol != "5":
            self.client.disconnect()
            return
        props = Properties(PacketTypes.DISCONNECT)
        props.SessionExpiryInterval = 0  # done: the broker may forget the session
        self.client.disconnect(properties=props)
        self.client.loop_stop()


def publisher_process(spec: LoadSpec, index: int, conn: Connection, go: Any) -> None:
    """Child process body: connect, report ready, wait for `go`, publish, report the result."""
    pub = Publisher(spec, index)
    try:
        pub.connect()
        conn.send(("ready", None))
        if go.wait(120):
            conn.send(("done", asdict(pub.run())))
    except Exception as exc:  # reported to the parent, which fails the case
        conn.send(("error", f"publisher {index}: {exc}"))
    finally:
        pub.close()
        conn.close()


class PublisherPool:
    """Publisher processes started together; always stopped by PID (`stop`)."""

    def __init__(self, specs: list[LoadSpec]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._go = ctx.Event()
        self._conns: list[Connection] = []
        self.procs = []
        for index, spec in enumerate(specs):
            parent, child = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=publisher_process, args=(spec, index, child, self._go),
                               name=f"mqfed-bench-pub-{index}", daemon=True)
            self._conns.append(parent)
            self.procs.append((proc, child))

    @property
    def pids(self) -> list[int]:
        return [p.pid for p, _ in self.procs if p.pid]

    def start(self, timeout: float = 30.0) -> None:
        """Start every publisher and wait until each is connected."""
        for proc, child in self.procs:
            proc.start()
            child.close()
        for index in range(len(self.procs)):
            kind, detail = self._receive(index, timeout)
            if kind != "ready":
                raise RuntimeError(detail or f"publisher {index} failed to start")

    def go(self) -> None:
        self._go.set()

    def results(self, timeout: float) -> list[PublishResult]:
        """Each publisher's result (raises if one failed or took longer than `timeout`)."""
        out = []
        for index in range(len(self.procs)):
            kind, detail = self._receive(index, timeout)
            if kind != "done":
                raise RuntimeError(detail or f"publisher {index} ended without a result")
            out.append(PublishResult(**detail))
        return out

    def _receive(self, index: int, timeout: float) -> tuple[str, Any]:
        conn, (proc, _) = self._conns[index], self.procs[index]
        deadline = time.monotonic() + timeout
        while not conn.poll(0.1):
            if not proc.is_alive() and not conn.poll(0):
                return "error", f"publisher {index} exited (code {proc.exitcode})"
            if time.monotonic() > deadline:
                return "error", f"publisher {index} gave no answer within {timeout:.0f}s"
        try:
            return conn.recv()
        except EOFError:
            return "error", f"publisher {index} closed its pipe"

    def stop(self) -> None:
        """End every publisher process: SIGTERM, then SIGKILL after 5 s; reap them."""
        for proc, _ in self.procs:
            if proc.pid is not None and proc.is_alive():
                proc.terminate()
        for proc, _ in self.procs:
            if proc.pid is None:
                continue
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        for conn in self._conns:
            conn.close()
